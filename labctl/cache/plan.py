"""Deciding a sync before a byte moves: what each model needs, and what to evict to make room.

Pure functions over the cache's state and the storage host's listing (both as the agents
report them), so every decision is unit-tested without a host: a model is cached, fetched,
resumed or replaced (`plan_sync`); room comes from abandoned partial copies first, then the
least recently used unpinned models, and never from pinned ones (`plan_eviction`), with an
error before any byte moves when room cannot be made.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from labctl.agent.cache.manifest import chunk_ranges, page_round
from labctl.output.errors import HostError
from labctl.output.fmt import fmt_bytes

SLACK = 1 << 20  # room left for the manifest and state files next to the models


class CacheFull(HostError):
    """Room for the models cannot be made (pinned models, or they exceed the cache)."""


@dataclass
class Evictable:
    name: str
    disk_bytes: int
    last_used: float | None = None
    pinned: bool = False
    partial: bool = False  # an abandoned partial copy: unusable, so it goes first


def plan_eviction(
    free: int,
    need: int,
    candidates: Iterable[Evictable],
    *,
    capacity: int | None = None,
    where: str = "the cache",
    what: str = "the models",
) -> list[Evictable]:
    """What to evict so that `need` bytes fit in `free` plus what is evicted.

    Abandoned partial copies go first (oldest first), then cached models, least recently used
    first. Pinned ones never. Raises CacheFull when even evicting everything allowed is not
    enough; nothing has been changed at that point.
    """
    if need <= free:
        return []
    allowed = [c for c in candidates if not c.pinned]
    order = sorted(allowed, key=lambda c: (not c.partial, c.last_used or 0.0, c.name))
    chosen: list[Evictable] = []
    got = free
    for c in order:
        if got >= need:
            break
        chosen.append(c)
        got += c.disk_bytes
    if got >= need:
        return chosen
    pinned = sorted((c for c in candidates if c.pinned), key=lambda c: c.name)
    verb = "need" if "," in what or what.startswith("the ") else "needs"
    if capacity is not None and need > capacity:
        why = f"{what} {verb} {fmt_bytes(need)}, more than the whole cache ({fmt_bytes(capacity)})"
    else:
        why = (
            f"{what} {verb} {fmt_bytes(need)}; {fmt_bytes(max(0, free))} is free and evicting every unpinned model "
            f"would free only {fmt_bytes(got - free)} more"
        )
        if pinned:
            why += f" ({', '.join(c.name for c in pinned)} {'is' if len(pinned) == 1 else 'are'} pinned)"
    raise CacheFull(
        f"{where} has no room: {why}. Nothing was copied and nothing was evicted.",
        "Evict or unpin models (labctl cache evict / unpin), sync fewer at once, or raise "
        "model_cache.size_gb in the inventory and run `labctl provision --tags model_cache`.",
    )


def file_key(files: Iterable[Mapping[str, Any]]) -> set[tuple[str, int, Any]]:
    return {(str(f["path"]), int(f["size"]), f.get("mtime_ns")) for f in files}


def chunk_count(files: Iterable[Mapping[str, Any]], chunk_size: int) -> int:
    return sum(len(chunk_ranges(int(f["size"]), chunk_size)) for f in files)


@dataclass
class ModelPlan:
    name: str
    action: str  # cached | fetch | resume | replace
    bytes: int
    need_bytes: int = 0  # new space this model's copy takes
    resumed_bytes: int = 0  # verified bytes an earlier, stopped copy left (re-checked on the host)
    chunks: int = 0


@dataclass
class SyncPlan:
    models: list[ModelPlan]
    evict: list[Evictable] = field(default_factory=list)
    need_bytes: int = 0
    free_bytes: int = 0
    capacity_bytes: int = 0

    @property
    def to_fetch(self) -> list[str]:
        return [m.name for m in self.models if m.action != "cached"]

    def to_json(self) -> dict[str, Any]:
        return {
            "models": [asdict(m) for m in self.models],
            "evict": [asdict(e) for e in self.evict],
            "need_bytes": self.need_bytes,
            "free_bytes": self.free_bytes,
            "capacity_bytes": self.capacity_bytes,
        }


def plan_sync(
    state: Mapping[str, Any],
    listing: Mapping[str, Mapping[str, Any]],
    models: Sequence[str],
    chunk_size: int,
    *,
    where: str = "the cache",
    protect: Collection[str] = (),
) -> SyncPlan:
    """Decide, from the cache's state and the source's listing, what each model needs.

    `protect`: models never evicted to make room, as if pinned (the orchestra's warm set).

    A model is cached when the manifest lists it, it is on disk, and its files (path, size,
    mtime) are the source's: then nothing happens to it. One whose source changed is
    replaced. Room is planned for everything to copy at once, before any byte moves.
    """
    manifest: Mapping[str, Any] = state.get("models") or {}
    partials = {p["name"]: p for p in state.get("partials") or []}
    plans: list[ModelPlan] = []
    need = 0
    for name in models:
        src = listing[name]
        files = src.get("files") or []
        total = int(src.get("bytes", sum(int(f["size"]) for f in files)))
        entry = manifest.get(name)
        if entry and entry.get("present", True) and file_key(entry.get("files") or []) == file_key(files):
            plans.append(
                ModelPlan(
                    name,
                    "cached",
                    total,
                    chunks=chunk_count(files, int(entry.get("chunk_size") or chunk_size)),
                )
            )
            continue
        partial = partials.get(name)
        resumed, on_disk = 0, 0
        cs = chunk_size
        if partial:
            on_disk = int(partial.get("disk_bytes") or 0)
            same = {
                (p, int(f.get("size") or 0), f.get("mtime_ns"))
                for p, f in (partial.get("files") or {}).items()
            } == file_key(files)
            if same:
                resumed = int(partial.get("done_bytes") or 0)
                cs = int(partial.get("chunk_size") or chunk_size)
        model_need = max(0, sum(page_round(int(f["size"])) for f in files) - on_disk)
        action = "replace" if entry else ("resume" if resumed else "fetch")
        plans.append(ModelPlan(name, action, total, model_need, resumed, chunk_count(files, cs)))
        need += model_need
    free = int(state.get("free_bytes") or 0)
    capacity = int(state.get("capacity_bytes") or 0)
    plan = SyncPlan(plans, need_bytes=need, free_bytes=free, capacity_bytes=capacity)
    if need == 0:
        return plan
    wanted = set(models)
    candidates = [
        Evictable(
            n,
            int(e.get("disk_bytes") or e.get("bytes") or 0),
            e.get("last_used"),
            bool(e.get("pinned")) or n in protect,
        )
        for n, e in manifest.items()
        if n not in wanted
    ] + [
        Evictable(p["name"], int(p.get("disk_bytes") or 0), p.get("updated"), partial=True)
        for p in partials.values()
        if p["name"] not in wanted
    ]
    names = ", ".join(m.name for m in plans if m.action != "cached")
    plan.evict = plan_eviction(
        free - SLACK, need, candidates, capacity=capacity or None, where=where, what=names
    )
    return plan
