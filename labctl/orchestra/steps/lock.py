"""Every serving host's rotation lock, taken before its state is read, and the hosts that left
the orchestra: locked and read where labctl reaches them, named where it does not."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from labctl.agent.core import paths
from labctl.hosts.fanout import HostRun
from labctl.hosts.hostlock import HostLock, LockKind
from labctl.orchestra.hoststate import HostView, read_views
from labctl.orchestra.steps.state import Options
from labctl.output.errors import HostError

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.inventory.model import Host
    from labctl.orchestra.spec import Orchestra

ROTATION = LockKind(
    "labctl rotate",
    "is rotating the orchestra here",
    "is in the middle of another rotation",
    "Let that rotation finish (`labctl orchestra status` shows it), then run again; "
    "--wait SECONDS waits longer, --check takes no lock.",
    "LABCTL_ROTATE_LOCK_WAIT",
    paths.ORCHESTRA_LOCK,
)


class Locks:
    """The rotation locks this run holds, released when `stack` closes. A dry run takes none."""

    def __init__(self, ctx: Context, opts: Options, stack: ExitStack) -> None:
        self.ctx, self.opts, self.stack = ctx, opts, stack

    def take(self, chosen: Sequence[Host]) -> None:
        if self.opts.dry_run:
            return
        # Sorted by name, so that two rotations never deadlock.
        for h in sorted(chosen, key=lambda h: h.name):
            self.stack.enter_context(
                HostLock(
                    HostRun(self.ctx, h, threading.Event()), self.opts.lock_wait, self.opts.progress, ROTATION
                )
            )


def reach_gone(
    ctx: Context, orch: Orchestra, gone: dict[str, dict[str, Any]], locks: Locks
) -> tuple[dict[str, Host], dict[str, HostView], dict[str, str]]:
    """Hosts that served at the last commit and serve no more: those still in the inventory are
    locked and read (retired: {name: host}, with their views); one that cannot be locked or read
    (held by another rotation, or not answering) is `unreachable`: {name: why}, to be named only.
    Hosts gone from the inventory, and Windows hosts, are in none of the three."""
    retired: dict[str, Host] = {}
    views: dict[str, HostView] = {}
    unreachable: dict[str, str] = {}
    for name in sorted(gone):
        h = ctx.inventory.hosts.get(name)
        if h is None or h.is_windows:
            continue
        try:
            locks.take([h])
            views.update(read_views(ctx, [h], orch.server.health, gpus=False))
            retired[name] = h
        except HostError as e:
            unreachable[name] = e.message
    return retired, views, unreachable
