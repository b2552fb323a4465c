"""Where the warm set goes: the orchestra's GPUs, a placement by memory, and the capacity view.

GPUs are data: those a host reports in its facts win over those the inventory declares (the
same rule training follows, through `labctl.train.plan.train_gpus`), and the GPUs training
keeps (`playbooks/train.yaml`: its `gpus:` on its `hosts:`) are left to it unless the
orchestra file's `gpus:` names them. Nothing here touches a host.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from labctl.output.errors import InputError
from labctl.train.plan import gpu_wanted, train_gpus

if TYPE_CHECKING:
    from labctl.inventory.model import Host, Inventory
    from labctl.orchestra.spec import Overhead
    from labctl.train.phases import PhasesFile

GpuKey = tuple[str, int]
"""(host, GPU index on that host)."""
EPS = 1e-9


@dataclass(frozen=True)
class Gpu:
    host: str
    index: int
    model: str
    memory_gb: float
    source: Literal["detected", "declared"]
    # Compute capability, where known; it follows from the model, so it is not part of equality.
    cap: tuple[int, int] | None = field(default=None, compare=False)

    @property
    def key(self) -> GpuKey:
        return (self.host, self.index)

    @property
    def label(self) -> str:
        return f"{self.host} GPU {self.index} ({self.model}, {self.memory_gb:g} GB)"


def training_claims(phases: PhasesFile, inventory: Inventory) -> dict[str, list[str]]:
    """{host: GPU models training keeps there} over every phase of the phases file; an empty
    list means every GPU of the host (a phase with no `gpus:` trains on all of them)."""
    from labctl.inventory.select import select_in_lab

    claims: dict[str, list[str]] = {}
    for number in sorted(phases.phases):
        settings = phases.settings(number)
        # A lab with no trainer keeps no GPU for training.
        chosen = select_in_lab(inventory, settings.hosts, label=f"{phases.path} phase {number} hosts:")
        for host in chosen.hosts:
            had = claims.get(host.name)
            if not settings.gpus or had == []:
                claims[host.name] = []
            else:
                claims[host.name] = [*(had or []), *(g for g in settings.gpus if g not in (had or []))]
    return claims


def split_gpus(
    hosts: Sequence[Host],
    detected: Mapping[str, list[dict[str, Any]] | None],
    wanted: Sequence[str] = (),
    training: Mapping[str, Sequence[str]] | None = None,
) -> tuple[list[Gpu], list[tuple[Gpu, str]]]:
    """(the orchestra's GPUs, [(a GPU left out, why)]) on `hosts`.

    `detected[host]` is the `gpus` list of the host's facts (labctl/agent/core/gpus.py); None or an
    empty list means the host reported none, and the inventory's declared GPUs are used, indexed
    per host in declared order with `count` expanded. `wanted` is the orchestra file's `gpus:`
    (empty: any); `training` is `training_claims(...)`: those GPUs stay with training unless
    `wanted` names them.
    """
    used: list[Gpu] = []
    left: list[tuple[Gpu, str]] = []
    for host in hosts:
        facts = detected.get(host.name) or []
        declared_memory = {g.model: g.memory_gb for g in host.gpus}
        for position, tg in enumerate(train_gpus(host, {"gpus": facts}, [])):
            memory = tg.memory_gb
            if memory is None:
                # A host that did not say how much memory a GPU has: the declared size of that model.
                memory = next((m for d, m in declared_memory.items() if gpu_wanted(tg.name, [d])), 0.0)
            gpu = Gpu(
                host.name,
                tg.index if tg.index is not None else position,
                tg.name,
                float(memory),
                "detected" if tg.index is not None else "declared",
                tg.cap,
            )
            claim = (training or {}).get(host.name)
            if wanted and not gpu_wanted(gpu.model, list(wanted)):
                left.append((gpu, f"not one of the orchestra file's gpus: {', '.join(wanted)}"))
            elif not wanted and claim is not None and gpu_wanted(gpu.model, list(claim)):
                which = ", ".join(claim) if claim else "every GPU of the host"
                left.append((gpu, f"kept for training (train.yaml gpus: {which})"))
            elif gpu.memory_gb <= 0:
                left.append((gpu, "its memory is unknown: declare it in the inventory (memory_gb)"))
            else:
                used.append(gpu)
    return used, left


def gpus_for(
    hosts: Sequence[Host],
    detected: Mapping[str, list[dict[str, Any]] | None],
    wanted: Sequence[str] = (),
    training: Mapping[str, Sequence[str]] | None = None,
) -> list[Gpu]:
    """The orchestra's GPUs on `hosts` (see `split_gpus`)."""
    return split_gpus(hosts, detected, wanted, training)[0]


@dataclass
class Row:
    gpu: Gpu
    models: list[str] = field(default_factory=list)
    used_gb: float = 0.0

    @property
    def free_gb(self) -> float:
        return self.gpu.memory_gb - self.used_gb


@dataclass
class Placement:
    """GPU → models → free memory, one row per GPU in the GPUs' order."""

    rows: list[Row]
    where: dict[str, Gpu]
    needs: dict[str, float]
    kept: list[str] = field(default_factory=list)  # models left where they were

    def assignment(self) -> dict[str, GpuKey]:
        return {name: gpu.key for name, gpu in self.where.items()}

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpus": [
                {
                    "host": r.gpu.host,
                    "index": r.gpu.index,
                    "model": r.gpu.model,
                    "memory_gb": r.gpu.memory_gb,
                    "source": r.gpu.source,
                    "models": [{"name": n, "need_gb": round(self.needs[n], 2)} for n in r.models],
                    "free_gb": round(r.free_gb, 2),
                }
                for r in self.rows
            ],
            "kept": list(self.kept),
        }


