"""Declared hardware (inventory) against what the agent found."""

from __future__ import annotations

from typing import Any

import pytest

from labctl.facts.compare import compare_declared, model_matches, section_error

GIB = 1024**3


def gpu(index: int, name: str, memory_gib: float) -> dict[str, Any]:
    return {"index": index, "name": name, "memory_total_bytes": int(memory_gib * GIB)}


def host(gpus: Any, ram_bytes: int = 251_630 * 1024**2, source: str = "nvidia-smi") -> dict[str, Any]:
    """Facts shaped like the agent's; 251.6 GiB is what a 256 GB box shows in MemTotal."""
    return {"gpus": gpus, "gpu_source": source, "memory": {"total_bytes": ram_bytes}}


M5_DECLARED = [
    {"model": "Tesla V100", "memory_gb": 32, "count": 1},
    {"model": "Tesla P40", "memory_gb": 24, "count": 4},
]
M5_FOUND = [gpu(0, "Tesla V100-PCIE-32GB", 32)] + [gpu(i, "Tesla P40", 24) for i in range(1, 5)]


def test_consistent_host_has_no_messages() -> None:
    assert compare_declared(M5_DECLARED, 256, host(M5_FOUND)) == []


def test_declared_gpus_missing() -> None:
    messages = compare_declared(M5_DECLARED, 256, host([gpu(0, "Tesla V100-PCIE-32GB", 32)]))
    assert messages == ["declared 4x Tesla P40 (24 GiB), found 0"]


def test_missing_gpus_on_a_host_without_nvidia_tools_say_why() -> None:
    messages = compare_declared(
        [{"model": "Tesla P4", "memory_gb": 8, "count": 2}], None, host([], source="none")
    )
    assert len(messages) == 1
    assert messages[0].startswith("declared 2x Tesla P4 (8 GiB), found 0")
    assert "nvidia-smi" in messages[0]


def test_extra_gpu_not_declared() -> None:
    found = [*M5_FOUND, gpu(5, "NVIDIA GeForce RTX 3050", 8)]
    assert compare_declared(M5_DECLARED, 256, host(found)) == [
        "found 1x NVIDIA GeForce RTX 3050 (8 GiB) not declared"
    ]


def test_count_mismatch_both_ways() -> None:
    three = M5_FOUND[:4]
    assert compare_declared(M5_DECLARED, None, host(three)) == [
        "declared 4x Tesla P40 (24 GiB), found 3 (Tesla P40)"
    ]
    five = [*M5_FOUND, gpu(5, "Tesla P40", 24)]
    # A fifth P40 is a count mismatch, not an undeclared GPU.
    assert compare_declared(M5_DECLARED, None, host(five)) == [
        "declared 4x Tesla P40 (24 GiB), found 5 (Tesla P40)"
    ]


def test_count_defaults_to_one() -> None:
    declared = [{"model": "RTX 3050", "memory_gb": 8}]
    assert compare_declared(declared, None, host([gpu(0, "NVIDIA GeForce RTX 3050", 8)])) == []
    two = [gpu(0, "NVIDIA GeForce RTX 3050", 8), gpu(1, "NVIDIA GeForce RTX 3050", 8)]
    assert compare_declared(declared, None, host(two)) == [
        "declared 1x RTX 3050 (8 GiB), found 2 (NVIDIA GeForce RTX 3050)"
    ]


@pytest.mark.parametrize(
    ("declared", "found", "expected"),
    [
        ("Tesla P40", "Tesla P40", True),
        ("Tesla P40", "NVIDIA Tesla P40", True),
        ("NVIDIA Tesla P40", "Tesla P40", True),
        ("RTX 3050", "NVIDIA GeForce RTX 3050", True),
        ("tesla v100", "Tesla V100-SXM2-32GB", True),
        ("Quadro  P1000", "Quadro P1000", True),
        ("Tesla P4", "Tesla P40", False),
        ("Tesla P40", "Tesla P4", False),
        ("RTX 3050", "NVIDIA GeForce RTX 3060", False),
        ("", "Tesla P40", False),
    ],
)
def test_model_matching(declared: str, found: str, expected: bool) -> None:
    assert model_matches(declared, found) is expected


