"""A host's warm.json written (orchestra.commit): exactly the servers that answer there now,
with a history entry when a rotation or repair ends."""

from __future__ import annotations

import socket
import time
from typing import Any

from labctl.orchestra.steps.state import Rotation


def commit(rot: Rotation, host: str, entry: dict[str, Any] | None = None) -> None:
    # `peers`: every serving host's address and servers, so that a host later removed from
    # the inventory can still be named with what it ran and how to stop it.
    peers = {
        name: {
            "address": h.address,
            "user": h.user,
            "port": h.port,
            "models": [
                {"name": m["name"], "pid": m.get("pid"), "port": m.get("port")} for m in rot.warm[name]
            ],
        }
        for name, h in sorted(rot.hosts.items())
    }
    warm = {
        "lab": rot.ctx.inventory.lab,
        "host": host,
        "models": rot.warm[host],
        "warm_size": rot.orch.warm,
        "hosts": sorted(rot.hosts),
        "peers": peers,
        "cursor": rot.cursor,
    }
    rot.call(host, "orchestra.commit", {"warm": warm, "history": entry})


def history_entry(rot: Rotation) -> dict[str, Any]:
    """The record of a rotation that carried out its plan, for every host's history."""
    result = rot.result
    return {
        "started": round(rot.started, 3),
        "at": time.time(),
        "kind": rot.opts.kind,
        "joined": [t.model for t in result.joined],
        "left": [t.model for t in result.left],
        "modes": sorted({s.mode for s in rot.plan.steps if s.mode}),
        "cache_hits": [t.model for t in result.joined if t.cache_hit],
        "cache_misses": [t.model for t in result.joined if not t.cache_hit],
        "stages": result.stages(),
        "seconds": round(sum(result.stages().values()), 3),
        "ok": True,
        # Who rotated: `orchestra status` tells a scheduled copy on a host the inventory no
        # longer has (its cron entry left behind) from this lab's own runs.
        "by": {"controller": socket.gethostname(), "inventory": str(rot.ctx.inventory_path)},
    }
