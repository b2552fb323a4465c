"""Facts, status, doctor and metrics through NVML on the real card, while a run trains on it.

Every figure comes from labctl's own commands (`facts.collect`, `monitor.status`, `doctor`, `metrics
--textfile`) against the one-host local lab; the card is also read straight from NVML here so
the two can be compared. A detached reference-trainer run keeps the GPU busy while `monitor.status`
and `metrics` sample it, so utilisation and power are read under load, not idle.
"""

from __future__ import annotations

import time
from typing import Any

import yaml

from .base import CheckEnv, CheckFailed, Nvml, Section, fmt

TITLE = "Facts, status, doctor, metrics through NVML"
PLAN = [
    "`labctl facts`: the card's name, compute capability (9.0 on H100/H200), memory, driver, CUDA, power; torch and NCCL",
    "the same fields read straight from NVML here, compared with what labctl reported",
    "a detached `labctl train` on the card; meanwhile `labctl status` (utilisation, memory, power, the run's step and tokens/s)"
    " and `labctl metrics --textfile` (the DCGM-named series) sampled under load",
    "`labctl doctor`: the GPU lines (declared card found, torch has kernels for its capability) pass",
]

DCGM = (
    "labctl_dcgm_fi_dev_gpu_util",
    "labctl_dcgm_fi_dev_fb_used",
    "labctl_dcgm_fi_dev_fb_free",
    "labctl_dcgm_fi_dev_gpu_temp",
    "labctl_dcgm_fi_dev_power_usage",
)


def nvml_direct() -> dict[str, Any] | None:
    """GPU 0 as NVML itself reports it (None without the bindings or a GPU)."""
    nvml = Nvml()
    try:
        if not nvml.ok:
            return None
        nv, h = nvml.pynvml, nvml.handle
        major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
        out: dict[str, Any] = {
            "name": nvml.name,
            "compute_capability": f"{major}.{minor}",
            "memory_total_bytes": int(nv.nvmlDeviceGetMemoryInfo(h).total),
        }
        try:
            out["power_limit_w"] = nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000
        except Exception as exc:
            out["power_limit_w"] = f"not supported: {exc}"
        return out
    finally:
        nvml.close()


def phases_file(env: CheckEnv, steps: int) -> str:
    """A one-phase file for a run that keeps the card busy for a while (any GPU model trains)."""
    big = not env.smoke
    doc = {
        "name": "gpucheck-load",
        "defaults": {"hosts": env.host, "gpus": [], "port": 29531, "max_restarts": 0},
        "phases": {
            1: {
                "name": "load",
                "strategy": "single_gpu_debug",
                "steps": steps,
                "seq_len": 256 if big else 32,
                "batch_size_per_gpu": 32 if big else 4,
                "model": {"vocab": 256, "d_model": 1024 if big else 32, "n_layers": 8 if big else 1,
                          "n_heads": 16 if big else 2, "d_ff": 4096 if big else 64},
                "mixed_precision": False,
                "checkpoint_dir": str(env.work / "nvml-load-ckpt"),
                "checkpoint_every": 100000,
                "log_every": 10,
                "warmup_steps": 5,
            }
        },
    }  # fmt: skip
    path = env.work / "nvml-phases.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def _gpu0(sample: dict[str, Any]) -> dict[str, Any]:
    gpus = sample.get("gpus") or []
    return gpus[0] if gpus else {}


