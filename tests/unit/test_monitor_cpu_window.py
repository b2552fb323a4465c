"""busy % without the sleep (labctl/agent/monitor/status.py, cpu_window): a status call measures from
the /proc/stat reading the previous call kept beside the history when that reading is of this boot,
at most CPU_READING_MAX_S old and not in the future, and sleeps CPU_WINDOW_S as before otherwise;
keeping the reading never fails the answer."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.commands import answer_problem
from labctl.agent.core import paths
from labctl.agent.monitor import status as agent_status

BOOT = "5f0e6d1c-0000-4000-8000-000000000001"
MONO = 1000.0
NOW = (5_000, 20_000)  # (busy, total) jiffies read "now"


class _Sleeps:
    """The time module as agent_status sees it, with sleep recorded (and really slept, `real`)."""

    def __init__(self, real: bool = False) -> None:
        self.calls: list[float] = []
        self.real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        self.calls.append(seconds)
        if self.real:
            time.sleep(seconds)


@pytest.fixture
def status_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The history (and so the kept CPU reading) in tmp_path, not this machine's /var/lib/labctl."""
    folder = tmp_path / "status"
    monkeypatch.setattr(paths, "status_history", lambda: str(folder / "history.jsonl"))
    return folder


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> _Sleeps:
    fake = _Sleeps()
    monkeypatch.setattr(agent_status, "time", fake)
    return fake


@pytest.fixture
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """/proc/stat reads NOW, the boot clock MONO (and stays there)."""
    monkeypatch.setattr(agent_status, "cpu_times", lambda: NOW)
    monkeypatch.setattr(agent_status, "boot_clock", lambda: MONO)


def keep(folder: Path, record: Any) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / agent_status.CPU_READING
    path.write_text(record if isinstance(record, str) else json.dumps(record))
    return path


def reading(m: float, busy: Any = 4_000, total: Any = 16_000, boot: Any = BOOT) -> dict[str, Any]:
    return {"boot": boot, "m": m, "busy": busy, "total": total}


@pytest.mark.usefixtures("fixed_clock")
def test_a_recent_reading_of_this_boot_is_used_without_sleeping(status_dir: Path, sleeps: _Sleeps) -> None:
    path = keep(status_dir, reading(MONO - 5.0))
    before, after = agent_status.cpu_window(BOOT)
    assert sleeps.calls == []
    assert (before, after) == ((4_000, 16_000), NOW)
    assert agent_status.busy_pct(before, after) == 25.0  # 1000 busy of 4000 jiffies since the kept one
    # The reading taken now replaces it, for the next call.
    assert json.loads(path.read_text()) == {"boot": BOOT, "m": MONO, "busy": NOW[0], "total": NOW[1]}


@pytest.mark.usefixtures("fixed_clock")
def test_a_reading_younger_than_the_window_sleeps_only_the_rest(status_dir: Path, sleeps: _Sleeps) -> None:
    keep(status_dir, reading(MONO - 0.05))
    before, after = agent_status.cpu_window(BOOT)
    assert sleeps.calls == [pytest.approx(agent_status.CPU_WINDOW_S - 0.05)]
    assert before == (4_000, 16_000) and after == NOW


@pytest.mark.usefixtures("fixed_clock")
@pytest.mark.parametrize(
    "record",
    [
        pytest.param(reading(MONO - agent_status.CPU_READING_MAX_S - 1), id="too-old"),
        pytest.param(reading(MONO - 5.0, boot="another-boot"), id="other-boot"),
        pytest.param(reading(MONO - 5.0, boot=""), id="no-boot"),
        pytest.param(reading(MONO + 5.0), id="in-the-future"),
        pytest.param(reading(MONO - 5.0, busy=6_000), id="busy-went-back"),
        pytest.param(reading(MONO - 5.0, total=21_000), id="total-went-back"),
        pytest.param(reading(MONO - 5.0, busy=1_000, total=19_000), id="busy-grew-more-than-total"),
        pytest.param(reading(MONO - 5.0, busy=17_000), id="busy-over-total"),
        pytest.param(reading(MONO - 5.0, busy="4000"), id="busy-a-string"),
        pytest.param(reading(MONO - 5.0, busy=True), id="busy-a-bool"),
        pytest.param(reading(MONO - 5.0, total=-1), id="negative"),
        pytest.param(reading(float("nan")), id="m-nan"),
        pytest.param(reading("999"), id="m-a-string"),
        pytest.param([BOOT, MONO - 5.0, 4_000, 16_000], id="a-list"),
        pytest.param('{"boot": "' + BOOT + '", "m": 99', id="cut-short"),
        pytest.param("\x00\xff garbage", id="garbage"),
        pytest.param("[" * 100_000, id="deep"),
    ],
)
def test_an_unusable_reading_falls_back_to_sleeping(status_dir: Path, sleeps: _Sleeps, record: Any) -> None:
    keep(status_dir, record)
    before, after = agent_status.cpu_window(BOOT)
    assert sleeps.calls == [agent_status.CPU_WINDOW_S]
    assert before == NOW and after == NOW  # both read now (the clock here does not move)


