"""Where the reference trainer's parts live: setup.py starts a worker, loop.py trains it and
writes its checkpoints, metrics.py reports, trainer.py is the entry point and the whole run.
Checked without torch: the layers are plain classes, the step events' figures plain arithmetic."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest


def test_each_part_of_the_trainer_is_defined_in_its_module() -> None:
    from labctl.agent.train import loop, setup, trainer

    assert trainer.__all__ == ["Trainer", "main"]
    assert trainer.Trainer.__mro__[1:3] == (loop.StepLoop, setup.TrainerSetup)
    where = {
        "setup": setup,
        "_resume": setup,
        "_fit_micro_batch": setup,
        "gather": setup,
        "train_steps": loop,
        "_train_step": loop,
        "_stop_here": loop,
        "save": loop,
        "run": trainer,
        "start_event": trainer,
        "close": trainer,
    }
    for name, module in where.items():
        assert getattr(trainer.Trainer, name).__module__ == module.__name__, name


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Norm:
    def __init__(self, value: float) -> None:
        self.value = value

    def item(self) -> float:
        return self.value


def test_step_events_count_tokens_since_the_last_one_without_checkpoint_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from labctl.agent.train import metrics

    clock = Clock(100.0)
    monkeypatch.setattr(metrics.time, "perf_counter", clock)
    monkeypatch.setattr(metrics.time, "time", lambda: 1_790_000_000.0 + clock.now)
    out = io.StringIO()
    m = metrics.Metrics(out, active=True, steps=20, restart=1)
    m.start_clock(0)
    clock.now = 103.0
    m.exclude(2.0)  # a checkpoint took 2 s of those 3
    clock.now = 107.0
    m.step(10, 1.23456789, 0.001, Norm(float("inf")), tokens_per_step=50)
    clock.now = 112.0
    m.step(20, 0.5, 0.0005, Norm(2.5), tokens_per_step=50)
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first == {
        "event": "step",
        "step": 10,
        "steps": 20,
        "loss": 1.234568,
        "lr": 0.001,
        "grad_norm": None,  # inf (an fp16 overflow step) is no JSON number
        "tokens_per_s": 100.0,  # 10 steps of 50 tokens in the 5 s that were training
        "seconds": 7.0,
        "time": 1_790_000_107.0,  # the wall clock: a rotation's window lines up with the steps
        "restart": 1,
    }
    assert (second["tokens_per_s"], second["grad_norm"], second["seconds"]) == (100.0, 2.5, 12.0)
    assert m.last_loss == 0.5 and m.seconds() == 12.0


def test_metrics_off_rank_0_write_nothing() -> None:
    from labctl.agent.train.metrics import Metrics

    out = io.StringIO()
    m: Any = Metrics(out, active=False, steps=1, restart=0)
    m.start_clock(0)
    m.step(1, 1.0, 0.1, None, tokens_per_step=8)
    assert out.getvalue() == "" and m.last_loss == 1.0
