"""The host side of `labctl train` (labctl/agent/train/host.py), with real processes on this machine."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from labctl.agent.core import paths
from labctl.agent.train import host as train_host

FAKE_TORCH = {
    "__init__.py": "from . import version, cuda, backends\n__version__ = version.__version__\n",
    "cuda.py": "def is_available():\n    return False\ndef device_count():\n    return 0\ndef get_arch_list():\n    return []\n",
    "backends/__init__.py": "from . import cudnn\n",
    "backends/cudnn.py": "def version():\n    return None\n",
}


def fake_torch(root: Path, version: str) -> None:
    for name, text in {
        **FAKE_TORCH,
        "version.py": f"__version__ = {version!r}\ncuda = None\nhip = None\n",
    }.items():
        path = root / "torch" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_torch_probe_is_cached_per_install_and_refreshed_when_torch_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(paths, "torch_probe_dir", lambda: str(tmp_path / "cache"))
    site = tmp_path / "site"
    fake_torch(site, "1.0.0")
    monkeypatch.setenv("PYTHONPATH", str(site))
    first = train_host._torch_probe(sys.executable)
    assert first["installed"] and first["version"] == "1.0.0" and "cached" not in first
    again = train_host._torch_probe(sys.executable)
    assert again["cached"] and again["version"] == "1.0.0"
    fake_torch(site, "1.0.10")  # reinstalled: version.py differs in size and time
    assert train_host._torch_probe(sys.executable)["version"] == "1.0.10"


def test_torch_probe_reports_a_missing_torch_or_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(paths, "torch_probe_dir", lambda: str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    plain = train_host._torch_probe("/usr/bin/python3")
    assert plain["installed"] is False and "not installed" in plain["error"]
    missing = train_host._torch_probe(str(tmp_path / "no-python"))
    assert missing["installed"] is False and "no interpreter" in missing["error"]


def _stubborn(run_id: str, host: str) -> subprocess.Popen[bytes]:
    """A process of the run that ignores SIGTERM, in its own group, with a child."""
    env = {**os.environ, "LABCTL_RUN_ID": run_id, "LABCTL_HOST": host}
    return subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 60 & wait"], env=env, start_new_session=True)


def test_stop_terms_then_kills_only_this_hosts_processes_of_the_run() -> None:
    run_id = f"p1-test-{uuid.uuid4().hex[:6]}"
    mine, other_host, other_run = (
        _stubborn(run_id, "m5"),
        _stubborn(run_id, "irina"),
        _stubborn(run_id + "x", "m5"),
    )
    try:
        time.sleep(0.3)
        found = train_host.ps_command({"run_id": run_id, "host": "m5"})["processes"]
        assert {p["pid"] for p in found} >= {mine.pid} and other_host.pid not in {p["pid"] for p in found}
        out = train_host.ps_command({"run_id": run_id, "host": "m5", "stop": True, "grace": 0.5})
        assert out["killed"] is True and out["remaining"] == []  # SIGTERM was ignored: SIGKILL did it
        assert mine.wait(5) is not None
        assert other_host.poll() is None and other_run.poll() is None
    finally:
        for p in (mine, other_host, other_run):
            p.kill()
            p.wait()


def test_detached_spawn_survives_its_caller_and_status_reads_the_exit_code(tmp_path: Path) -> None:
    run_id = f"p1-test-{uuid.uuid4().hex[:6]}"
    log_dir = tmp_path / "run"
    event = json.dumps({"event": "step", "step": 3, "steps": 9, "loss": 1.5})
    line = "sh -c " + shlex.quote(f"echo {shlex.quote('[rank0]:' + event)}; sleep 1; exit 3")
    env = {"LABCTL_RUN_ID": run_id, "LABCTL_HOST": "h"}
    rec = train_host.spawn_command({"line": line, "log_dir": str(log_dir), "env": env})
    assert os.getpgid(rec["pid"]) == rec["pid"] != os.getpgid(0)  # its own session
    running = train_host.status_command({"run_id": run_id, "host": "h", "log_dir": str(log_dir)})
    assert running["state"] == "running"
    deadline = time.monotonic() + 10
    while (log_dir / "rc").exists() is False and time.monotonic() < deadline:
        time.sleep(0.1)
    done = train_host.status_command({"run_id": run_id, "host": "h", "log_dir": str(log_dir)})
    assert done["state"] == "failed" and done["rc"] == 3
    assert done["last_event"]["step"] == 3