@pytest.mark.usefixtures("fixed_clock")
def test_no_reading_kept_sleeps_and_keeps_one_atomically(status_dir: Path, sleeps: _Sleeps) -> None:
    assert agent_status.cpu_window(BOOT) == (NOW, NOW)
    assert sleeps.calls == [agent_status.CPU_WINDOW_S]
    path = status_dir / agent_status.CPU_READING
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(status_dir.stat().st_mode) == 0o700
    assert os.listdir(status_dir) == [agent_status.CPU_READING]  # no temp file left beside it
    # Without a boot id (no /proc/sys/kernel/random/boot_id) nothing is kept: it could not be checked.
    path.unlink()
    agent_status.cpu_window("")
    assert not path.exists() and sleeps.calls == [agent_status.CPU_WINDOW_S] * 2


@pytest.mark.usefixtures("fixed_clock")
def test_an_unreadable_reading_falls_back_to_sleeping(status_dir: Path, sleeps: _Sleeps) -> None:
    (status_dir / agent_status.CPU_READING).mkdir(parents=True)  # a folder where the file goes
    assert agent_status.cpu_window(BOOT) == (NOW, NOW)
    assert sleeps.calls == [agent_status.CPU_WINDOW_S]


def test_status_answers_where_the_reading_cannot_be_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sleeps: _Sleeps
) -> None:
    """A status folder that cannot be made (a file is in the way): no reading kept, every call
    sleeps, and every call answers, in the shape it declares."""
    (tmp_path / "status").write_text("not a folder")
    monkeypatch.setattr(paths, "status_history", lambda: str(tmp_path / "status" / "history.jsonl"))
    monkeypatch.setattr(agent_status, "gpu_sample", lambda: ("none", [], None))
    for _ in range(2):
        out = agent_status.status_command({"record": True})
        assert answer_problem("monitor.status", out) is None
        assert set(out["cpu"]) == {"count", "load", "busy_pct"}
        assert out["history_error"].startswith("cannot write")
    assert sleeps.calls == [agent_status.CPU_WINDOW_S] * 2


def test_status_on_this_machine_sleeps_once_then_measures_from_the_kept_reading(
    status_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real /proc/stat, boot id and boot clock: the first call sleeps the window, a call
    CPU_WINDOW_S later does not, and both answer in the declared shape with a busy %."""
    sleeps = _Sleeps(real=True)
    monkeypatch.setattr(agent_status, "time", sleeps)
    monkeypatch.setattr(agent_status, "gpu_sample", lambda: ("none", [], None))
    first = agent_status.status_command({"record": True})
    assert sleeps.calls == [agent_status.CPU_WINDOW_S]
    time.sleep(agent_status.CPU_WINDOW_S + 0.05)
    second = agent_status.status_command({"record": True})
    assert sleeps.calls == [agent_status.CPU_WINDOW_S]  # no second sleep
    for out in (first, second):
        assert answer_problem("monitor.status", out) is None
        assert set(out["cpu"]) == {"count", "load", "busy_pct"}
        assert 0 <= out["cpu"]["busy_pct"] <= 100
    kept = json.loads((status_dir / agent_status.CPU_READING).read_text())
    assert kept["boot"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.mark.usefixtures("fixed_clock")
def test_a_reading_that_cannot_be_renamed_into_place_leaves_nothing_behind(
    status_dir: Path, sleeps: _Sleeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = keep(status_dir, reading(MONO - 5.0))

    def full_disk(*_args: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    assert agent_status.cpu_window(BOOT) == ((4_000, 16_000), NOW)  # the kept one still served
    assert sleeps.calls == []
    assert os.listdir(status_dir) == [agent_status.CPU_READING]  # the temp file was removed
    assert json.loads(path.read_text())["m"] == MONO - 5.0  # and the old reading left whole
