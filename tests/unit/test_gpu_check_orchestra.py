"""The GPU check's orchestra section, pure: what it reads from `labctl orchestra plan`, `start`
and `rotate` documents (shaped as the CLI's --json writes them) and how it sets figures
against seed 000's."""

from __future__ import annotations

import json
import math
from typing import Any

from bench.gpucheck.orchestra import (
    model_timings,
    placed_on_detected,
    rotation_summary,
    seed_ratio,
    warm_ports,
)


def rotation(
    steps: list[tuple[str, str, str]], joined: list[dict[str, Any]], left: list[str]
) -> dict[str, Any]:
    return {
        "kind": "rotate",
        "plan": {
            "steps": [
                {"action": a, "model": m, "host": "here", "gpu": 0, "gpu_model": "NVIDIA H100", "mode": mode}
                for a, m, mode in steps
            ],
            "lowest_warm": 1,
        },
        "joined": joined,
        "left": [{"model": m, "host": "here", "stop": 0.5} for m in left],
        "stages": {"cache": 0.4, "start": 0.2, "load": 0.3, "warmup": 1.1, "health": 2.0, "stop": 0.5},
        "seconds": 6.1,
        "warm": {"here": [{"name": "b", "port": 41001, "pid": 7}, {"name": "c", "port": 41002, "pid": 9}]},
    }


def test_seed_ratio_is_seed_over_measured_and_stays_finite() -> None:
    assert seed_ratio(15.0, 0.5) == 30.0
    assert seed_ratio(40.0, 80.0) == 0.5  # slower than the seed: the goal (>= 1) fails
    # The server rounds its figures; a load rounded to 0 counts as 1 ms, never an infinite ratio.
    r = seed_ratio(15.0, 0.0)
    assert r is not None and math.isfinite(r) and json.dumps(r)
    assert seed_ratio(15.0, None) is None


def test_rotation_summary_keeps_the_order_and_modes_of_a_break_before_make_rotation() -> None:
    doc = rotation(
        [("stop", "a", "break-before-make"), ("start", "c", "break-before-make")],
        [{"model": "c", "load": 0.3, "warmup": 1.1}],
        ["a"],
    )
    s = rotation_summary(doc)
    assert [(x["action"], x["model"]) for x in s["steps"]] == [("stop", "a"), ("start", "c")]
    assert s["modes"] == ["break-before-make"]
    assert (s["joined"], s["left"], s["lowest_warm"], s["seconds"]) == (["c"], ["a"], 1, 6.1)


def test_model_timings_reads_the_servers_figures_and_defaults_missing_ones() -> None:
    doc = rotation(
        [("start", "c", "make-before-break"), ("stop", "a", "make-before-break")],
        [{"model": "c", "load": 0.25, "warmup": 1.5, "cache": 0.4, "cache_hit": False}, {"model": "d"}],
        ["a"],
    )
    t = model_timings(doc)
    assert t["c"]["load_s"] == 0.25 and t["c"]["warmup_s"] == 1.5 and t["c"]["cache_hit"] is False
    assert t["d"]["load_s"] == 0.0 and t["d"]["warmup_s"] == 0.0
    assert "a" not in t  # a leaving model was not loaded
    assert warm_ports(doc, "here") == {"b": 41001, "c": 41002}
    assert warm_ports(doc, "elsewhere") == {}


def test_placement_counts_only_when_every_warm_model_is_on_a_detected_gpu() -> None:
    def plan(source: str, on: list[int]) -> dict[str, Any]:
        return {
            "gpus": [{"host": "here", "index": 0, "model": "NVIDIA H100 80GB HBM3", "source": source}],
            "placement": [{"model": f"m{i}", "host": "here", "gpu": g} for i, g in enumerate(on)],
        }

    assert placed_on_detected(plan("detected", [0, 0]))
    assert not placed_on_detected(plan("declared", [0, 0]))  # NVML did not answer: the inventory's card
    assert not placed_on_detected(plan("detected", [0, 1]))  # a GPU the host did not report
    assert not placed_on_detected(plan("detected", []))  # nothing placed proves nothing
