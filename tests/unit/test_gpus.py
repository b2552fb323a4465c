"""GPU knowledge (labctl/facts/gpus.py): which torch build runs on which GPU, shared by provision and train."""

from __future__ import annotations

from labctl.agent.core.gpus import arch_caps, runs_on
from labctl.facts.gpus import build_archs, builds_for, declared_caps, known_cap
from labctl.inventory.model import GPU, Host

CU126_ARCHS = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
CU128_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


def test_arch_list_parsing_and_support() -> None:
    caps, ptx = arch_caps(["sm_75", "sm_80", "sm_90a", "compute_90"])
    assert (7, 5) in caps and (9, 0) in caps and ptx
    assert runs_on(CU126_ARCHS, (6, 1)) and runs_on(CU126_ARCHS, (7, 0))
    assert not runs_on(CU128_ARCHS, (6, 1)) and not runs_on(CU128_ARCHS, (7, 0))
    assert runs_on(["sm_80", "compute_80"], (9, 0)) and not runs_on(["sm_80"], (9, 0))
    # A build that lists nothing is taken at its word; the model server reads the list the same way.
    from labctl.agent.orchestra.backend import arch_gap

    assert runs_on([], (6, 1)) and arch_gap([], (6, 1)) is None
    for archs, cap in ((CU128_ARCHS, (6, 1)), (CU126_ARCHS, (6, 1)), (["sm_80"], (9, 0))):
        assert (arch_gap(archs, cap) is None) == runs_on(archs, cap)


def test_builds_for_the_seed_m5_keep_pascal_and_volta_only_in_cu126() -> None:
    assert builds_for("2.13.0", [(6, 1), (7, 0)]) == ["cu126"]
    assert builds_for("2.13.0", [(8, 6)]) == ["cu130", "cu128", "cu126"]
    assert builds_for("2.13.0", []) == ["cu130", "cu128", "cu126"]  # no GPU: any build runs
    # torch 2.8's cu128 still carried Volta; 2.10 dropped it.
    assert builds_for("2.8.0", [(7, 0)]) == ["cu128", "cu126"]
    assert build_archs("2.13.0", "cu124") is None and build_archs("2.5.1", "cu124") is not None


def test_declared_caps_take_the_inventorys_value_then_the_name_and_mark_unknown_gpus() -> None:
    host = Host(
        name="m5",
        address="10.0.0.1",
        gpus=[
            GPU(model="Tesla V100", memory_gb=32, compute_capability="7.0"),
            GPU(model="Tesla P40", memory_gb=24, count=2),
            GPU(model="Mystery Accelerator", memory_gb=8),
        ],
    )
    assert declared_caps(host) == [
        ("Tesla V100", (7, 0)),
        ("Tesla P40", (6, 1)),
        ("Tesla P40", (6, 1)),
        ("Mystery Accelerator", None),
    ]
    # Longest name wins: "p40" is not mistaken for "p4", "l40" not for "l4".
    assert known_cap("NVIDIA L40S") == (8, 9) and known_cap("Tesla P40") == (6, 1)
    assert known_cap("NVIDIA H200") == (9, 0) and known_cap("nothing known") is None
