"""`labctl bench model-load` results: stages with their rates, ceilings and the seed's figures.

Pure functions over what the host measured, so the arithmetic is unit-tested without a host.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

GB = 1e9
STAGES = ["network", "storage_cold", "ram_cache", "h2d", "cuda_init", "warmup", "forward"]

# seeds/000 §12.3, for a 48 GB model: 1 Gb network 384 s, bonded 2 Gb 192 s, from M5's RAM
# cache ~1 s + PCIe 5 s + initialisation 7 s (~15 s in all), first-inference warm-up ~40 s.
SEED_BYTES = 48e9
SEED_SECONDS = {
    "network_1g": 384.0,
    "network_bonded": 192.0,
    "ram_cache": 1.0,
    "h2d": 5.0,
    "cuda_init": 7.0,
    "warmup": 40.0,
}


@dataclass
class Stage:
    name: str
    seconds: float | None = None
    bytes: int | None = None
    gbps: float | None = None
    ceiling_gbps: float | None = None
    ceiling: str | None = None
    pct_of_ceiling: float | None = None
    seed_seconds: float | None = None
    skipped: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def make_stage(
    name: str, measured: dict[str, Any] | None, ceiling_gbps: float | None = None, ceiling: str | None = None
) -> Stage:
    if not measured or measured.get("skipped"):
        return Stage(name, skipped=(measured or {}).get("skipped") or "not measured")
    seconds = float(measured["seconds"])
    nbytes = measured.get("bytes")
    gbps = nbytes / seconds / GB if nbytes and seconds > 0 else None
    pct = 100 * gbps / ceiling_gbps if gbps is not None and ceiling_gbps else None
    return Stage(
        name,
        seconds,
        nbytes,
        gbps,
        ceiling_gbps if gbps is not None else None,
        ceiling if gbps is not None else None,
        pct,
    )


def seed_scaled(nbytes: int) -> dict[str, float]:
    """The seed's stage times for a model of `nbytes` (linear in size, as the seed's own arithmetic)."""
    f = nbytes / SEED_BYTES
    return {k: v * f for k, v in SEED_SECONDS.items()}


def attach_seed(stages: list[Stage], nbytes: int, bonded: bool) -> None:
    seed = seed_scaled(nbytes)
    for s in stages:
        key = ("network_bonded" if bonded else "network_1g") if s.name == "network" else s.name
        s.seed_seconds = seed.get(key)


def speedup_ram_vs_network(stages: list[Stage]) -> float | None:
    """How much faster the RAM path (cache → host memory → GPU) is than fetching over the network."""
    by = {s.name: s for s in stages}
    net = by.get("network")
    if net is None or net.seconds is None:
        return None
    ram = sum(by[n].seconds or 0.0 for n in ("ram_cache", "h2d") if n in by and by[n].seconds is not None)
    return net.seconds / ram if ram > 0 else None


def link_gbps(facts: dict[str, Any] | None, declared_mbps: list[int]) -> tuple[float | None, str]:
    """The host's link rate in GB/s: an active bond's speed from facts, else the declared NIC speed."""
    nics = (facts or {}).get("nics")
    if isinstance(nics, list):
        for n in nics:
            if n.get("is_bond") and n.get("operstate") == "up" and n.get("speed_mbps"):
                return n["speed_mbps"] / 8000, f"bond {n['name']} {n['speed_mbps']} Mb/s"
    if declared_mbps:
        return declared_mbps[0] / 8000, f"link {declared_mbps[0]} Mb/s, no bond up"
    return None, "link rate unknown"
