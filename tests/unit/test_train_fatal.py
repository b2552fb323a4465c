"""A trainer's fatal error ends the run at once, and the user reads its reason, never torchrun's
traceback: the pieces (agent/train/fatal.py, train/failure.py, the Stream, the host's answers)
and one real torchrun that must not restart a trainer whose settings are wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.train import fatal
from labctl.agent.train import host as train_host
from labctl.output.progress import Shown
from labctl.train.failure import TorchrunText, failure_line, fatal_event
from labctl.train.launch import Stream
from labctl.train.spec import LOG_PREFIX_TEMPLATE

REPO = Path(__file__).resolve().parents[2]
TORCHRUN_NOISE = ("ChildFailedError", "To enable traceback", "error_file", "Traceback", "SignalException")

# What torchrun 2.x prints when a worker exits non-zero and its restarts are spent (stdout and
# stderr of `torchrun --tee=3` with labctl's rank prefix), cut to its shape.
CHILD_FAILED = """\
[rank0]:labctl trainer: error: phase 3: the sandbox service failed 1 times: 401 unauthorized
E1128 12:28:53.060000 19836 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 2) local_rank: 0 (pid: 20305) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
labctl.agent.train.trainer FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-28_12:28:52
  host      : m5
  rank      : 0 (local_rank: 0)
  exitcode  : 2 (pid: 20305)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
""".splitlines()

# What torchrun prints when the trainer ends it (SIGTERM) after a fatal error.
SIGNALLED = """\
W1128 12:28:57.547000 20383 torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal, shutting down workers
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 20383 got signal: 15
""".splitlines()


def test_a_failed_hosts_line_names_the_rank_and_its_error_never_torchruns_report() -> None:
    line = failure_line(1, CHILD_FAILED)
    assert line.startswith("torchrun exited 1: rank 0 exited 2")
    assert "401 unauthorized" in line
    assert not any(n in line for n in TORCHRUN_NOISE), line


def test_a_fatal_event_is_the_whole_line() -> None:
    lines = [
        '[rank1]:{"event": "fatal", "reason": "settings: steps must be an integer >= 1, got 0"}',
        *SIGNALLED,
    ]
    line = failure_line(1, lines)
    assert line == "the trainer stopped the run (no restart): settings: steps must be an integer >= 1, got 0"


def test_torchruns_traceback_and_report_are_dropped_and_what_follows_is_kept() -> None:
    text = TorchrunText()
    kept = [ln for ln in [*CHILD_FAILED[1:], *SIGNALLED, "W1128 later: rendezvous closed"] if text.keep(ln)]
    assert kept == [CHILD_FAILED[1], SIGNALLED[0], "W1128 later: rendezvous closed"]


def test_only_a_fatal_event_carries_a_reason() -> None:
    assert fatal_event('{"event": "fatal", "reason": "no"}') == "no"
    assert fatal_event('{"event": "step", "reason": "no"}') is None
    assert fatal_event("{not json") is None and fatal_event("labctl trainer: error: x") is None


def test_the_stream_shows_the_reason_from_any_rank_and_no_torchrun_traceback(tmp_path: Path) -> None:
    shown: list[tuple[str, str]] = []
    stream = Stream(
        tmp_path, None, Shown(None, {"line": lambda _c, label, text, stream: shown.append((label, text))})
    )
    stream.open(["m5"])
    try:
        stream.line(
            "m5", "stdout", '[rank1]:{"event": "fatal", "reason": "the sandbox refused the token (401)"}'
        )
        for ln in [*CHILD_FAILED, *SIGNALLED]:
            stream.line("m5", "stderr", ln)
    finally:
        stream.close()
    assert stream.fatal == {"m5": "the sandbox refused the token (401)"}
    assert shown[0] == (
        "m5/1",
        "the trainer stopped the run (no restart): the sandbox refused the token (401)",
    )
    assert not any(n in text for _, text in shown for n in TORCHRUN_NOISE), shown
    assert stream.events == []  # not a step, nor rank 0's
    # Every line is still in the host's log file.
    assert "ChildFailedError" in (tmp_path / "m5.log").read_text()


def test_end_run_under_labctl_writes_the_reason_once_and_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LABCTL_RUN_ID", "p3-x")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert fatal.end_run("first reason", "labctl trainer") == fatal.EXIT_FATAL == 2
    assert fatal.end_run("second reason", "labctl trainer (rank 1)") == 2
    assert fatal.read(str(tmp_path))["reason"] == "first reason"  # type: ignore[index]
    out, err = capsys.readouterr()
    assert json.loads(out.splitlines()[0]) == {"event": "fatal", "reason": "first reason"}
    assert err.splitlines()[0] == "labctl trainer: error: first reason"


def test_the_host_says_why_a_run_ended(tmp_path: Path) -> None:
    (tmp_path / "rc").write_text("1\n")  # torchrun, ended by the trainer, exits 1
    args = {"run_id": "p3-nothing-runs-this", "host": "h", "log_dir": str(tmp_path)}
    assert "fatal" not in train_host.status_command(dict(args))
    fatal.record("the sandbox refused the token (401)", str(tmp_path))
    status = train_host.status_command(dict(args))
    assert status["state"] == "failed" and status["fatal"] == "the sandbox refused the token (401)"
    assert train_host.ps_command(dict(args))["fatal"] == "the sandbox refused the token (401)"


def test_torchrun_does_not_restart_a_trainer_with_a_fatal_error(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "LABCTL_RUN_ID": "p1-fatal",
        "OMP_NUM_THREADS": "1",
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": LOG_PREFIX_TEMPLATE,
    }
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--max-restarts=3", "--tee=3",
        "-m", "labctl.agent.train.trainer", "--settings", '{"steps": 0}',
    ]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    # Each worker failed once at most (one may be ended before it says so): none was started again.
    assert out.count("labctl trainer (rank") in (1, 2), out
    assert "settings: steps must be an integer >= 1, got 0" in fatal.read(str(tmp_path))["reason"]  # type: ignore[operator]
    assert time.monotonic() - started < 60
    lines: list[Any] = out.splitlines()
    assert failure_line(proc.returncode, lines).startswith(
        "the trainer stopped the run (no restart): settings:"
    )


def test_train_status_records_and_shows_why_a_detached_run_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from labctl.hosts.fanout import HostResult
    from labctl.train import launch, run, runs

    inventory = tmp_path / "lab.yaml"
    root = runs.runs_dir(inventory)
    runs.save(root, {"run_id": "p3-x", "hosts": ["m5"], "log_dir": "/x", "state": "running", "started": 1.0})
    said = {"state": "failed", "rc": 1, "fatal": "the sandbox refused the token (401)"}
    monkeypatch.setattr(launch, "record_hosts", lambda ctx, rec: [])
    monkeypatch.setattr(launch, "host_status", lambda ctx, rec, hosts: [HostResult("m5", "ok", data=said)])
    ctx: Any = SimpleNamespace(inventory_file=lambda: inventory)
    row = run.status(ctx, "p3-x").rows[0]
    assert row["state"] == "failed" and row["reason"] == "the sandbox refused the token (401)"
    assert runs.load(root, "p3-x")["reason"] == "the sandbox refused the token (401)"
