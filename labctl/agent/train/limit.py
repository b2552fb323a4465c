"""When a time-boxed run stops: the reference trainer's `time_limit`, as arithmetic.

Rank 0 asks `should_stop` at each check: would the steps up to the next check and then a
checkpoint still end inside the limit? If not it stops there, so the checkpoint it writes at
that step is the last thing the run does. It checks after every step unless steps are short:
then about once every CHECK_EVERY_S (`check_interval`), and at every regular checkpoint step,
so a run of millisecond steps does not pay a broadcast each step. The step estimate is the slowest of the recent steps and the
checkpoint estimate the slowest checkpoint this process wrote (before the first one, the
state's size at a slow disk's speed): a run that stops one step early loses a step, one
that stops late loses everything since its last checkpoint when the session is killed.

Standard library only, Python 3.8, like the rest of the agent package.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Deque, Mapping, Optional, Sequence

RECENT_STEPS = 20  # how many recent steps the step estimate looks at
CHECK_EVERY_S = 1.0  # short steps are checked about this often (what a stop may leave unused)
# Before any checkpoint was written: the state at this speed (an HDD, a network file system,
# with fsync and sha256), plus the fixed cost of two files, a rename and a barrier.
FIRST_CHECKPOINT_BYTES_PER_S = 50e6
FIRST_CHECKPOINT_FIXED_S = 2.0
CHECKPOINT_SAFETY = 1.5  # a checkpoint can be slower than the last one (page cache, a busy disk)
# Left at the end for what follows the checkpoint: the event, barriers, tearing down the process group.
EXIT_MARGIN_FRACTION = 0.01
EXIT_MARGIN_MAX_S = 10.0


def exit_margin(limit: float) -> float:
    return min(EXIT_MARGIN_MAX_S, limit * EXIT_MARGIN_FRACTION)


def should_stop(elapsed: float, step_seconds: float, checkpoint_seconds: float, limit: float) -> bool:
    """Whether to stop after the step just done (`elapsed` seconds into a `limit`-second run).

    True when one more step of `step_seconds` and a checkpoint of `checkpoint_seconds` would
    not both fit before the limit (less a small margin for the exit itself).
    """
    need = step_seconds + checkpoint_seconds * CHECKPOINT_SAFETY + exit_margin(limit)
    return elapsed + need >= limit


def check_interval(step_seconds: float) -> int:
    """Steps until the next check: 1, or as many short steps as take about CHECK_EVERY_S."""
    if step_seconds <= 0:
        return 1
    return max(1, min(1000, int(CHECK_EVERY_S / step_seconds)))


def checkpoint_estimate(written_seconds: Sequence[float], state_bytes: int) -> float:
    """Seconds the next checkpoint may take: the slowest one written so far, else from the state's size."""
    if written_seconds:
        return max(written_seconds)
    return FIRST_CHECKPOINT_FIXED_S + state_bytes / FIRST_CHECKPOINT_BYTES_PER_S


class StepTimes:
    """The recent steps' durations; `estimate()` is the slowest of them (0 before the first)."""

    def __init__(self, keep: int = RECENT_STEPS) -> None:
        self.recent: Deque[float] = deque(maxlen=keep)

    def add(self, seconds: float) -> None:
        self.recent.append(seconds)

    def estimate(self) -> float:
        return max(self.recent) if self.recent else 0.0


def process_age(pid: int) -> Optional[float]:
    """Seconds since process `pid` started (Linux /proc), or None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def clock_origin(environ: Mapping[str, str]) -> float:
    """The time.monotonic() value a time limit counts from.

    Alone: this process's start. Under torchrun (TORCHELASTIC_RUN_ID set): its agent's start,
    the worker's parent, so restarted workers do not begin a fresh limit and the rendezvous
    counts too.
    """
    now = time.monotonic()
    pid = os.getppid() if environ.get("TORCHELASTIC_RUN_ID") else os.getpid()
    age = process_age(pid)
    return now - age if age is not None else now
