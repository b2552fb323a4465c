"""labctl/agent/core/procs.py: waiting on a long child process with a heartbeat."""

from __future__ import annotations


def test_wait_beating_beats_while_a_process_runs_and_kills_it_past_its_time() -> None:
    import subprocess
    import sys

    from labctl.agent.core import procs

    beats: list[int] = []
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    assert procs.wait_beating(quick, 30, 0.05, lambda: beats.append(1)) and quick.returncode == 0
    assert beats  # it beat while the process ran
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert not procs.wait_beating(slow, 0.3, 0.05, lambda: None)
    assert slow.returncode is not None and slow.returncode < 0  # killed and reaped, not left behind