def test_p4_and_p40_on_one_host_are_kept_apart() -> None:
    declared = [{"model": "Tesla P4", "memory_gb": 8, "count": 1}, {"model": "Tesla P40", "memory_gb": 24}]
    found = [gpu(0, "Tesla P40", 24), gpu(1, "Tesla P4", 7.5)]
    assert compare_declared(declared, None, host(found)) == []


def test_gpu_memory_beyond_ten_percent() -> None:
    found = [gpu(0, "Tesla V100-PCIE-16GB", 16)] + [gpu(i, "Tesla P40", 24) for i in range(1, 5)]
    assert compare_declared(M5_DECLARED, None, host(found)) == [
        "declared Tesla V100 with 32 GiB, found 1 with 16 GiB (GPU 0)"
    ]
    # 7.5 GiB for a declared 8 GB card is within 10%.
    assert (
        compare_declared([{"model": "Tesla P4", "memory_gb": 8}], None, host([gpu(0, "Tesla P4", 7.5)])) == []
    )


def test_same_model_different_memory_declared_separately() -> None:
    declared = [{"model": "Tesla V100", "memory_gb": 16}, {"model": "Tesla V100", "memory_gb": 32}]
    found = [gpu(0, "Tesla V100-SXM2-32GB", 32), gpu(1, "Tesla V100-SXM2-16GB", 16)]
    assert compare_declared(declared, None, host(found)) == []


@pytest.mark.parametrize(
    ("declared_gb", "found_gib", "ok"),
    [
        (256, 251.6, True),  # typical: firmware and kernel reserve a little
        (256, 237.0, True),  # 7.4% under: still within 8% + 1 GB
        (256, 128.0, False),  # half the DIMMs missing
        (256, 268.0, True),  # 4.7% over
        (256, 272.0, False),  # more than 5% + 1 GB over: the inventory is stale
        (16, 15.4, True),
        (16, 13.5, False),
        (62, 62.8, True),
    ],
)
def test_ram_tolerance(declared_gb: float, found_gib: float, ok: bool) -> None:
    messages = compare_declared([], declared_gb, host([], ram_bytes=int(found_gib * GIB)))
    if ok:
        assert messages == []
    else:
        assert messages == [f"declared {declared_gb} GiB RAM, host reports {found_gib:.1f} GiB"]


def test_ram_not_declared_is_not_checked() -> None:
    assert compare_declared([], None, host([], ram_bytes=GIB)) == []


def test_error_sections_are_not_compared() -> None:
    facts = {
        "gpus": {
            "error": "GpuQueryError: nvidia-smi exited 9: couldn't communicate",
            "kind": "GpuQueryError",
        },
        "gpu_source": "error",
        "memory": {"error": "PermissionError: /proc/meminfo", "kind": "PermissionError"},
    }
    messages = compare_declared(M5_DECLARED, 256, facts)
    assert messages == [
        "GPUs could not be compared: GpuQueryError: nvidia-smi exited 9: couldn't communicate",
        "RAM could not be compared: PermissionError: /proc/meminfo",
    ]
    assert not any("found 0" in m for m in messages)


def test_unreachable_host_gives_one_message() -> None:
    facts = {"error": "ssh: connect to host 192.168.1.10 port 22: No route to host", "kind": "unreachable"}
    messages = compare_declared(M5_DECLARED, 256, facts)
    assert len(messages) == 1
    assert "could not be compared" in messages[0] and "No route to host" in messages[0]
    assert compare_declared([], None, facts) == []


def test_missing_section_is_reported_not_guessed() -> None:
    assert compare_declared(M5_DECLARED, None, {"memory": {"total_bytes": GIB}}) == [
        "GPUs could not be compared: the facts have no 'gpus' section"
    ]
    assert section_error({"gpus": []}, "gpus") is None
