"""Compare what the inventory declares about a host with the facts its agent reported.

Runs on the controller. Every mismatch becomes one sentence a person can act on; a section
the agent could not gather yields "could not be compared", never a false mismatch.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

GIB = 1024**3
GPU_MEMORY_TOLERANCE = 0.10
# /proc/meminfo's MemTotal excludes firmware and kernel reservations, so a host shows less
# than its installed RAM; more than declared is only allowed the base tolerance.
RAM_TOLERANCE_OVER = 0.05
RAM_TOLERANCE_UNDER = 0.08
RAM_TOLERANCE_ABS_GB = 1.0


def section_error(facts: dict[str, Any], name: str) -> str | None:
    """Why section `name` of `facts.collect` cannot be used, or None when it can."""
    if not isinstance(facts, dict):
        return "no facts"
    if "error" in facts and name not in facts:
        return str(facts["error"])
    if name not in facts:
        return f"the facts have no {name!r} section"
    value = facts[name]
    if isinstance(value, dict) and "error" in value:
        return str(value["error"])
    return None


def _normalize(name: str) -> str:
    return " ".join(name.lower().split())


def model_matches(declared: str, found: str) -> bool:
    """Either name contains the other as whole words, case-insensitively.

    Whole words so that "Tesla P4" does not match "Tesla P40" (both are in the seed lab).
    """
    a, b = _normalize(declared), _normalize(found)
    if not a or not b:
        return False

    def within(needle: str, haystack: str) -> bool:
        return re.search(r"(?<![a-z0-9])" + re.escape(needle) + r"(?![a-z0-9])", haystack) is not None

    return within(a, b) or within(b, a)


def _gb(value_bytes: int | None) -> float | None:
    return None if value_bytes is None else value_bytes / GIB


def _fmt_gb(value: float | None) -> str:
    if value is None:
        return "unknown"
    return f"{value:.0f} GiB" if abs(value - round(value)) < 0.05 else f"{value:.1f} GiB"


@dataclass
class _Declared:
    model: str
    memory_gb: float | None
    count: int
    found: list[dict[str, Any]] = field(default_factory=list)

    def label(self) -> str:
        memory = f" ({_fmt_gb(self.memory_gb)})" if self.memory_gb is not None else ""
        return f"{self.count}x {self.model}{memory}"


def _declared_entries(declared_gpus: list[dict[str, Any]]) -> list[_Declared]:
    entries = []
    for item in declared_gpus:
        memory = item.get("memory_gb")
        entries.append(
            _Declared(
                model=str(item["model"]),
                memory_gb=float(memory) if memory is not None else None,
                count=int(item.get("count", 1)),
            )
        )
    return entries


def _memory_distance(gpu: dict[str, Any], memory_gb: float | None) -> float:
    found = _gb(gpu.get("memory_total_bytes"))
    if memory_gb is None or found is None:
        return 0.0
    return abs(found - memory_gb)


def _assign(entries: list[_Declared], gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give each declared entry the found GPUs that match it; return the GPUs nobody claimed.

    Longer (more specific) model names choose first, each takes up to its count preferring
    GPUs whose memory is closest to what it declares; a matching GPU left over after that is
    surplus of the first entry it matches, so "5 found, 4 declared" reads as a count mismatch
    rather than as an undeclared GPU.
    """
    unclaimed = list(gpus)
    for entry in sorted(entries, key=lambda e: -len(_normalize(e.model))):
        candidates = [g for g in unclaimed if model_matches(entry.model, str(g.get("name") or ""))]
        candidates.sort(key=lambda g: _memory_distance(g, entry.memory_gb))
        for gpu in candidates[: entry.count]:
            entry.found.append(gpu)
            unclaimed.remove(gpu)
    leftover = []
    for gpu in unclaimed:
        owner = next(
            (
                e
                for e in sorted(entries, key=lambda e: -len(_normalize(e.model)))
                if model_matches(e.model, str(gpu.get("name") or ""))
            ),
            None,
        )
        if owner is None:
            leftover.append(gpu)
        else:
            owner.found.append(gpu)
    return leftover


def _gpu_messages(declared_gpus: list[dict[str, Any]], facts: dict[str, Any]) -> list[str]:
    error = section_error(facts, "gpus")
    if error is not None:
        if not declared_gpus:
            return []
        return [f"GPUs could not be compared: {error}"]
    gpus = [g for g in facts["gpus"] if isinstance(g, dict)]
    entries = _declared_entries(declared_gpus)
    undeclared = _assign(entries, gpus)
    no_driver = facts.get("gpu_source") == "none"
    messages = []
    for entry in entries:
        found = len(entry.found)
        if found != entry.count:
            names = sorted({str(g.get("name")) for g in entry.found})
            detail = f" ({', '.join(names)})" if names else ""
            if found == 0 and no_driver:
                detail = " (no NVIDIA driver tools on the host: neither pynvml nor nvidia-smi)"
            messages.append(f"declared {entry.label()}, found {found}{detail}")
        if entry.memory_gb is None:
            continue
        off = [
            g
            for g in entry.found
            if (mem := _gb(g.get("memory_total_bytes"))) is not None
            and abs(mem - entry.memory_gb) > GPU_MEMORY_TOLERANCE * entry.memory_gb
        ]
        by_memory = Counter(_fmt_gb(_gb(g.get("memory_total_bytes"))) for g in off)
        for memory, n in sorted(by_memory.items()):
            indexes = ", ".join(
                str(g.get("index")) for g in off if _fmt_gb(_gb(g.get("memory_total_bytes"))) == memory
            )
            messages.append(
                f"declared {entry.model} with {_fmt_gb(entry.memory_gb)}, "
                f"found {n} with {memory} (GPU {indexes})"
            )
    by_name = Counter((str(g.get("name")), _fmt_gb(_gb(g.get("memory_total_bytes")))) for g in undeclared)
    for (name, memory), n in sorted(by_name.items()):
        messages.append(f"found {n}x {name} ({memory}) not declared")
    return messages


def _ram_messages(declared_ram_gb: float | None, facts: dict[str, Any]) -> list[str]:
    if declared_ram_gb is None:
        return []
    error = section_error(facts, "memory")
    if error is None and not isinstance(facts["memory"].get("total_bytes"), int):
        error = "memory facts have no total_bytes"
    if error is not None:
        return [f"RAM could not be compared: {error}"]
    found = facts["memory"]["total_bytes"] / GIB
    declared = float(declared_ram_gb)
    over = found - declared > RAM_TOLERANCE_OVER * declared + RAM_TOLERANCE_ABS_GB
    under = declared - found > RAM_TOLERANCE_UNDER * declared + RAM_TOLERANCE_ABS_GB
    if over or under:
        return [f"declared {_fmt_gb(declared)} RAM, host reports {found:.1f} GiB"]
    return []


def compare_declared(
    declared_gpus: list[dict[str, Any]], declared_ram_gb: float | None, facts: dict[str, Any]
) -> list[str]:
    """Mismatches between the declared GPUs and RAM and the host's facts; [] when consistent.

    `declared_gpus` items are {"model": str, "memory_gb": number, "count": int (default 1)}.
    """
    if not isinstance(facts, dict) or ("error" in facts and "gpus" not in facts and "memory" not in facts):
        reason = facts.get("error") if isinstance(facts, dict) else "no facts"
        if not declared_gpus and declared_ram_gb is None:
            return []
        return [f"declared hardware could not be compared: facts could not be gathered ({reason})"]
    return _gpu_messages(declared_gpus, facts) + _ram_messages(declared_ram_gb, facts)