def placement_of(
    assignment: Mapping[str, GpuKey], needs: Mapping[str, float], gpus: Sequence[Gpu]
) -> Placement:
    """A placement as it stands (e.g. read from warm.json), not checked for room; models on a
    GPU not in `gpus` are left out."""
    rows = {g.key: Row(g) for g in gpus}
    where: dict[str, Gpu] = {}
    for name, key in assignment.items():
        row = rows.get(tuple(key))  # type: ignore[arg-type]
        if row is None:
            continue
        row.models.append(name)
        row.used_gb += needs[name]
        where[name] = row.gpu
    return Placement(list(rows.values()), where, {n: needs[n] for n in where}, list(where))


def place(
    models: Mapping[str, float],
    gpus: Sequence[Gpu],
    keep: Mapping[str, GpuKey] | None = None,
    allowed: Mapping[str, set[GpuKey]] | None = None,
) -> Placement:
    """Place `models` ({name: GPU GB needed}) on `gpus`; deterministic.

    A model of `keep` stays on its GPU while that GPU is still offered and the kept models fit
    it (in `keep`'s order). The others go largest first onto the GPU with the most free memory,
    so the orchestra spreads over the GPUs; where that spreading leaves a model no room, the
    tightest fit is tried instead before giving up. A model that fits nowhere is an InputError
    naming it, its need and the largest free GPU. `allowed` ({name: GPU keys}) keeps a model
    to the GPUs its engine runs on (orchestra/fit.py); a model not in it may go anywhere.
    """
    if not gpus:
        raise InputError(
            "The orchestra has no GPU to place its warm set on.",
            "Declare the serving hosts' GPUs in the inventory (gpus:), or change hosts: or gpus: in the "
            "orchestra file (train.yaml's GPUs stay with training unless gpus: names them).",
        )
    order = {g.key: i for i, g in enumerate(gpus)}
    by_key = {g.key: g for g in gpus}
    fixed: dict[str, GpuKey] = {}
    free = {g.key: g.memory_gb for g in gpus}
    for name, key in (keep or {}).items():
        key = (key[0], int(key[1]))
        ok = allowed is None or name not in allowed or key in allowed[name]
        if ok and name in models and key in free and models[name] <= free[key] + EPS:
            fixed[name] = key
            free[key] -= models[name]
    rest = sorted((n for n in models if n not in fixed), key=lambda n: -models[n])
    chosen = _fill(rest, models, free, order, True, allowed) or _fill(
        rest, models, free, order, False, allowed
    )
    if chosen is None:
        _refuse(rest, models, free, gpus)
    assert chosen is not None
    assign = {**fixed, **chosen}
    rows = [Row(g) for g in gpus]
    row_of = {r.gpu.key: r for r in rows}
    where: dict[str, Gpu] = {}
    for name in models:
        row = row_of[assign[name]]
        row.models.append(name)
        row.used_gb += models[name]
        where[name] = by_key[assign[name]]
    return Placement(rows, where, dict(models), [n for n in models if n in fixed])


def _fill(
    names: list[str],
    needs: Mapping[str, float],
    free: Mapping[GpuKey, float],
    order: Mapping[GpuKey, int],
    spread: bool,
    allowed: Mapping[str, set[GpuKey]] | None = None,
) -> dict[str, GpuKey] | None:
    room = dict(free)
    out: dict[str, GpuKey] = {}
    for name in names:
        where = allowed.get(name) if allowed else None
        fits = [k for k in room if needs[name] <= room[k] + EPS and (where is None or k in where)]
        if not fits:
            return None
        if spread:
            key = min(fits, key=lambda k: (-room[k], order[k]))
        else:
            key = min(fits, key=lambda k: (room[k], order[k]))
        out[name] = key
        room[key] -= needs[name]
    return out


