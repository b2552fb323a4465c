"""plan week's tokens/s per (job, GPU): measured from the run records, else the plan's, else scaled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from labctl.plan.spec import Job
from labctl.plan.throughput import GPU_TABLE, gpu_key, measured_rates, rate_for


def write_run(
    root: Path, run_id: str, phase: int, device: str, rates: list[float], world: int = 1, started: float = 1.0
) -> None:
    """A run record as `labctl train` leaves it: run.json and rank 0's events in metrics.jsonl."""
    folder = root / run_id
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"run_id": run_id, "phase": phase, "started": started}))
    events: list[dict[str, Any]] = [
        {"event": "start", "run_id": run_id, "phase": phase, "world_size": world, "device": "cuda:0",
         "device_name": device, "host": "m5"},
    ]  # fmt: skip
    events += [
        {"event": "step", "step": 10 * (i + 1), "tokens_per_s": r, "host": "m5"} for i, r in enumerate(rates)
    ]
    events.append({"event": "done", "step": 10 * len(rates)})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def job(**kw: Any) -> Job:
    return Job.model_validate({"name": "j", "steps_left": 100, "tokens_per_step": 1000, **kw})


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("Tesla V100-SXM2-16GB", "V100"),
        ("Tesla P100-PCIE-16GB", "P100"),
        ("Tesla P40", "P40"),
        ("Tesla P4", "P4"),
        ("Quadro P1000", "P1000"),
        ("NVIDIA GeForce RTX 3050", "RTX 3050"),
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("Tesla T4", "T4"),
        ("Some New GPU ", "Some New GPU"),
    ],
)
def test_gpu_names_map_to_the_table(name: str, key: str) -> None:
    assert gpu_key(name) == key


def test_measured_is_one_gpus_share_of_the_newest_run_leaving_out_the_first_step(tmp_path: Path) -> None:
    write_run(tmp_path, "p1-old", 1, "Tesla V100-PCIE-32GB", [10.0, 1000.0, 1000.0], started=1)
    # newest: 2 GPUs, first logged step (start-up) slow and left out
    write_run(
        tmp_path, "p1-new", 1, "Tesla V100-PCIE-32GB", [5.0, 3000.0, 3200.0, 3100.0], world=2, started=2
    )
    write_run(tmp_path, "p1-cpu", 1, "cpu", [50.0, 50.0], started=3)  # a CPU run measures no GPU
    m = measured_rates(tmp_path)
    assert set(m) == {(1, "V100")}
    assert m[(1, "V100")].tokens_per_s == 1550.0 and m[(1, "V100")].run_id == "p1-new"


def test_measured_wins_over_the_plan_and_other_gpus_are_scaled_from_it(tmp_path: Path) -> None:
    write_run(tmp_path, "p2-run", 2, "Tesla V100-SXM2-16GB", [1.0, 2000.0, 2000.0])
    m = measured_rates(tmp_path)
    j = job(phase=2, tokens_per_s={"V100": 999, "T4": 700})
    v100 = rate_for(j, "V100", m)
    assert v100 is not None and (v100.source, v100.tokens_per_s) == ("measured", 2000.0)
    assert "p2-run" in v100.basis
    t4 = rate_for(j, "T4", m)
    assert t4 is not None and (t4.source, t4.tokens_per_s) == ("given", 700)
    p100 = rate_for(j, "P100", m)
    assert p100 is not None and p100.source == "scaled" and "p2-run" in p100.basis
    assert p100.tokens_per_s == pytest.approx(2000.0 * GPU_TABLE["P100"][1] / GPU_TABLE["V100"][1])


def test_another_phases_run_is_not_this_jobs_measurement(tmp_path: Path) -> None:
    write_run(tmp_path, "p3-run", 3, "Tesla V100-SXM2-16GB", [1.0, 2000.0])
    m = measured_rates(tmp_path)
    r = rate_for(job(phase=1, tokens_per_s={"P100": 500}), "V100", m)
    assert r is not None and r.source == "scaled" and "plan's P100" in r.basis


def test_fp32_jobs_scale_by_the_fp32_column() -> None:
    r = rate_for(job(precision="fp32", tokens_per_s={"P100": 930}), "V100", {})
    assert r is not None and r.tokens_per_s == pytest.approx(930 * 15.7 / 9.3)


def test_no_figure_anywhere_or_an_unknown_gpu_gives_none() -> None:
    assert rate_for(job(), "V100", {}) is None
    assert rate_for(job(tokens_per_s={"V100": 100}), "Mystery 9000", {}) is None
