"""The arithmetic of bench model-load: rates, ceilings, the seed's scaled figures, the speedup."""

from __future__ import annotations

import pytest

from labctl.modelload.stages import attach_seed, link_gbps, make_stage, seed_scaled, speedup_ram_vs_network


def test_stage_rate_and_share_of_ceiling() -> None:
    s = make_stage("ram_cache", {"bytes": 4_000_000_000, "seconds": 2.0}, 10.0, "memcpy")
    assert s.gbps == pytest.approx(2.0) and s.pct_of_ceiling == pytest.approx(20.0) and s.ceiling == "memcpy"
    timed_only = make_stage("warmup", {"seconds": 3.5})
    assert timed_only.seconds == 3.5 and timed_only.gbps is None and timed_only.pct_of_ceiling is None
    skipped = make_stage("h2d", {"skipped": "no GPU on this host"}, 25.0)
    assert skipped.skipped == "no GPU on this host" and skipped.seconds is None


def test_seed_figures_scale_with_size() -> None:
    half = seed_scaled(24_000_000_000)
    assert half["network_1g"] == pytest.approx(192.0) and half["network_bonded"] == pytest.approx(96.0)
    assert half["warmup"] == pytest.approx(20.0)
    stages = [
        make_stage("network", {"bytes": 1, "seconds": 1}),
        make_stage("h2d", {"bytes": 1, "seconds": 1}),
    ]
    attach_seed(stages, 48_000_000_000, bonded=True)
    assert stages[0].seed_seconds == 192.0 and stages[1].seed_seconds == 5.0


def test_speedup_is_network_over_the_ram_path() -> None:
    stages = [
        make_stage("network", {"bytes": 10, "seconds": 80.0}),
        make_stage("ram_cache", {"bytes": 10, "seconds": 2.0}),
        make_stage("h2d", {"bytes": 10, "seconds": 2.0}),
        make_stage("warmup", {"seconds": 30.0}),
    ]
    assert speedup_ram_vs_network(stages) == pytest.approx(20.0)
    cpu_only = [stages[0], stages[1], make_stage("h2d", {"skipped": "no GPU"})]
    assert speedup_ram_vs_network(cpu_only) == pytest.approx(40.0)
    assert speedup_ram_vs_network([make_stage("network", {"skipped": "--file"})]) is None


def test_link_rate_prefers_an_active_bond() -> None:
    facts = {"nics": [{"name": "bond0", "is_bond": True, "operstate": "up", "speed_mbps": 2000}]}
    assert link_gbps(facts, [1000]) == (0.25, "bond bond0 2000 Mb/s")
    down = {"nics": [{"name": "bond0", "is_bond": True, "operstate": "down", "speed_mbps": 2000}]}
    rate, why = link_gbps(down, [1000])
    assert rate == 0.125 and "no bond up" in why
    assert link_gbps(None, []) == (None, "link rate unknown")
