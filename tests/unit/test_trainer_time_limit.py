"""`time_limit` in the reference trainer: the stop decision (agent/train/limit.py) as arithmetic, and
real CPU runs of a tiny tinylm that pause at a step, checkpoint there and resume from it.

The pause decision reads a clock, so the runs here never assert when it happens: they assert
what a paused run leaves behind (exit 75, the event, the checkpoint at that step) and that the
rerun continues exactly where it stopped. The in-process runs start their clock at or past
the limit (`started_at`), which pauses them after their first step without waiting.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.train import limit as tl
from labctl.agent.train.settings import EXIT_PAUSED, TrainerError, resolve_settings

REPO = Path(__file__).resolve().parents[2]
TINY = {"vocab": 256, "d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 128}


# -- the decision ----------------------------------------------------------------------------


def test_stops_when_one_more_step_and_a_checkpoint_would_not_fit() -> None:
    limit = 1000.0
    margin = tl.exit_margin(limit)
    ckpt = 4.0
    room = limit - margin - ckpt * tl.CHECKPOINT_SAFETY  # when the next step must have ended
    assert not tl.should_stop(room - 2.0 - 0.001, 2.0, ckpt, limit)
    assert tl.should_stop(room - 2.0, 2.0, ckpt, limit)
    assert tl.should_stop(limit + 5, 2.0, ckpt, limit)  # already past it: stop now
    # A slower checkpoint or step moves the stop earlier.
    assert tl.should_stop(room - 2.0 - 0.001, 2.0, ckpt + 1, limit)
    assert tl.should_stop(room - 2.0 - 0.001, 2.5, ckpt, limit)


def test_exit_margin_is_small_and_capped() -> None:
    assert tl.exit_margin(30) == pytest.approx(0.3)
    assert tl.exit_margin(13800) == tl.EXIT_MARGIN_MAX_S


def test_checkpoint_estimate_is_the_slowest_written_else_from_the_state_size() -> None:
    assert tl.checkpoint_estimate([0.5, 3.0, 1.0], 10**12) == 3.0
    first = tl.checkpoint_estimate([], 500_000_000)
    assert first == pytest.approx(tl.FIRST_CHECKPOINT_FIXED_S + 10.0)
    assert tl.checkpoint_estimate([], 2 * 500_000_000) > first


def test_step_estimate_is_the_slowest_recent_step() -> None:
    times = tl.StepTimes(keep=3)
    assert times.estimate() == 0.0
    for s in (5.0, 1.0, 1.0, 1.0):
        times.add(s)
    assert times.estimate() == 1.0  # the slow first step has left the window
    times.add(2.0)
    assert times.estimate() == 2.0


def test_short_steps_are_checked_about_once_a_check_period() -> None:
    assert tl.check_interval(0.0) == 1  # before any step was timed
    assert tl.check_interval(5.0) == 1 and tl.check_interval(tl.CHECK_EVERY_S) == 1
    assert tl.check_interval(tl.CHECK_EVERY_S / 40) == 40
    assert tl.check_interval(1e-9) == 1000
    # Checked every k steps, the stop comes when k more steps and a checkpoint would not fit.
    assert not tl.should_stop(90.0, 40 * 0.1, 2.0, 100.0)
    assert tl.should_stop(90.0, 80 * 0.1, 2.0, 100.0)


def test_clock_counts_from_this_process_alone_and_from_torchrun_under_it() -> None:
    age = tl.process_age(os.getpid())
    assert age is not None and age >= 0
    assert tl.process_age(os.getppid()) is not None
    alone = tl.clock_origin({})
    under = tl.clock_origin({"TORCHELASTIC_RUN_ID": "x"})
    now = time.monotonic()
    assert alone <= now and under <= now
    # The parent (pytest's launcher, as torchrun would be) started no later than this process.
    assert under <= alone + 0.5


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"time_limit": 0}, "time_limit must be"),
        ({"time_limit": -3}, "time_limit must be"),
        ({"time_limit": "3h"}, "time_limit must be"),
        ({"time_limit": True}, "time_limit must be"),
        ({"time_limit": float("inf")}, "time_limit must be"),
        ({"time_limit": 60, "checkpoint_dir": None}, "needs a checkpoint_dir"),
    ],
)
def test_bad_time_limits_are_refused(over: dict[str, Any], says: str) -> None:
    with pytest.raises(TrainerError, match=says):
        resolve_settings(over)


def test_time_limit_defaults_to_none_and_takes_seconds() -> None:
    assert resolve_settings({})["time_limit"] is None
    assert resolve_settings({"time_limit": 30})["time_limit"] == 30.0


# -- real runs -------------------------------------------------------------------------------

torch_needed = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0,
    reason="torch is not installed",
)


def settings(tmp_path: Path, **over: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "run_id": "tl",
        "phase": 1,
        "steps": 100_000,
        "batch_size": 8,
        "seq_len": 32,
        "model": dict(TINY),
        "lr": 3e-3,
        "warmup_steps": 3,
        "checkpoint_dir": str(tmp_path / "ck"),
        "checkpoint_every": 0,
        "keep_checkpoints": 2,
        "log_every": 1,
        "seed": 0,
    }
    s.update(over)
    return s


def run_inproc(
    s: dict[str, Any], started_at: float | None = None, last: int | None = None
) -> list[dict[str, Any]]:
    from labctl.agent.train.trainer import Trainer

    out = io.StringIO()
    t = Trainer(s, out=out, environ={}, started_at=started_at)
    try:
        t.setup()
        if last is None:
            t.run()
        else:
            t.emit(t.start_event())
            t.train_steps(t.step + 1, last)
    finally:
        t.close()
    return [json.loads(line) for line in out.getvalue().splitlines()]


def of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == kind]


@torch_needed
def test_alone_the_trainer_pauses_with_exit_75_and_the_rerun_continues_the_loss(tmp_path: Path) -> None:
    s = settings(tmp_path, time_limit=6)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"):
        env.pop(key, None)
    proc = subprocess.run(
        [sys.executable, "-m", "labctl.agent.train.trainer", "--settings", json.dumps(s)],
        capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert proc.returncode == EXIT_PAUSED, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert of(events, "done") == []
    paused = events[-1]
    n = paused["step"]
    assert paused["event"] == "paused" and paused["reason"] == "time_limit"
    assert paused["resume_step"] == n and 1 <= n < s["steps"] and paused["time_limit"] == 6
    assert paused["checkpoint"] == str(tmp_path / "ck" / f"step-{n:08d}.pt")
    assert [e["step"] for e in of(events, "checkpoint")][-1] == n
    assert of(events, "step")[-1]["step"] == n and paused["loss"] == of(events, "step")[-1]["loss"]
    from labctl.agent.train.ckpt import CheckpointDir

    valid, skipped = CheckpointDir(str(tmp_path / "ck")).scan()
    assert valid[-1] == n and skipped == []

    # The same settings again resume at n; the losses are those of a run never stopped.
    resumed = run_inproc(settings(tmp_path), last=n + 2)
    assert resumed[0]["resumed_from"] == n
    got = {e["step"]: e["loss"] for e in of(resumed, "step")}
    assert sorted(got) == [n + 1, n + 2]
    straight = run_inproc(settings(tmp_path / "straight"), last=n + 2)
    want = {e["step"]: e["loss"] for e in of(straight, "step")}
    for step, loss in got.items():
        assert loss == pytest.approx(want[step], rel=1e-5, abs=1e-5), step
    assert got[n + 1] < of(events, "step")[0]["loss"]  # not back at the first step's loss


@torch_needed
def test_a_run_whose_time_is_spent_pauses_after_one_step_with_a_checkpoint_there(tmp_path: Path) -> None:
    s = settings(tmp_path, steps=20, checkpoint_every=4, log_every=5, time_limit=50)
    first = run_inproc(dict(s, time_limit=None), last=6)  # checkpoints at 4 only
    assert [e["step"] for e in of(first, "checkpoint")] == [4]
    events = run_inproc(s, started_at=time.monotonic() - 50)
    assert events[0]["resumed_from"] == 4 and events[0]["time_limit"] == 50
    assert [e["step"] for e in of(events, "step")] == [5]
    assert [e["step"] for e in of(events, "checkpoint")] == [5]
    paused = events[-1]
    assert paused["event"] == "paused" and paused["step"] == 5 and paused["seconds"] >= 50
    assert sorted(os.listdir(tmp_path / "ck")) == [
        f"step-0000000{k}.{x}" for k in (4, 5) for x in ("json", "pt")
    ]


@torch_needed
def test_a_stop_on_a_checkpoint_step_writes_it_once_and_the_last_step_is_done_not_paused(
    tmp_path: Path,
) -> None:
    s = settings(tmp_path, steps=6, checkpoint_every=1, log_every=1, time_limit=50)
    events = run_inproc(s, started_at=time.monotonic() - 50)
    assert [e["step"] for e in of(events, "checkpoint")] == [1] and events[-1]["event"] == "paused"
    # Resumed at 5 of 6 with no time left: step 6 is the last, so the run is done, not paused.
    run_inproc(dict(s, time_limit=None), last=5)
    end = run_inproc(s, started_at=time.monotonic() - 50)
    assert end[-1]["event"] == "done" and end[-1]["step"] == 6


@torch_needed
def test_without_a_time_limit_nothing_changes(tmp_path: Path) -> None:
    events = run_inproc(settings(tmp_path, steps=4, checkpoint_every=2), started_at=0.0)
    assert events[-1]["event"] == "done" and events[0]["time_limit"] is None
    assert [e["step"] for e in of(events, "checkpoint")] == [2, 4]
