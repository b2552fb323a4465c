"""What the reference trainer reports, and the figures of its step events.

Rank 0 writes one JSON object per line through `EventLog` (stdout, the run's metrics_path and,
where TensorBoard is installed, its event files); `Metrics` holds that log and the clock the step
events measure on: the seconds since training began, and the tokens per second since the
previous step event, with checkpoint writing kept out of it.

Like the rest of the agent package this module imports without torch and keeps to Python 3.8
syntax.
"""

from __future__ import annotations

import math
import time
from typing import IO, Any, Dict, Optional, Tuple

from .events import EventLog


class Metrics:
    """The event log of one worker (silent off rank 0) and the clock of its step events."""

    def __init__(self, out: IO[str], active: bool, steps: int, restart: int) -> None:
        self.events = EventLog(out, active=active)
        self.steps = steps
        self.restart = restart
        self.last_loss: Optional[float] = None
        self.t0 = time.perf_counter()
        self._last_log: Tuple[int, float] = (0, self.t0)  # the step and time tokens_per_s counts from

    def emit(self, event: Dict[str, Any]) -> None:
        """A JSON line on stdout and in metrics_path (and TensorBoard scalars), from rank 0 only."""
        self.events.write(event)

    def sample(self, sample: Dict[str, Any]) -> None:
        """Phase 3's sample of a step (phase3.pick_sample), from rank 0 only."""
        self.events.sample(sample)

    def start_clock(self, step: int) -> None:
        """Training begins after `step` (0, or the step resumed from): the clock starts now."""
        self.t0 = time.perf_counter()
        self._last_log = (step, self.t0)

    def seconds(self) -> float:
        return round(time.perf_counter() - self.t0, 3)

    def exclude(self, seconds: float) -> None:
        """Time that was not training (a checkpoint's writing): kept out of the next tokens_per_s."""
        last_step, last_time = self._last_log
        self._last_log = (last_step, last_time + seconds)

    def step(
        self,
        step: int,
        loss: float,
        lr: float,
        grad_norm: Any,
        tokens_per_step: int,
        extra: Optional[Dict[str, Any]] = None,
    ) -> None:
        """The step event of `step`: its mean loss (already checked finite), the lr it used, the
        gradients' total norm (a device tensor, or None where it was not measured)."""
        loss = round(loss, 6)
        now = time.perf_counter()
        last_step, last_time = self._last_log
        rate = (step - last_step) * tokens_per_step / max(now - last_time, 1e-9)
        self._last_log = (step, now)
        self.last_loss = loss
        norm_out = None
        if grad_norm is not None:
            norm = grad_norm.item()
            # An fp16 overflow step (skipped by the scaler) has an inf norm, which JSON cannot carry.
            norm_out = round(norm, 6) if math.isfinite(norm) else None
        event = {
            "event": "step",
            "step": step,
            "steps": self.steps,
            "loss": loss,
            "lr": lr,
            "grad_norm": norm_out,
            "tokens_per_s": round(rate, 1),
            "seconds": round(now - self.t0, 3),
            "time": round(time.time(), 3),  # wall clock: what else happened then (a rotation) lines up
            "restart": self.restart,
        }
        event.update(extra or {})  # phase 3's figures since the last step event (phase3.Window)
        self.emit(event)
