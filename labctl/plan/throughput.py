"""Tokens/s per (job, GPU type): measured on the lab, written in the plan, or scaled.

Measured figures come from the controller's run records (labctl/train/runs.py): rank 0's
`start` event names the device it ran on, its `step` events carry tokens/s over every rank,
so one GPU's share is that over the world size. The newest run of a job's phase on a GPU
type wins. Where neither a run nor the plan gives a figure for a GPU type, one is scaled from
a figure on another type by GPU_TABLE, whose source the output names.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labctl.plan.spec import MAX_COUNT, MAX_RATE, MIN_RATE, Job

TABLE_SOURCE = (
    "NVIDIA datasheets, peak dense TFLOPS (FP32; FP16 on tensor cores with FP32 accumulate "
    "where the GPU has fast FP16): Tesla P4, P40, P100 PCIe, V100 SXM2, T4, A100 40GB, "
    "Quadro P1000, GeForce RTX 3050 (Ampere GA10x whitepaper)"
)
# GPU type -> (FP32, FP16 mixed precision) peak TFLOPS. Pascal GP102/GP104 (P40, P4, P1000) have
# no fast FP16: mixed precision runs at FP32 rates there at best, so both columns are FP32.
# Peaks overstate the gaps that training sees (Dell measured V100 at about 2x a P100 in FP16,
# where the peaks say 6.7x): a measured run always wins over a scaled figure.
GPU_TABLE: dict[str, tuple[float, float]] = {
    "A100": (19.5, 312.0),
    "V100": (15.7, 125.0),
    "T4": (8.1, 65.0),
    "P100": (9.3, 18.7),
    "P40": (12.0, 12.0),
    "P4": (5.5, 5.5),
    "P1000": (1.9, 1.9),
    "RTX 3050": (9.1, 18.2),
}


def gpu_key(name: str) -> str:
    """'Tesla V100-SXM2-16GB' -> 'V100'; a name the table lacks comes back as written, stripped."""
    lower = name.lower()
    for key in sorted(GPU_TABLE, key=len, reverse=True):  # P1000 before P100 before P4
        if key.lower() in lower:
            return key
    return name.strip()


@dataclass(frozen=True)
class Measured:
    tokens_per_s: float  # one GPU's share
    run_id: str
    device_name: str
    started: float


@dataclass(frozen=True)
class Rate:
    tokens_per_s: float
    source: str  # measured | given | scaled
    basis: str  # where the figure comes from, as a person reads it


def run_rate(events: list[dict[str, Any]]) -> tuple[str, float] | None:
    """(device name, one GPU's tokens/s) of one run's rank-0 events; None on CPU or with no steps.

    The first logged step is left out: it carries start-up (compilation, the first batches)."""
    start = next((e for e in events if e.get("event") == "start"), None)
    if start is None or not start.get("device_name") or start.get("device_name") == "cpu":
        return None
    rates = [r for r in (_rate(e.get("tokens_per_s")) for e in events if e.get("event") == "step") if r]
    if len(rates) > 1:
        rates = rates[1:]
    if not rates:
        return None
    world = start.get("world_size")
    world = world if isinstance(world, int) and 1 <= world <= MAX_COUNT else 1
    rate = statistics.median(rates) / world
    return (str(start["device_name"]), rate) if rate >= MIN_RATE else None


def _rate(value: object) -> float | None:
    """A step's tokens/s as the plan can use it; None for what a damaged record holds instead
    (text, NaN, 0, a figure no GPU reaches)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if MIN_RATE <= value <= MAX_RATE else None


def measured_rates(runs_root: Path) -> dict[tuple[int, str], Measured]:
    """(phase, GPU type) -> the newest recorded run's figure, from the run records under `runs_root`."""
    out: dict[tuple[int, str], Measured] = {}
    for record_path in sorted(Path(runs_root).glob("*/run.json")):
        try:
            record = json.loads(record_path.read_text())
            lines = (record_path.parent / "metrics.jsonl").read_text().splitlines()
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict):
            continue
        events = []
        for line in lines:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if isinstance(e, dict):
                events.append(e)
        found = run_rate(events)
        if found is None or not isinstance(record.get("phase"), int):
            continue
        device, rate = found
        started = record.get("started")
        m = Measured(
            rate,
            str(record.get("run_id", record_path.parent.name)),
            device,
            float(started) if isinstance(started, (int, float)) and math.isfinite(started) else 0.0,
        )
        key = (record["phase"], gpu_key(device))
        if key not in out or m.started > out[key].started:
            out[key] = m
    return out


def rate_for(job: Job, gpu: str, measured: dict[tuple[int, str], Measured]) -> Rate | None:
    """The job's tokens/s on one GPU of type `gpu`: measured, else given in the plan, else scaled
    from a measured figure on another type, else from a given one; None where none can be had."""
    want = gpu_key(gpu)
    mine = {g: m for (phase, g), m in measured.items() if job.phase is not None and phase == job.phase}
    if want in mine:
        m = mine[want]
        return Rate(m.tokens_per_s, "measured", f"labctl train run {m.run_id} on {m.device_name}")
    given = {gpu_key(g): r for g, r in job.tokens_per_s.items()}
    if want in given:
        return Rate(given[want], "given", "the plan file")
    col = 1 if job.precision == "fp16" else 0
    if want not in GPU_TABLE:
        return None
    bases = [(g, m.tokens_per_s, f"run {m.run_id} on {m.device_name}") for g, m in mine.items()]
    bases += [(g, r, f"the plan's {g} figure") for g, r in given.items()]
    for base, rate, what in bases:
        if base in GPU_TABLE:
            ratio = GPU_TABLE[want][col] / GPU_TABLE[base][col]
            return Rate(rate * ratio, "scaled", f"{what} x {ratio:.2f} ({job.precision} peak {want}/{base})")
    return None
