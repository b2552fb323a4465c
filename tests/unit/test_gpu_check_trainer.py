"""The GPU check's trainer section (bench/gpucheck/trainer.py): the parts that decide its figures.

The section itself needs torchrun and, for its real figures, a card; what is held here is how
it reads tokens/s from rank 0's events, sums up NVML's samples, names NCCL's refusal, sizes the
time limit so the run pauses mid-way, and turns the trainer's settings into `--set` arguments
that reach the trainer unchanged.
"""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from bench.gpucheck import trainer as sec
from labctl.agent.train.limit import checkpoint_estimate, should_stop
from labctl.train.phases import load_phases

REPO = Path(__file__).resolve().parents[2]


def step(n: int, rate: float) -> dict[str, Any]:
    return {"event": "step", "step": n, "tokens_per_s": rate, "loss": 5.0}


def test_steady_tokens_per_s_leaves_out_the_first_interval_and_earlier_starts() -> None:
    events = [
        {"event": "start"},
        step(10, 1.0),  # a worker group that was restarted: not this run's rate
        {"event": "start"},
        step(10, 100.0),  # CUDA's start-up and the first kernels' tuning
        step(20, 1000.0),
        step(30, 1200.0),
        step(40, 1100.0),
        {"event": "checkpoint", "step": 40},
        {"event": "done", "step": 40},
    ]
    assert sec.steady_tokens_per_s(events) == 1100.0
    assert sec.steady_tokens_per_s([{"event": "start"}, step(5, 42.0)]) == 42.0
    assert sec.steady_tokens_per_s([{"event": "start"}]) is None


def test_gpu_summary_means_cover_the_busy_window_only() -> None:
    idle = {"util_pct": 0, "mem_mib": 500.0, "power_w": 70.0}
    busy = {"util_pct": 90, "mem_mib": 20000.0, "power_w": 500.0}
    rows = [idle, idle, busy, dict(busy, util_pct=100, power_w=600.0), idle]
    samples = [dict(r, t=0.5 * i) for i, r in enumerate(rows)]
    out = sec.summarise_gpu(samples)
    assert out["samples"] == 5 and out["busy_samples"] == 2 and out["seconds"] == 2.0
    assert out["util_max_pct"] == 100 and out["util_mean_busy_pct"] == 95.0 and out["util_mean_pct"] == 38.0
    assert out["mem_max_mib"] == 20000.0 and out["power_max_w"] == 600.0 and out["power_mean_busy_w"] == 550.0
    # A driver that does not report power: the other figures still come.
    no_power = sec.summarise_gpu([dict(s, power_w=None) for s in samples])
    assert no_power["power_max_w"] is None and no_power["util_max_pct"] == 100
    assert sec.summarise_gpu([]) == {"samples": 0}


