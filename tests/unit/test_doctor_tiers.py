"""The scale tiers: each figure said in words, judged per node from what hosts report."""

from __future__ import annotations

from pathlib import Path

from labctl.doctor.tiers import TIERS, NodeHas, check_tier

SEED = Path("/work/shared/seeds")


def node(name: str, gpus: list[float], cores: int, ram: float, tb: float, mbps: int | None) -> NodeHas:
    return NodeHas(name, gpus, cores, ram, tb, mbps)


def failing(nodes: list[NodeHas], tier: str) -> set[str]:
    return {n.what for n in check_tier(nodes, TIERS[tier]) if not n.met}


def test_every_tier_says_in_words_which_node_its_hardware_storage_and_network_describe() -> None:
    # Users have no seed documents: the words say what the figure is, not where it was read.
    for t in TIERS.values():
        for text in (t.section, t.storage_section, t.network_section):
            assert "node" in text and "seed" not in text and "§" not in text, text
        assert " TB" in t.storage_section and "bps" in t.network_section


def test_the_seed_lab_reaches_dev_on_m5_but_not_research() -> None:
    m5 = node("m5", [31.7, 22.4, 22.4, 22.4, 22.4], 28, 251.0, 8.0, 2000)
    pharaoh = node("pharaoh", [3.9], 4, 31.2, 3.7, 1000)
    assert failing([m5, pharaoh], "dev") == set()
    assert failing([m5, pharaoh], "research") == {"GPUs", "CPU cores", "RAM", "network"}


def test_a_single_node_tier_needs_one_host_with_every_gpu_not_gpus_spread_over_hosts() -> None:
    hosts = [node(n, [80.0, 80.0], 64, 600.0, 5.0, 25000) for n in ("a", "b")]
    assert failing(hosts, "research") == {"GPUs"}
    hosts.append(node("c", [80.0] * 4, 64, 600.0, 5.0, 25000))
    assert failing(hosts, "research") == set()


def test_production_needs_four_such_nodes_and_says_how_many_have_it() -> None:
    big = [node(f"n{i}", [80.0] * 8, 128, 2048.0, 8.0, 200000) for i in range(3)]
    needs = {n.what: n for n in check_tier(big, TIERS["prod"])}
    assert {k for k, n in needs.items() if not n.met} == set(needs)
    assert "on each of 4 hosts (3 have it)" in needs["GPUs"].wanted
    big.append(node("n3", [80.0] * 8, 128, 2048.0, 8.0, 200000))
    assert failing(big, "prod") == set()


def test_reported_sizes_just_under_the_marketed_figure_count_as_met() -> None:
    # A "24GB" card reports about 22.5 GiB and a "64GB" box about 62.8 GiB.
    assert failing([node("a", [22.4], 16, 62.8, 1.0, 1000)], "dev") == set()
    assert failing([node("a", [15.9], 16, 62.8, 1.0, None)], "dev") == {"GPUs", "network"}
