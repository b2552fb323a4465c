"""What labctl knows about GPUs and torch builds, as pure data and functions.

Recent CUDA builds of torch dropped old GPUs (the seed lab mixes Pascal P40/P4/P1000, a
Volta V100 and an Ampere RTX 3050), so which build runs where is decided from compute
capabilities: the `torch_env` resource picks a build, the train preflight checks the
installed one, and GPU placement reads the same tables. Nothing here touches a host; the
GPUs a host reports (labctl/agent/core/gpus.py) win over these tables wherever both exist.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

# What a torch build's arch list runs on is read the same way on the hosts (labctl's model
# server refuses a card before loading) and here: one reading, in the agent's stdlib module.
from labctl.agent.core.gpus import supports

if TYPE_CHECKING:
    from labctl.inventory.model import Host

Cap = tuple[int, int]

# Architectures in PyTorch's Linux x86 wheels, from its RELEASE.md support matrix and
# .ci/manywheel/build_cuda.sh. A cubin for sm_X.Y runs on X.Z with Z >= Y; PTX (compute_)
# is JIT-compiled for anything newer.
ARCHS_LEGACY = [(5, 0), (6, 0), (7, 0), (7, 5), (8, 0), (8, 6), (9, 0)]
ARCHS_CU128_EARLY = [(7, 0), (7, 5), (8, 0), (8, 6), (9, 0), (10, 0), (12, 0)]  # torch 2.7-2.9
ARCHS_MODERN = [(7, 5), (8, 0), (8, 6), (9, 0), (10, 0), (12, 0)]  # cu128 from 2.10, cu130

# Compute capability of GPUs named in inventories without one (lower-case substrings).
KNOWN_CAPS: dict[str, Cap] = {
    "p1000": (6, 1), "p40": (6, 1), "p4": (6, 1), "p100": (6, 0), "gtx 10": (6, 1),
    "v100": (7, 0), "titan v": (7, 0), "t4": (7, 5), "rtx 20": (7, 5), "a100": (8, 0),
    "rtx 30": (8, 6), "a10": (8, 6), "a40": (8, 6), "rtx 40": (8, 9), "l4": (8, 9), "l40": (8, 9),
    "h100": (9, 0), "h200": (9, 0), "b200": (10, 0), "rtx 50": (12, 0),
}  # fmt: skip

CUDA_VARIANTS = ("cu130", "cu128", "cu126", "cu124", "cu121", "cu118")  # newest first


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def build_archs(version: str, variant: str) -> tuple[list[Cap], bool] | None:
    """(architectures, has PTX) of torch `version` built for `variant`; None if no such build."""
    v = version_tuple(version)
    if variant in ("cu118", "cu121", "cu124"):
        return (ARCHS_LEGACY, False) if v < (2, 7) else None
    if variant == "cu126":
        return (ARCHS_LEGACY, False) if v >= (2, 6) else None
    if variant == "cu128":
        if v < (2, 7):
            return None
        return (ARCHS_CU128_EARLY, False) if v < (2, 10) else (ARCHS_MODERN, False)
    if variant == "cu130":
        return (ARCHS_MODERN, True) if v >= (2, 9) else None
    return None


def variants_for(version: str) -> list[str]:
    """CUDA builds of `version`, newest first."""
    return [x for x in CUDA_VARIANTS if build_archs(version, x)]


def builds_for(version: str, caps: Iterable[Cap]) -> list[str]:
    """CUDA builds of torch `version` that run on every one of `caps`, newest first."""
    wanted = list(caps)
    out = []
    for variant in variants_for(version):
        archs, ptx = build_archs(version, variant) or ([], False)
        if all(supports(archs, ptx, c) for c in wanted):
            out.append(variant)
    return out


def parse_cap(text: str) -> Cap:
    major, _, minor = text.strip().partition(".")
    return int(major), int(minor or 0)


def fmt_cap(cap: Cap | None) -> str:
    return f"sm_{cap[0]}{cap[1]}" if cap else "sm_?"


def known_cap(name: str) -> Cap | None:
    """The compute capability of a GPU named `name`, from KNOWN_CAPS (longest match wins)."""
    lower = name.lower()
    found = [c for key, c in sorted(KNOWN_CAPS.items(), key=lambda kv: -len(kv[0])) if key in lower]
    return found[0] if found else None


def declared_gpus(host: Host) -> list[tuple[str, Cap | None, float]]:
    """One (model, capability, memory GB) per GPU the inventory declares on `host`, in the
    inventory's order with `count` expanded; the capability is None where unknown."""
    out: list[tuple[str, Cap | None, float]] = []
    for g in host.gpus:
        cap = parse_cap(g.compute_capability) if g.compute_capability else known_cap(g.model)
        out += [(g.model, cap, g.memory_gb)] * g.count
    return out


def declared_caps(host: Host) -> list[tuple[str, Cap | None]]:
    """One (model, capability) per GPU the inventory declares on `host`; None where unknown."""
    return [(name, cap) for name, cap, _ in declared_gpus(host)]
