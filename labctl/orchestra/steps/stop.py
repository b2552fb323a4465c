"""Servers stopped (orchestra.stop): the plan's leavers, what a failed start left, and
`orchestra stop`'s sweep of whatever of the lab still runs."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from labctl.orchestra.steps.commit import commit
from labctl.orchestra.steps.publish import publish
from labctl.orchestra.steps.state import Rotation, Timing
from labctl.output.errors import HostError, LabctlError

if TYPE_CHECKING:
    from labctl.agent.orchestra.answers import StopAnswer


def stop(rot: Rotation, host: str, models: Sequence[str], pids: Sequence[int] = ()) -> list[Timing]:
    """`models` (and any of `pids`) stopped on `host` and dropped from its warm list; a server
    that outlives SIGKILL is an error."""
    t = time.monotonic()
    if models:
        rot.progress.event("stopping", host=host, models=list(models))
    # rot.call answers Any; the agent's checker has held the answer to StopAnswer
    answer: StopAnswer = rot.call(
        host,
        "orchestra.stop",
        {
            "models": list(models) if models else None,
            "pids": list(pids) or None,
            "grace": rot.orch.server.stop_grace,
        },
        timeout=rot.orch.server.stop_grace + 60,
    )
    if answer["remaining"]:
        left = ", ".join(f"{r.get('model')} (pid {r.get('pid')})" for r in answer["remaining"])
        raise HostError(
            f"{host}: servers still run after SIGKILL: {left}.",
            "Check the host (a process stuck in the kernel, e.g. on a GPU driver) and run again.",
        )
    gone = set(models)
    rot.warm[host] = [m for m in rot.warm[host] if m["name"] not in gone]
    each = (time.monotonic() - t) / max(1, len(models))
    return [Timing(m, host, stop=each) for m in models]


def stop_quietly(rot: Rotation, host: str, pids: Sequence[int]) -> None:
    try:
        rot.call(
            host,
            "orchestra.stop",
            {"models": None, "pids": list(pids), "grace": rot.orch.server.stop_grace},
            timeout=rot.orch.server.stop_grace + 60,
        )
    except LabctlError:
        pass  # the next rotation's repair finds what is left


def stop_rest(rot: Rotation) -> None:
    """`orchestra stop`: whatever of this lab still runs on a serving host (recorded or not)
    is stopped too, not only what warm.json listed."""
    for host in sorted(rot.hosts):
        answer: StopAnswer = rot.call(
            host,
            "orchestra.stop",
            {"models": None, "pids": None, "grace": rot.orch.server.stop_grace},
            timeout=rot.orch.server.stop_grace + 60,
        )
        stopped = answer["stopped"]
        if stopped:
            listed = ", ".join(f"{s['model']} (pid {s['pid']})" for s in stopped)
            note = f"{host}: stopped {listed}: running, but not in warm.json"
            rot.result.repairs.append(note)
            rot.progress.event("repaired", note=note)
        rot.warm[host] = []
        commit(rot, host)
    publish(rot, "stopped")