def _refuse(
    names: list[str], needs: Mapping[str, float], free: Mapping[GpuKey, float], gpus: Sequence[Gpu]
) -> None:
    """Raise the InputError for the first model (largest first) the spreading placement cannot fit."""
    room = dict(free)
    by_key = {g.key: g for g in gpus}
    order = {g.key: i for i, g in enumerate(gpus)}
    for name in names:
        best = min(room, key=lambda k: (-room[k], order[k]))
        if needs[name] <= room[best] + EPS:
            room[best] -= needs[name]
            continue
        need = needs[name]
        biggest = max(gpus, key=lambda g: (g.memory_gb, -order[g.key]))
        if biggest.memory_gb + EPS < need:
            why = (
                f"no GPU of the orchestra is that big (the largest is {biggest.label}), "
                "and a model is served from one GPU"
            )
        else:
            why = (
                f"{biggest.label} would hold it empty, but the other models of the warm set "
                f"({', '.join(n for n in needs if n != name)}) take the room"
            )
        raise InputError(
            f"Cannot place {name}: it needs {need:.1f} GB of GPU memory and the most free on any GPU is "
            f"{room[best]:.1f} GB ({by_key[best].label}); {why}.",
            "Give it less memory (quantised weights: bits: 4, or an explicit gpu_gb:), take it out of the "
            "warm set (--out, or a smaller warm:), or let the orchestra use more GPUs (hosts: / gpus: in "
            "the orchestra file).",
        )
    raise InputError(
        f"Cannot place {', '.join(names)} together on the orchestra's GPUs.",
        "Lower warm:, or give the models less memory (bits:, gpu_gb:).",
    )


# Seed 000 §2.7's model_capacity, beside which the capacity view is printed:
# (label, billions of parameters, bits per weight, the seed's low and high figure).
SEED_CLAIMS: list[tuple[str, float, float, int, int]] = [
    ("7B fp16", 7.0, 16.0, 15, 20),
    ("13B fp16", 13.0, 16.0, 8, 10),
    ("70B 4-bit", 70.0, 4.0, 1, 2),
]


@dataclass
class CapacityRow:
    label: str
    need_gb: float  # on one GPU
    count: int  # models held at once
    whole: list[tuple[str, int]]  # (GPU label, models on it) for GPUs that hold it alone
    split: list[str]  # "2x Tesla P40 on m5 (tensor parallel), 2 models"
    seed: str  # the seed's claim, e.g. "15-20"
    seed_low: int
    seed_high: int
    note: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.label,
            "need_gb": round(self.need_gb, 2),
            "count": self.count,
            "whole": [{"gpu": g, "models": n} for g, n in self.whole],
            "split": list(self.split),
            "seed": self.seed,
            "note": self.note,
        }


def capacity(gpus: Sequence[Gpu], overhead: Overhead) -> list[CapacityRow]:
    """How many 7B fp16, 13B fp16 and 70B 4-bit models `gpus` hold at once, beside seed 000.

    Models are packed several per GPU where memory allows; a model bigger than a GPU is split
    (tensor parallel, each shard carrying its own CUDA context) over the fewest identical GPUs
    of one host that hold it. The note says honestly how the count compares with the seed's.
    """
    total = sum(g.memory_gb for g in gpus)
    out: list[CapacityRow] = []
    for label, params_b, bits, low, high in SEED_CLAIMS:
        weights = params_b * bits / 8
        need = weights * (1 + overhead.fraction) + overhead.context_gb
        whole: list[tuple[str, int]] = []
        groups: dict[tuple[str, str, float], int] = {}
        for g in gpus:
            n = math.floor((g.memory_gb + EPS) / need)
            if n:
                whole.append((g.label, n))
            else:
                groups[(g.host, g.model, g.memory_gb)] = groups.get((g.host, g.model, g.memory_gb), 0) + 1
        count = sum(n for _, n in whole)
        split: list[str] = []
        for (host, model, memory), size in groups.items():
            for k in range(2, size + 1):
                if weights * (1 + overhead.fraction) / k + overhead.context_gb <= memory + EPS:
                    held = size // k
                    count += held
                    split.append(
                        f"{k}x {model} on {host} (tensor parallel): {held} model{'s' if held != 1 else ''}"
                    )
                    break
        seed = f"{low}-{high}"
        verdict = "within" if low <= count <= high else ("below" if count < low else "above")
        note = (
            f"{count} is {verdict} the lab's plan of {seed}: here a {label} needs {need:.1f} GB "
            f"({weights:g} GB of weights + {overhead.fraction:.0%} for KV cache and activations + "
            f"{overhead.context_gb:g} GB of CUDA context)"
        )
        if count < low and total > 0:
            each = total / low
            note += f"; {low} in the {total:g} GB of these GPUs would mean {each:.1f} GB each" + (
                f", less than its weights alone ({weights:g} GB)" if each < weights else ""
            )
        out.append(CapacityRow(label, need, count, whole, split, seed, low, high, note))
    return out
