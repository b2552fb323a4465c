"""The host's status history (labctl/agent/monitor/status.py) when the host's wall clock is set back or
forward: recording goes on, durations stay true and the answer says what happened. Real files;
the clocks are faked at the function level (a Clock reading, or records stamped as if the
clock had read otherwise when they were written), since this machine's clock is shared."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.core import paths
from labctl.agent.monitor import status as agent_status

NOW = 1_800_000_000.0
BOOT = "6d2f0a4e-1111-4c1e-9a55-0d2b3c4e5f60"


def rec(t: float) -> dict[str, Any]:
    return {"t": t, "memory_used_bytes": 1, "gpus": []}


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_future_stamped_history_does_not_stop_recording_fake_clock(tmp_path: Path) -> None:
    """Samples an older agent (or another boot) stamped 2 h ahead of the clock as it reads now:
    they cannot be dated, so they are dropped and said to be, and this sample is recorded."""
    path = tmp_path / "history.jsonl"
    ahead = [rec(NOW + 2 * 3600 - 10 * i) for i in range(30, 0, -1)]
    path.write_text("".join(json.dumps(r) + "\n" for r in ahead))
    out = agent_status.update_history(str(path), rec(NOW), NOW)
    samples = [r for r in out if "note" not in r]
    notes = [r["note"] for r in out if "note" in r]
    assert [r["t"] for r in samples] == [NOW]  # recorded at once, not in 2 h
    assert len(notes) == 1 and notes[0].startswith(
        "clock went back: 30 sample(s) stamped up to 2 h after now"
    )
    # The file holds the note and the sample; the next call 10 s on appends as usual.
    assert [r.get("note", "sample")[:10] for r in lines(path)] == ["clock went", "sample"]
    again = agent_status.update_history(str(path), rec(NOW + 10), NOW + 10)
    assert [r["t"] for r in again if "note" not in r] == [NOW, NOW + 10]


def test_clock_set_back_2h_redates_this_boots_samples_fake_clock(tmp_path: Path) -> None:
    path = str(tmp_path / "status" / "history.jsonl")
    # 10 minutes of samples, one every 10 s by both clocks.
    for i in range(60):
        clock = agent_status.Clock(NOW + 10 * i, 5000.0 + 10 * i, BOOT)
        agent_status.update_history(path, rec(clock.wall), clock.wall, clock)
    # 10 s after the last one the clock is set back 2 h: the boot clock ran on 10 s.
    back = agent_status.Clock(NOW + 600 - 2 * 3600, 5600.0, BOOT)
    out = agent_status.update_history(path, rec(back.wall), back.wall, back)
    samples = [r for r in out if "note" not in r]
    (note,) = [r["note"] for r in out if "note" in r]
    assert note.startswith("clock went back 2 h between ")
    assert "the 60 sample(s) from before were re-dated" in note
    # Recorded now, and the ones before are where they were in time, on today's clock.
    assert len(samples) == 61 and samples[-1]["t"] == back.wall
    assert [round(back.wall - r["t"]) for r in samples[:3]] == [600, 590, 580]
    assert all(b["t"] - a["t"] == pytest.approx(10) for a, b in itertools.pairwise(samples))
    assert "m" not in samples[0] and "boot" not in samples[0]  # the answer's shape is the contract's
    # One record per 10 s holds by the boot clock: 5 s on, none; 10 s on, one. The note is kept
    # (answered for the next 65 minutes), not repeated.
    for dt, count in ((5, 61), (10, 62)):
        clock = agent_status.Clock(back.wall + dt, back.mono + dt, BOOT)
        out = agent_status.update_history(path, rec(clock.wall), clock.wall, clock)
        assert len([r for r in out if "note" not in r]) == count
        assert [r["note"] for r in out if "note" in r] == [note]
    # Durations hold: 65 minutes after the last sample by the boot clock, only it is answered.
    later = agent_status.Clock(back.wall + 10 + 65 * 60, back.mono + 10 + 65 * 60, BOOT)
    out = agent_status.update_history(path, None, later.wall, later)
    assert [r["t"] for r in out] == [back.wall + 10]


def test_clock_set_forward_keeps_this_boots_samples_fake_clock(tmp_path: Path) -> None:
    """A clock set 3 h forward must not age this boot's samples past the 2 h kept."""
    path = str(tmp_path / "history.jsonl")
    for i in range(3):
        clock = agent_status.Clock(NOW + 10 * i, 100.0 + 10 * i, BOOT)
        agent_status.update_history(path, rec(clock.wall), clock.wall, clock)
    ahead = agent_status.Clock(NOW + 30 + 3 * 3600, 130.0, BOOT)
    out = agent_status.update_history(path, rec(ahead.wall), ahead.wall, ahead)
    assert [round(ahead.wall - r["t"]) for r in out if "note" not in r] == [30, 20, 10, 0]
    assert [r["note"][:24] for r in out if "note" in r] == ["clock went forward 3 h b"]


def test_a_record_of_another_boot_is_dated_by_its_wall_stamp(tmp_path: Path) -> None:
    path = str(tmp_path / "history.jsonl")
    old = agent_status.Clock(NOW, 99999.0, "another-boot")
    agent_status.update_history(path, rec(NOW), NOW, old)
    # A reboot: the boot clock starts again near 0; the wall clock ran on 60 s.
    clock = agent_status.Clock(NOW + 60, 30.0, BOOT)
    out = agent_status.update_history(path, rec(clock.wall), clock.wall, clock)
    assert [r["t"] for r in out] == [NOW, NOW + 60]


def test_status_after_a_clock_set_back_records_and_notes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """status_command on this machine's real clocks, over a history written in this boot while
    the wall clock read 2 h ahead: as if the clock was set back 2 h after the last sample."""
    path = tmp_path / "status" / "history.jsonl"
    monkeypatch.setattr(paths, "status_history", lambda: str(path))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")  # no nvidia-smi: no GPUs
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    mono, wall = time.clock_gettime(time.CLOCK_BOOTTIME), time.time()
    old = [
        {**rec(wall + 2 * 3600 - 15 - 10 * i), "m": mono - 15 - 10 * i, "boot": boot}
        for i in range(20, 0, -1)
    ]
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    out = agent_status.status_command({"record": True})
    assert out["history"][-1]["t"] == out["time"]  # recorded, not held off for 2 h
    assert len(out["history"]) == 21 and all(r["t"] < out["time"] for r in out["history"][:-1])
    assert len(out["history_notes"]) == 1 and out["history_notes"][0].startswith("clock went back 2 h")


class _SetBack:
    """The time module as agent_status sees it, with the wall clock 2 h behind this machine's."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def time(self) -> float:
        return time.time() - 2 * 3600


def test_a_runs_start_is_not_in_the_future_after_the_clock_went_back_fake_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run's start is its age by the boot clock taken from now, not a wall-clock stamp (its
    /proc folder's time), which a clock set back leaves in the future: "GPU idle while
    training" counts from the start, and would wait for the clock to catch up."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)
        monkeypatch.setattr(agent_status, "time", _SetBack())
        started = agent_status._started(proc.pid)
        now = agent_status.time.time()
        assert started is not None and now - 30 < started <= now
    finally:
        proc.kill()
        proc.wait()
