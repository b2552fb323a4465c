"""`labctl orchestra status`: what is warm where, since when, whether it answers, the last and
next rotation, and the RAM cache's hits and misses over the recorded rotations.

Read-only: one `orch_state` round trip per serving host, no lock, nothing written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from labctl.orchestra.hoststate import HostView, find_repair, read_views

if TYPE_CHECKING:
    from labctl.context import Context
    from labctl.orchestra.spec import Orchestra


@dataclass
class Status:
    rows: list[dict[str, Any]]  # one per warm model or stray server
    last: dict[str, Any] | None  # newest history entry of a rotation (or start)
    next_at: float | None  # last rotation + the cadence
    every_s: float
    warm_size: int
    cache_hits: int
    cache_misses: int
    notes: list[str] = field(default_factory=list)  # what a repair would change

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
        }


def summarize(views: dict[str, HostView], every_s: float, warm_size: int) -> Status:
    """Pure: the status from what the hosts answered."""
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
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
        # Every serving host keeps the same rotation entries; one host's copy is enough.
        if len(view.history) > len(history):
            history = view.history
    rotations = [h for h in history if h.get("kind") in ("rotate", "start") and h.get("ok")]
    last = rotations[-1] if rotations else None
    hits = sum(len(h.get("cache_hits") or []) for h in rotations)
    misses = sum(len(h.get("cache_misses") or []) for h in rotations)
    next_at = float(last["at"]) + every_s if last and isinstance(last.get("at"), (int, float)) else None
    return Status(rows, last, next_at, every_s, warm_size, hits, misses, notes)


def orchestra_status(ctx: Context, orch: Orchestra) -> Status:
    from labctl.orchestra.rotate import serving_hosts

    views = read_views(ctx, serving_hosts(ctx, orch), orch.server.health, gpus=False)
    return summarize(views, orch.every_s, orch.warm)