def run(env: CheckEnv) -> Section:
    sec = Section("nvml", TITLE)

    rc, facts_doc, _ = env.labctl("facts", timeout=180)
    facts = facts_doc["results"][0]["facts"]
    gpus = facts.get("gpus") or []
    torch_facts = facts.get("torch") or {}
    sec.figures["facts"] = {"gpu_source": facts.get("gpu_source"), "gpus": gpus, "torch": torch_facts}
    direct = nvml_direct()
    sec.figures["nvml_direct"] = direct
    if gpus:
        g = gpus[0]
        sec.row("facts: card", str(g.get("name")), f"NVML here: {(direct or {}).get('name')}")
        sec.row(
            "facts: compute capability",
            str(g.get("compute_capability")),
            f"NVML here: {(direct or {}).get('compute_capability')}",
        )
        total = g.get("memory_total_bytes")
        sec.row(
            "facts: memory",
            fmt(total / 2**30 if total else None, "GiB", 1),
            f"NVML here: {fmt((direct or {}).get('memory_total_bytes', 0) / 2**30, 'GiB', 1)}",
        )
        sec.row("facts: driver / CUDA", f"{g.get('driver_version')} / {g.get('cuda_driver_version')}", "")
        sec.row(
            "facts: power (idle)",
            fmt(g.get("power_w"), "W", 1),
            f"limit {(direct or {}).get('power_limit_w')} W",
        )
        sec.row(
            "facts: torch / CUDA / NCCL",
            f"{torch_facts.get('version')} / {torch_facts.get('cuda')} / {torch_facts.get('nccl')}",
            f"arch list {' '.join(torch_facts.get('arch_list') or [])}",
        )
        agrees = direct is not None and all(
            g.get(k) == direct.get(k) for k in ("name", "compute_capability", "memory_total_bytes")
        )
        sec.figures["facts_match_nvml"] = agrees
        if not agrees:
            sec.error = f"labctl facts and NVML disagree: {g} against {direct}"
    elif env.cuda:
        sec.error = f"labctl facts found no GPU (gpu_source {facts.get('gpu_source')})"
    else:
        sec.skip("facts: GPU fields", "no GPU here (smoke run)")

    # Under load: a detached reference-trainer run, sampled by status and metrics.
    steps = 1_000_000  # stopped once sampled: the run lasts as long as the sampling needs
    _, started, _ = env.labctl(
        "train", "--phase", "1", "-f", phases_file(env, steps), "--limit", env.host,
        "--device", "cuda" if env.cuda else "cpu", "--python", env.python, "--detach", timeout=240,
    )  # fmt: skip
    samples: list[dict[str, Any]] = []
    prom_dir = env.work / "prom"
    prom_dir.mkdir(exist_ok=True)
    prom_text = ""
    try:
        deadline = time.monotonic() + (90 if not env.smoke else 60)
        while time.monotonic() < deadline:
            _, doc, _ = env.labctl("status", timeout=60, check=False)
            host = ((doc or {}).get("hosts") or [{}])[0]
            sample = host.get("sample") or {}
            runs = sample.get("runs") or []
            training = [r for r in runs if r.get("step")]
            samples.append({"gpu": _gpu0(sample), "runs": runs, "t": time.time()})
            under_load = training and (not env.cuda or (_gpu0(sample).get("utilization_pct") or 0) > 0)
            if under_load and len([s for s in samples if any(r.get("step") for r in s["runs"])]) >= 3:
                env.labctl("metrics", "--textfile", str(prom_dir), timeout=60)
                prom_text = (prom_dir / "labctl.prom").read_text()
                break
            time.sleep(2)
    finally:
        run_id = (started or {}).get("run_id")
        if run_id:
            env.labctl("train", "stop", str(run_id), timeout=120, check=False)
    sec.figures["status_samples"] = samples
    busy = [s for s in samples if any(r.get("step") for r in s["runs"])]
    if not busy:
        raise CheckFailed("labctl status never showed the detached training run at a step")
    util = [s["gpu"].get("utilization_pct") for s in busy if s["gpu"].get("utilization_pct") is not None]
    power = [s["gpu"].get("power_w") for s in busy if s["gpu"].get("power_w") is not None]
    mem = [s["gpu"].get("memory_used_bytes") for s in busy if s["gpu"].get("memory_used_bytes") is not None]
    run0 = busy[-1]["runs"][0]
    sec.figures["under_load"] = {
        "utilization_pct": util,
        "power_w": power,
        "memory_used_bytes": mem,
        "run": run0,
    }
    if env.cuda:
        sec.row(
            "status under training: GPU utilisation", f"max {max(util, default=0)}%", f"{len(util)} samples"
        )
        sec.row("status under training: power", fmt(max(power, default=None), "W", 1), "max over samples")
        sec.row(
            "status under training: GPU memory used",
            fmt(max(mem, default=0) / 2**30, "GiB", 1),
            "max over samples",
        )
    sec.row(
        "status: the run",
        f"step {run0.get('step')}, {fmt(run0.get('tokens_per_s'), 'tok/s', 0)}",
        f"loss {fmt(run0.get('loss'), '', 3)}",
    )

    # The DCGM-named series labctl exports, parsed back with prometheus-client's own parser.
    from prometheus_client.parser import text_string_to_metric_families

    series: dict[str, float] = {}
    for fam in text_string_to_metric_families(prom_text):
        for s in fam.samples:
            if s.name.startswith("labctl_dcgm_") or s.name in (
                "labctl_train_tokens_per_second",
                "labctl_host_up",
            ):
                series[s.name] = s.value
    sec.figures["metrics_series"] = series
    if env.cuda:
        missing = [n for n in DCGM if n not in series]
        sec.row(
            "metrics --textfile: DCGM series",
            f"{len([n for n in DCGM if n in series])}/{len(DCGM)} present",
            ", ".join(f"{n.removeprefix('labctl_dcgm_fi_dev_')}={series[n]:g}" for n in DCGM if n in series),
        )
        if missing:
            sec.error = (sec.error or "") + f" metrics lack {', '.join(missing)}"
    else:
        sec.skip("metrics: DCGM series", "no GPU here (smoke run)")
    sec.row("metrics: tokens/s of the run", fmt(series.get("labctl_train_tokens_per_second"), "", 0), "")

    rc, doctor, _ = env.labctl("doctor", timeout=180, check=False)
    lines = (doctor or {}).get("lines", [])
    gpu_lines = [
        ln for ln in lines if any(w in ln["check"].lower() for w in ("gpu", "torch", "driver", "cuda"))
    ]
    sec.figures["doctor"] = {"exit": rc, "summary": (doctor or {}).get("summary"), "gpu_lines": gpu_lines}
    for ln in gpu_lines:
        sec.row(f"doctor: {ln['check']}", ln["status"], ln["found"])
    failed = [ln for ln in gpu_lines if ln["status"] == "fail"]
    if failed:
        sec.error = (
            (sec.error or "") + " doctor failed: " + "; ".join(f"{x['check']}: {x['found']}" for x in failed)
        )
    return sec
