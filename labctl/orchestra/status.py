"""`labctl orchestra status`: what is warm where, since when, whether it answers, the last and
next rotation, and the RAM cache's hits and misses over the recorded rotations.

The next rotation is the one the installed schedule will start: the rotate job `labctl cron
install` put on a host, read back there (its cron fields, the host's clock and time zone, and
whether a cron daemon runs it), never a guess from the file's `every`.

Read-only: one `orchestra.state` round trip per serving host and one `cron.list` per Linux host,
no lock, nothing written.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labctl.orchestra.hoststate import HostView, find_repair, read_views

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.hosts.fanout import HostResult
    from labctl.orchestra.spec import Orchestra


@dataclass
class Status:
    rows: list[dict[str, Any]]  # one per warm model or stray server
    last: dict[str, Any] | None  # newest history entry of a rotation (or start)
    next_at: float | None  # when the installed schedule starts the next rotation; None: it never will
    every_s: float
    warm_size: int
    cache_hits: int
    cache_misses: int
    notes: list[str] = field(default_factory=list)  # what a repair would change
    schedule: dict[str, Any] = field(default_factory=dict)  # see scheduled_rotation
    # Servers on a serving machine that another lab started: said, never a problem of this lab.
    others: list[str] = field(default_factory=list)
    # Pinned models of the file that are not warm: `orchestra start` (or `rotate`) brings them in.
    pinned_not_warm: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> int:
        return sum(1 for r in self.rows if r["state"] == "loaded" and r["healthy"])

    def to_json(self) -> dict[str, Any]:
        return {
            "models": self.rows,
            "warm_size": self.warm_size,
            "healthy": self.healthy,
            "last_rotation": self.last,
            "next_rotation_at": self.next_at,
            "every_s": self.every_s,
            "cache": {"hits": self.cache_hits, "misses": self.cache_misses},
            "problems": self.notes,
            "schedule": self.schedule,
            "other_labs": self.others,
            "pinned_not_warm": self.pinned_not_warm,
        }


def scheduled_rotation(lists: list[HostResult], file: str | None = None) -> dict[str, Any]:
    """Pure: the installed rotate job from every host's `cron.list` answer (`cron list`'s
    results), as {installed, host, schedule, next_at, daemon_running, command, unanswered,
    hint}. `installed` is False when no host that answered holds one; `next_at` is None
    unless a daemon there will start it. `file`: the orchestra file, for the hint."""
    found = [(r.host, j) for r in lists if r.ok for j in r.data or [] if j.get("name") == "rotate"]
    out: dict[str, Any] = {
        "installed": bool(found),
        "host": None,
        "schedule": None,
        "next_at": None,
        "daemon_running": None,
        "command": None,
        "also_on": [],
        "unanswered": [r.host for r in lists if not r.ok],
        "hint": None,
    }
    if not found:
        out["hint"] = f"labctl cron install rotate -f {shlex.quote(file or 'ORCHESTRA_FILE')}"
        return out
    # Two hosts that both rotate are a problem of their own; the sooner one is what happens next.
    host, job = min(found, key=lambda hj: hj[1].get("next") or float("inf"))
    running = bool(job.get("daemon_running"))
    out.update(
        host=host,
        schedule=job.get("schedule"),
        next_at=job.get("next") if running else None,
        daemon_running=running,
        command=job.get("command"),
        also_on=[h for h, _ in found if h != host],
    )
    if not running:
        from labctl.cron.install import idle_text

        out["hint"] = idle_text(host, [job])[1]
    return out


def rotated_from_outside(last: dict[str, Any] | None, addresses: Sequence[str] | None) -> str | None:
    """Pure: the problem when the newest rotation came from labctl's scheduled copy (`cron
    install`'s lab copy) on a machine whose address no host of the inventory has: a host removed
    from the inventory still holds the rotate entry and rotates by its own old copy of the lab.
    `addresses`: the inventory's hosts' addresses as IPs (None: not all known, say nothing)."""
    from labctl.cron.plan import INVENTORY

    if not last or addresses is None:
        return None
    by, client = last.get("by") or {}, last.get("client")
    if not isinstance(by, dict) or by.get("inventory") != INVENTORY or not isinstance(client, str):
        return None
    if client in addresses:
        return None
    return (
        f"the last rotation ran from labctl's scheduled copy on {client}, which is no host of the "
        "inventory: a host removed from it still holds the rotate entry of `labctl cron install` "
        "and rotates by its old copy of the lab. Remove the entry there: "
        f"`ssh root@{client} 'rm -f /etc/cron.d/labctl-rotate; systemctl disable --now labctl-rotate.timer'`"
    )


def summarize(
    views: dict[str, HostView],
    every_s: float,
    warm_size: int,
    schedule: dict[str, Any] | None = None,
    addresses: Sequence[str] | None = None,
    pinned: Sequence[str] = (),
) -> Status:
    """Pure: the status from what the hosts answered; `schedule` from scheduled_rotation;
    `addresses` as rotated_from_outside takes them; `pinned`: the file's pinned models."""
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    others: list[str] = []
    history: list[dict[str, Any]] = []
    for host, view in sorted(views.items()):
        by_pid = {s.get("pid"): s for s in view.servers}
        for m in view.warm_models:
            s = by_pid.get(m.get("pid"))
            healthy = bool(s and s.get("healthy") and s.get("model") == m["name"])
            rows.append(
                {
                    "host": host,
                    "name": m["name"],
                    "gpu": m.get("gpu"),
                    "gpu_model": m.get("gpu_model"),
                    "gpu_source": m.get("gpu_source"),
                    "port": m.get("port"),
                    "pid": m.get("pid"),
                    "since": m.get("since"),
                    "state": m.get("state", "?"),
                    "healthy": healthy,
                    "health": (s or {}).get("health"),
                    "error": None if healthy else ((s or {}).get("error") or "no server answers"),
                }
            )
        notes += find_repair(view).notes()
        note = view.others_note()
        if note:
            others.append(note)
        # Every serving host keeps the same rotation entries; one host's copy is enough.
        if len(view.history) > len(history):
            history = view.history
    rotations = [h for h in history if h.get("kind") in ("rotate", "start") and h.get("ok")]
    last = rotations[-1] if rotations else None
    outside = rotated_from_outside(last, addresses)
    if outside:
        notes.append(outside)
    hits = sum(len(h.get("cache_hits") or []) for h in rotations)
    misses = sum(len(h.get("cache_misses") or []) for h in rotations)
    schedule = schedule if schedule is not None else scheduled_rotation([])
    warm_names = {r["name"] for r in rows}
    missing = [p for p in pinned if p not in warm_names]
    return Status(
        rows, last, schedule["next_at"], every_s, warm_size, hits, misses, notes, schedule, others, missing
    )


def orchestra_status(ctx: Context, orch: Orchestra, file: Path | None = None) -> Status:
    from labctl.cron.install import list_jobs
    from labctl.orchestra.rotate import serving_hosts

    views = read_views(ctx, serving_hosts(ctx, orch), orch.server.health, gpus=False)
    schedule = scheduled_rotation(list_jobs(ctx), str(file) if file else None)
    return summarize(views, orch.every_s, orch.warm, schedule, _ip_addresses(ctx), orch.pinned)


def _ip_addresses(ctx: Context) -> list[str] | None:
    """The inventory's hosts' addresses as IPs; None when a name does not resolve here (then an
    SSH client's address cannot be told apart from them)."""
    import socket

    out = []
    for h in ctx.inventory.hosts.values():
        try:
            out += [str(a[4][0]) for a in socket.getaddrinfo(h.address, None, proto=socket.IPPROTO_TCP)]
        except (OSError, UnicodeError):
            return None
    return out
