"""A rotation decided as data, from the orchestra file and what the serving hosts said.

Pure: `decide` joins the pieces (the GPUs the orchestra may use, who leaves and who joins, where
each model goes, the order of starts and stops) into one `RotationPlan` that `--check`
prints and `rotate.py` carries out; `plan_placement` is `labctl orchestra plan`'s view.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from labctl.orchestra.choose import Choice, choose, lowest_warm, order_steps
from labctl.orchestra.fit import ModelFit
from labctl.orchestra.place import CapacityRow, Gpu, Placement, capacity, place, placement_of, split_gpus
from labctl.output.errors import InputError

if TYPE_CHECKING:
    from labctl.inventory.model import Host, Inventory
    from labctl.orchestra.hoststate import HostView, Repair
    from labctl.orchestra.spec import Orchestra


@dataclass(frozen=True)
class PlanStep:
    action: str  # start | stop
    model: str
    host: str
    gpu: int | None
    gpu_model: str
    memory_gb: float
    mode: str
    # "declared": the inventory names this GPU and the host did not report it (no driver, the
    # simulated lab); tables mark it so a reader does not take it for a card that was found.
    gpu_source: str = ""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class RotationPlan:
    kind: str
    choice: Choice | None
    before: Placement
    after: Placement
    steps: list[PlanStep]
    cursor: str | None
    lowest: int  # the fewest warm models at any moment of the steps
    reason: str = ""
    # Models running on a GPU the orchestra no longer has: model -> why they stop (and start
    # again on a GPU it has, where they stay warm).
    displaced: dict[str, str] = field(default_factory=dict)

    @property
    def joining(self) -> list[str]:
        return [s.model for s in self.steps if s.action == "start"]

    @property
    def leaving(self) -> list[str]:
        return [s.model for s in self.steps if s.action == "stop"]

    def summary(self) -> str:
        j, lv = self.joining, self.leaving
        parts = []
        if j:
            parts.append(f"in: {', '.join(j)}")
        if lv:
            parts.append(f"out: {', '.join(lv)}")
        return "; ".join(parts) or "no change"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "joining": self.joining,
            "leaving": self.leaving,
            "why": {**(self.choice.why if self.choice else {}), **self.displaced},
            "steps": [s.to_json() for s in self.steps],
            "placement": self.after.as_dict(),
            "lowest_warm": self.lowest,
            "cursor": self.cursor,
            "reason": self.reason,
            "displaced": dict(self.displaced),
        }


def load_claims(inv: Inventory) -> dict[str, list[str]]:
    """The GPUs training keeps (playbooks/train.yaml beside the inventory); none when there is no
    phases file (a lab that does not train here gives the orchestra every GPU)."""
    from labctl.documents.defaults import default_places
    from labctl.orchestra.place import training_claims
    from labctl.train.phases import DEFAULT_PHASES, load_phases

    found = [p for p in default_places(DEFAULT_PHASES, inv.path) if p.is_file()]
    if not found:
        return {}
    return training_claims(load_phases(found[0]), inv)


def orchestra_gpus(
    inv: Inventory, orch: Orchestra, hosts: Sequence[Host], views: Mapping[str, HostView] | None
) -> tuple[list[Gpu], list[tuple[Gpu, str]]]:
    detected = {h.name: (views[h.name].gpus if views and h.name in views else None) for h in hosts}
    return split_gpus(hosts, detected, orch.gpus, load_claims(inv))


def fitted(
    orch: Orchestra, files: Mapping[str, Mapping[str, Any]], gpus: Sequence[Gpu], names: Sequence[str]
) -> tuple[dict[str, float], dict[str, set[Any]], dict[str, ModelFit]]:
    """(needs, the GPUs each model may use, each model's fit) for `names`, or the InputError
    naming every model whose engine cannot serve it here (orchestra/fit.py)."""
    from labctl.orchestra.engines import engine
    from labctl.orchestra.fit import check_models, refusals

    fits = check_models(orch, files, gpus, names)
    refused = refusals(fits)
    if refused:
        raise InputError(
            " ".join(refused),
            "Each model's engine must serve its format and run on a GPU of the orchestra: set engine: "
            "(and the model's files) in the orchestra file; `labctl orchestra plan` checks it without "
            "starting anything.",
        )
    by_key = {g.key: g for g in gpus}
    scales = {}
    for n, f in fits.items():
        eng = engine(f.engine)
        dtype = (files.get(n) or {}).get("dtype")
        if dtype is None and orch.model(n).bits == 16:
            dtype = "F16"
        scales[n] = max((eng.weight_scale(by_key[k].cap, dtype) for k in f.allowed), default=1.0)
    try:
        needs = orch.needs(list(names), files, scales)
    except ValueError as e:
        raise InputError(
            f"{e}.", "Every model needs a size: from its files on the storage host, or size_gb:."
        ) from None
    return needs, {n: f.allowed for n, f in fits.items()}, fits


def decide(
    inv: Inventory,
    orch: Orchestra,
    hosts: Sequence[Host],
    views: Mapping[str, HostView],
    repairs: Mapping[str, Repair],
    kind: str,
    out: Sequence[str] = (),
    in_: Sequence[str] = (),
    files: Mapping[str, Mapping[str, Any]] | None = None,
) -> RotationPlan:
    """What `kind` (rotate | start | stop) does, from the repaired state of every serving host;
    `files`: what the storage hosts read of the models (files.py)."""
    gpus, left_out = orchestra_gpus(inv, orch, hosts, views)
    current = [{**m, "host": host} for host, rep in sorted(repairs.items()) for m in rep.current]
    cursor = next((v.warm.get("cursor") for v in views.values() if v.warm and v.warm.get("cursor")), None)
    needs = {m["name"]: float(m.get("memory_gb") or 0.0) for m in current}
    allowed: dict[str, set[Any]] = {}
    if kind != "stop":
        library, allowed, _ = fitted(orch, files or {}, gpus, orch.names)
        needs.update(library)
    keys = {g.key for g in gpus}
    where = {m["name"]: (m["host"], int(m["gpu"])) for m in current if m.get("gpu") is not None}
    # A server on a GPU the orchestra no longer has (gone from the inventory, kept for training,
    # left out by the file's gpus:) is not part of the placement: it stops, and starts again on
    # one of the orchestra's GPUs if it stays warm.
    displaced = {m["name"]: _displaced_why(m, left_out) for m in current if where.get(m["name"]) not in keys}
    before = placement_of(where, needs, gpus)
    choice: Choice | None
    reason = ""
    in_library = all(m["name"] in orch.names for m in current)
    pinned_warm = set(orch.pinned) <= {m["name"] for m in current}
    if kind == "stop":
        choice = None
        warm_after: list[str] = []
    elif kind == "start" and len(current) == orch.warm and in_library and pinned_warm and not displaced:
        choice = None
        warm_after = [m["name"] for m in current]
        reason = f"{len(current)} of {orch.warm} warm models already answer"
    else:
        # `start` fills the set up to `warm` without swapping any; `rotate` swaps `rotate`.
        choice = choose(
            orch.names,
            orch.pinned,
            orch.warm,
            0 if kind == "start" else orch.rotate,
            current,
            cursor,
            out,
            in_,
        )
        warm_after = list(choice.warm_after)
        cursor = choice.cursor
    after = place({n: needs[n] for n in warm_after}, gpus, keep=before.assignment(), allowed=allowed)
    by_key = {g.key: g for g in gpus}
    # The displaced stop first: their model cannot start on its new GPU while its old server runs.
    plan_steps = [
        PlanStep(
            "stop",
            m["name"],
            m["host"],
            m.get("gpu"),
            str(m.get("gpu_model") or ""),
            round(needs.get(m["name"], 0.0), 2),
            "move" if m["name"] in after.where else "gpu-gone",
            str(m.get("gpu_source") or ""),
        )
        for m in current
        if m["name"] in displaced
    ]
    for s in order_steps(before, after):
        g = by_key.get((s.host, s.gpu))
        plan_steps.append(
            PlanStep(
                s.action,
                s.model,
                s.host,
                s.gpu,
                g.model if g else "",
                round(needs.get(s.model, 0.0), 2),
                # `orchestra stop` swaps nothing: its stops have no make/break order to name.
                "" if kind == "stop" else "move" if s.model in displaced else s.mode,
                g.source if g else "",
            )
        )
    if not plan_steps and not reason:
        reason = "the warm set is already as planned"
        if kind == "rotate" and orch.rotate == 0 and not (out or in_):
            reason = "rotate is 0 in the orchestra file, so nothing rotates; the warm set is as planned"
    return RotationPlan(
        kind,
        choice,
        before,
        after,
        plan_steps,
        cursor,
        lowest_warm(len(current), plan_steps),
        reason,
        displaced,
    )


def _displaced_why(m: Mapping[str, Any], left_out: Sequence[tuple[Gpu, str]]) -> str:
    host, gpu = m["host"], m.get("gpu")
    if gpu is None:
        return f"it runs on {host} without a GPU; it moves to one of the orchestra's GPUs"
    why = next((w for g, w in left_out if g.key == (host, int(gpu))), None)
    return f"{host} GPU {gpu} is " + (
        f"no longer the orchestra's ({why})" if why else "gone from the inventory (or no longer detected)"
    )


@dataclass
class PlacementView:
    """`labctl orchestra plan`: the warm set placed, GPUs left out and why, the capacity view."""

    placement: Placement
    warm: list[str]
    left_out: list[tuple[Gpu, str]]
    capacity: list[CapacityRow]
    library: int
    notes: list[str] = field(default_factory=list)
    remote: list[dict[str, Any]] = field(default_factory=list)  # RemoteTier.as_dict each
    models: list[dict[str, Any]] = field(default_factory=list)  # model_rows(): the library's files

    def to_json(self) -> dict[str, Any]:
        where = self.placement.where
        return {
            "warm": self.warm,
            "placement": [
                {
                    "model": n,
                    "host": where[n].host,
                    "gpu": where[n].index,
                    "gpu_model": where[n].model,
                    "need_gb": round(self.placement.needs[n], 2),
                }
                for n in self.warm
            ],
            "models": self.models,
            "notes": self.notes,
            "gpus": self.placement.as_dict()["gpus"],
            "left_out": [
                {"host": g.host, "gpu": g.index, "gpu_model": g.model, "why": why} for g, why in self.left_out
            ],
            "capacity": [c.as_dict() for c in self.capacity],
            "library": self.library,
            "remote": self.remote,
        }


def model_rows(
    orch: Orchestra,
    files: Mapping[str, Mapping[str, Any]],
    fits: Mapping[str, ModelFit],
    needs: Mapping[str, float],
) -> list[dict[str, Any]]:
    """One row per library model: what `orchestra plan` shows of its files."""
    from labctl.orchestra.sizes import kv_cache_gb

    rows = []
    for name in orch.names:
        seen = files.get(name) or {}
        fit = fits[name]
        entry = orch.model(name)
        weights = (
            seen["weight_bytes"] / 1e9 if isinstance(seen.get("weight_bytes"), int) else entry.weights_gb
        )
        rows.append(
            {
                "name": name,
                "format": fit.format,
                "dtype": seen.get("dtype"),
                "engine": fit.engine,
                "params": seen.get("params") if isinstance(seen.get("params"), int) else None,
                "weights_gb": weights,
                "context": fit.context,
                "kv_gb": kv_cache_gb(seen, fit.context) if seen else None,
                "need_gb": round(needs[name], 3),
                "source": f"files on {seen['storage']}" if seen else "the orchestra file",
                "notes": list(fit.notes),
            }
        )
    return rows


def plan_placement(
    inv: Inventory,
    orch: Orchestra,
    hosts: Sequence[Host],
    views: Mapping[str, HostView] | None,
    files: Mapping[str, Mapping[str, Any]] | None = None,
    notes: Sequence[str] = (),
) -> PlacementView:
    """Where the warm set goes now (what is warm stays put; a first start takes the library's
    first models, pinned ones first)."""
    from labctl.orchestra.hoststate import find_repair

    files = files or {}
    gpus, left_out = orchestra_gpus(inv, orch, hosts, views)
    library, allowed, fits = fitted(orch, files, gpus, orch.names)
    current: list[dict[str, Any]] = []
    if views:
        for host, v in views.items():
            current += [{**m, "host": host} for m in find_repair(v).current]
    warm = [m["name"] for m in current if m["name"] in orch.names]
    choice = choose(orch.names, orch.pinned, orch.warm, 0, [{"name": n, "since": 0} for n in warm])
    names = list(choice.warm_after)
    keep = {m["name"]: (m["host"], int(m["gpu"])) for m in current if m.get("gpu") is not None}
    placement = place({n: library[n] for n in names}, gpus, keep=keep, allowed=allowed)
    import os

    return PlacementView(
        placement,
        names,
        left_out,
        capacity(gpus, orch.overhead),
        len(orch.names),
        notes=list(notes),
        remote=[r.as_dict(os.environ) for r in orch.remote],
        models=model_rows(orch, files, fits, library),
    )
