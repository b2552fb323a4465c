"""The host's provision lock (agent `provision.host_lock`): one changing run at a time, the next one told
who holds it. Real agent processes on this machine, a lock file in a temporary folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def start(lock: Path, wait: float, who: str) -> subprocess.Popen[str]:
    args = {
        "path": str(lock),
        "wait": wait,
        "holder": {"pid": who, "controller": "laptop", "command": "labctl provision"},
    }
    return subprocess.Popen(
        [sys.executable, "-m", "labctl.agent", "provision.host_lock", json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def events(proc: subprocess.Popen[str], until: str) -> list[dict[str, object]]:
    assert proc.stderr is not None
    out = []
    for line in proc.stderr:
        out.append(json.loads(line))
        if out[-1]["event"] == until:
            break
    return out


def test_a_second_run_waits_then_refuses_naming_the_holder_and_gets_it_once_free(tmp_path: Path) -> None:
    lock = tmp_path / "provision.lock"
    first = start(lock, 5, "111")
    try:
        assert events(first, "locked")[-1]["event"] == "locked"
        second = start(lock, 0.5, "222")
        out, err = second.communicate(timeout=30)
        seen = [json.loads(x) for x in err.splitlines()]
        assert [e["event"] for e in seen] == ["waiting", "busy"]
        assert seen[-1]["holder"]["pid"] == "111" and seen[-1]["holder"]["controller"] == "laptop"
        assert second.returncode == 1 and json.loads(out)["kind"] == "busy"
    finally:
        first.kill()  # what the watchdog does when the first run's channel closes
        first.wait()
    third = start(lock, 5, "333")
    try:
        assert events(third, "locked")[-1]["event"] == "locked"
        assert json.loads(lock.read_text())["pid"] == "333"
    finally:
        third.kill()
        third.wait()