NCCL_OUTPUT = """\
[rank1]:h100:123:456 [0] init.cc:1000 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000
[rank0]:Traceback (most recent call last):
[rank0]:torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1234, invalid usage
[rank0]:Last error:
[rank0]:Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 1a000
[rank0]:labctl trainer (rank 0): error: DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1234
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""


def test_refusal_line_names_nccls_reason_else_the_trainers_error() -> None:
    assert sec.refusal_line(NCCL_OUTPUT).endswith(
        "NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000"
    )
    own = "Traceback...\nlabctl trainer (rank 1): error: local rank 1 has no GPU: torch sees 1\nChildFailedError:\n"
    assert sec.refusal_line(own) == "labctl trainer (rank 1): error: local rank 1 has no GPU: torch sees 1"
    assert sec.refusal_line("something\nlast words\n") == "last words"
    assert sec.refusal_line("") == "no output"


def test_a_refused_preflight_is_told_by_its_problems() -> None:
    said = (
        "Preflight found 2 problems; nothing was launched:\n"
        "  here: no GPU matching ['Tesla V100'] to train on. Fix: choose hosts with such GPUs.\n"
        "  here: torch 2.11.0 at /usr/bin/python3 is a CPU build. Fix: install a CUDA build."
    )
    assert sec.preflight_problems(said) == (
        "here: no GPU matching ['Tesla V100'] to train on. Fix: choose hosts with such GPUs. | "
        "here: torch 2.11.0 at /usr/bin/python3 is a CPU build. Fix: install a CUDA build."
    )
    assert sec.preflight_problems("No phase 1 in x.yaml.\nPhases there: 2.") == "No phase 1 in x.yaml."


@pytest.mark.parametrize("startup, window", [(8.0, 10.0), (25.0, 10.0), (6.0, 8.0)])
def test_the_time_limit_leaves_the_window_to_train_and_then_pauses(startup: float, window: float) -> None:
    shape = sec.GPU_SHAPES["limited"]
    limit = sec.time_limit_s(startup, window, shape.state_bytes())
    estimate = checkpoint_estimate([], shape.state_bytes())
    step_s = 0.05
    # The trainer's own decision: it trains through the window, and stops before the limit.
    assert not should_stop(startup + window - 0.5, step_s, estimate, limit)
    assert should_stop(limit - 1.0, step_s, estimate, limit)


def test_state_bytes_is_what_the_trainer_estimates_a_checkpoint_from() -> None:
    torch = pytest.importorskip("torch")
    from labctl.agent.models.tinylm import build_model

    shape = sec.SMOKE_SHAPES["limited"]
    settings = shape.settings()
    from labctl.agent.train.settings import resolve_settings

    model = build_model(resolve_settings(settings)["model_config"], device=torch.device("cpu"))
    params = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    assert shape.state_bytes() == params * 3


def test_set_arguments_reach_the_trainer_unchanged() -> None:
    settings = dict(
        sec.GPU_SHAPES["throughput"].settings(),
        mixed_precision=True,
        checkpoint_dir="/tmp/gpucheck/work/trainer/ckpt-amp",
        lr=1e-05,  # PyYAML reads "1e-05" as text: it must travel as 1.0e-05
    )
    args = sec.cli_sets(settings)
    assert args[::2] == ["--set"] * (len(args) // 2)
    phase = load_phases(REPO / "playbooks" / "train.yaml").settings(1, args[1::2])
    got = phase.trainer_settings(1, "r", "/m.jsonl")
    for key, value in settings.items():
        assert got[key] == value, key


def test_the_sampler_samples_until_stopped_and_gives_up_on_a_broken_query() -> None:
    n = iter(range(1000))
    sampler = sec.Sampler(lambda: {"util_pct": next(n)}, every=0.01).start()
    time.sleep(0.2)
    samples = sampler.stop()
    assert len(samples) >= 3 and [s["util_pct"] for s in samples] == list(range(len(samples)))
    assert all(isinstance(s["t"], float) for s in samples)
    count = len(samples)
    time.sleep(0.05)
    assert len(sampler.samples) == count  # stopped means stopped

    def broken() -> dict[str, Any]:
        raise RuntimeError("GPU is lost")

    bad = sec.Sampler(broken, every=0.001).start()
    bad._thread.join(timeout=5)
    assert not bad._thread.is_alive() and bad.errors == ["RuntimeError: GPU is lost"] * 5
    assert bad.stop() == []


def fake_pynvml(power: bool = True, init_error: str | None = None) -> types.ModuleType:
    nv = types.ModuleType("pynvml")

    def init() -> None:
        if init_error:
            raise RuntimeError(init_error)

    def power_usage(h: Any) -> int:
        if not power:
            raise RuntimeError("Not Supported")
        return 512_345  # milliwatts

    nv.nvmlInit = init  # type: ignore[attr-defined]
    nv.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    nv.nvmlDeviceGetCount = lambda: 1  # type: ignore[attr-defined]
    nv.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)  # type: ignore[attr-defined]
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"  # type: ignore[attr-defined]
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=97, memory=40)  # type: ignore[attr-defined]
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=3 * 2**30, total=80 * 2**30)  # type: ignore[attr-defined]
    nv.nvmlDeviceGetPowerUsage = power_usage  # type: ignore[attr-defined]
    return nv


def test_nvml_reads_gpu_0s_utilisation_memory_and_power(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    nvml = sec.Nvml()
    assert nvml.ok and nvml.name == "NVIDIA H100 80GB HBM3" and nvml.count == 1
    assert nvml.query() == {"util_pct": 97, "mem_mib": 3072.0, "power_w": 512.3}
    nvml.close()
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(power=False))
    assert sec.Nvml().query()["power_w"] is None


def test_nvml_says_why_it_cannot_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error="NVML Shared Library Not Found"))
    nvml = sec.Nvml()
    assert not nvml.ok and nvml.why == "NVML init failed: RuntimeError: NVML Shared Library Not Found"
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert not sec.Nvml().ok and "not importable" in str(sec.Nvml().why)
