"""The scale tiers as data (seed 003): what one tier needs, each figure with what it describes.

Dev and research are single-node tiers (a development box, a research node), so one host must
hold all of a node's figures; production needs a number of such nodes. What a host has is what its facts
report (the GPUs really there, not the inventory's), so a tier is reached on hardware, not
on paper.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

GB = 1000**3
GIB = 1024**3
# /proc/meminfo's MemTotal and NVML's memory sit below the marketed size (firmware, kernel,
# ECC reservations): a "64GB" box reports about 62.8 GiB, a "24GB" GPU about 22.5 GiB.
SHORTFALL = 0.08


@dataclass(frozen=True)
class Tier:
    name: str
    title: str
    section: str  # the node the figures describe, in words (seed 003 §1.x)
    gpus: int  # per node
    gpu_memory_gb: float  # each of those GPUs
    cpu_cores: int  # physical cores per node
    ram_gb: float
    storage_tb: float  # local disks per node
    network_mbps: int  # the node's link
    nodes: int = 1
    storage_section: str = ""
    network_section: str = ""


TIERS: dict[str, Tier] = {
    "dev": Tier(
        "dev", "development (minimum)", "a development node's minimum",
        gpus=1, gpu_memory_gb=24, cpu_cores=16, ram_gb=64, storage_tb=1, network_mbps=1000,
        storage_section="a development node: a 1 TB NVMe SSD, about 200 GB of data per developer",
        network_section="a development node: 1 Gbps Ethernet",
    ),
    "research": Tier(
        "research", "research", "a research node",
        gpus=4, gpu_memory_gb=40, cpu_cores=64, ram_gb=512, storage_tb=4, network_mbps=25000,
        storage_section="a research node: a 4 TB NVMe SSD and 20 TB distributed, about 2 TB of data per setup",
        network_section="a research node: 25 Gbps+ Ethernet or InfiniBand",
    ),
    "prod": Tier(
        "prod", "production (minimum cluster)", "each node of a production cluster",
        gpus=8, gpu_memory_gb=80, cpu_cores=128, ram_gb=2048, storage_tb=8, network_mbps=200000, nodes=4,
        storage_section="a production node: 8 TB of local NVMe, about 100 TB shared by the cluster",
        network_section="a production node: 200 Gbps InfiniBand HDR",
    ),
}  # fmt: skip


@dataclass
class NodeHas:
    """What one host's facts say it has, in the units the tiers use."""

    host: str
    gpu_memory_gb: list[float]  # one per GPU found, in GB (10^9)
    cpu_cores: int | None
    ram_gb: float | None
    storage_tb: float | None
    network_mbps: int | None


@dataclass
class Need:
    what: str  # "GPUs", "CPU cores", "RAM", "storage", "network"
    wanted: str
    best: str  # the best host's figure
    section: str
    met: bool


def _enough(found: float | None, wanted: float) -> bool:
    return found is not None and found >= wanted * (1 - SHORTFALL)


def gpus_meeting(node: NodeHas, tier: Tier) -> int:
    return sum(1 for m in node.gpu_memory_gb if _enough(m, tier.gpu_memory_gb))


def node_needs(node: NodeHas, tier: Tier) -> dict[str, bool]:
    """Which of the tier's per-node figures `node` meets, by name."""
    return {
        "GPUs": gpus_meeting(node, tier) >= tier.gpus,
        "CPU cores": node.cpu_cores is not None and node.cpu_cores >= tier.cpu_cores,
        "RAM": _enough(node.ram_gb, tier.ram_gb),
        "storage": _enough(node.storage_tb, tier.storage_tb),
        "network": node.network_mbps is not None and node.network_mbps >= tier.network_mbps,
    }


def _fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "unknown"
    return f"{x:.0f} {unit}" if x >= 10 or x == int(x) else f"{x:.1f} {unit}"


def check_tier(nodes: list[NodeHas], tier: Tier) -> list[Need]:
    """Each figure of `tier` and whether the lab meets it; the best host's value beside it.

    A figure is met when `tier.nodes` hosts meet it each; "best" names the host closest to it.
    """
    out: list[Need] = []
    per_node = {n.host: node_needs(n, tier) for n in nodes}

    def need(
        what: str, wanted: str, key: str, section: str, value: Callable[[NodeHas], float | None]
    ) -> None:
        meeting = [n for n in nodes if per_node[n.host][key]]
        ranked = sorted(nodes, key=lambda n: (not per_node[n.host][key], -(value(n) or 0)))
        best = (
            ", ".join(f"{n.host}: {_describe(n, key, tier)}" for n in ranked[: max(tier.nodes, 1)])
            or "no host"
        )
        if tier.nodes > 1:
            wanted = f"{wanted} on each of {tier.nodes} hosts ({len(meeting)} have it)"
        out.append(Need(what, wanted, best, section, len(meeting) >= tier.nodes))

    need(
        "GPUs",
        f"{tier.gpus}x GPU with {tier.gpu_memory_gb:g} GB",
        "GPUs",
        tier.section,
        lambda n: gpus_meeting(n, tier) * 1000 + max(n.gpu_memory_gb, default=0),
    )
    need("CPU cores", f"{tier.cpu_cores} cores", "CPU cores", tier.section, lambda n: n.cpu_cores)
    need("RAM", f"{tier.ram_gb:g} GB", "RAM", tier.section, lambda n: n.ram_gb)
    need("storage", f"{tier.storage_tb:g} TB", "storage", tier.storage_section, lambda n: n.storage_tb)
    need("network", f"{tier.network_mbps / 1000:g} Gbit/s", "network", tier.network_section,
         lambda n: n.network_mbps)  # fmt: skip
    return out


def _describe(n: NodeHas, key: str, tier: Tier) -> str:
    if key == "GPUs":
        if not n.gpu_memory_gb:
            return "no GPU"
        return f"{gpus_meeting(n, tier)} of {len(n.gpu_memory_gb)} GPU(s) with {tier.gpu_memory_gb:g} GB"
    if key == "CPU cores":
        return f"{n.cpu_cores} cores" if n.cpu_cores is not None else "cores unknown"
    if key == "RAM":
        return _fmt(n.ram_gb, "GB")
    if key == "storage":
        return _fmt(n.storage_tb, "TB")
    return f"{n.network_mbps / 1000:g} Gbit/s" if n.network_mbps else "link speed unknown"
