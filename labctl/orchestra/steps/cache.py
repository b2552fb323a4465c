"""Joining models missing from their host's RAM cache synced in before any starts."""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from labctl.cache.ops import cache_state
from labctl.cache.sync import sync
from labctl.hosts.fanout import on_host
from labctl.orchestra.steps.state import Rotation

if TYPE_CHECKING:
    from labctl.hosts.fanout import HostRun


def sync_cache(rot: Rotation, joining: Sequence[Any]) -> None:
    """Joining models missing from their host's RAM cache are synced first; the warm ones
    are protected from eviction. Each model's share of the sync lands in `rot.cache_times`."""
    rot.cache_times = {}
    by_host: dict[str, list[str]] = {}
    for s in joining:
        by_host.setdefault(s.host, []).append(s.model)
    for host, models in by_host.items():
        # Once per folder: two models may serve the same files (a second server of one model).
        folders = list(dict.fromkeys(rot.orch.model(m).folder for m in models))
        got = on_host(rot.ctx, rot.hosts[host], partial(sync_missing, rot, folders=folders))
        for m in models:
            hit = rot.orch.model(m).folder not in got["missing"]
            share = got["seconds"] / max(1, len(got["missing"])) if not hit else 0.0
            rot.cache_times[m] = (share, hit)


def sync_missing(rot: Rotation, run: HostRun, folders: list[str]) -> dict[str, Any]:
    host, target = run.host.name, rot.targets[run.host.name]
    state = cache_state(run, target.cache)
    cached = {n for n, e in (state.get("models") or {}).items() if e.get("present", True)}
    missing = [f for f in folders if f not in cached]
    if not missing:
        return {"missing": [], "seconds": 0.0}
    rot.progress.event("syncing", host=host, models=list(missing), source=target.source.name)
    t = time.monotonic()
    names = set(rot.orch.names)
    warm = {rot.orch.model(m["name"]).folder for m in rot.warm[host] if m["name"] in names}
    sync(run, target, missing, protect=warm)
    return {"missing": missing, "seconds": time.monotonic() - t}
