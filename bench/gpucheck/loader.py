"""Loader: a real 4 GB safetensors checkpoint onto the GPU, labctl's loader against its peers.

Every method reads the same file from the page cache (it was just written, and the first
untimed call of each method leaves it there), so the figures compare what each does between
host memory and the card, not the disk. The ceiling is the pinned host-to-device copy of the
same number of bytes measured in the same run, as the issue defines it:
`torch.empty(n, pin_memory=True)` then `.cuda(non_blocking=True)`.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from .base import CheckEnv, Section, fmt

TITLE = "Loader: a 4 GB safetensors checkpoint to the GPU"
PLAN = [
    "write a 4 GB tinylm safetensors checkpoint with `labctl bench make-model` (and a torch.save copy of it)",
    "time, medians of 5: the pinned host-to-device copy ceiling (torch.empty(pin_memory=True) -> .cuda(non_blocking=True)),"
    " labctl's loader (default 4 readers, and 8 and 16), safetensors load_file(device='cuda'), torch.load(map_location='cuda')",
    "check labctl's tensors are bit-identical to safetensors'",
    "goals: labctl >= 90% of pinned H2D, >= 2x safetensors to CUDA",
    "`labctl bench model-load --file ... --device cuda`: every stage of the CLI's own measurement, warm-up and forward included",
]

GB = 1e9
REPS = 5
READER_VARIANTS = (8, 16)  # beside the default: whether more readers would reach the ceiling


def _sync(torch: Any) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(torch: Any, fn: Any, reps: int) -> tuple[float, list[float]]:
    """Median seconds of `fn` (its result dropped before the next call, so memory is reused)."""
    fn()  # untimed: faults the page cache in, warms allocators and pinned caches
    _sync(torch)
    times = []
    for _ in range(reps):
        _sync(torch)
        t0 = time.perf_counter()
        out = fn()
        _sync(torch)
        times.append(time.perf_counter() - t0)
        del out
    return statistics.median(times), times


def _pinned_ceiling(torch: Any, nbytes: int, cuda: bool, reps: int) -> tuple[float, list[float]]:
    """The copy the issue names as the ceiling, for the file's byte count (freed on return)."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    src.fill_(7)
    return _timed(torch, lambda: src.cuda(non_blocking=True) if cuda else src.clone(), reps)


def run(env: CheckEnv) -> Section:
    import torch
    from safetensors.torch import load_file as st_load

    from labctl.agent.loader import load_model_dir, model_files, release_pinned

    sec = Section("loader", TITLE)
    size_gb = 0.1 if env.smoke else 4.0
    name = "gpucheck-4g" if not env.smoke else "gpucheck-smoke"
    path = env.work / "models" / name
    if not path.exists():
        env.labctl(
            "bench", "make-model", "--host", env.host, "--name", name, "--size-gb", str(size_gb), timeout=600
        )
    files = model_files(str(path))
    nbytes = sum(os.path.getsize(f) for f in files)
    sec.figures["checkpoint"] = {"path": str(path), "files": len(files), "bytes": nbytes}
    device = env.device
    reps = 2 if env.smoke else REPS

    # The ceiling: exactly the copy the issue names, the same byte count as the file's.
    ceiling_s, ceiling_all = _pinned_ceiling(torch, nbytes, env.cuda, reps)

    def labctl_load(readers: int) -> Any:
        return lambda: load_model_dir(str(path), device=device, readers=readers)

    def st() -> Any:
        out: dict[str, Any] = {}
        for f in files:
            out.update(st_load(f, device=device))
        return out

    pt_path = env.work / f"{name}.pt"
    if not pt_path.exists():
        torch.save(st(), str(pt_path))

    def tl() -> Any:
        return torch.load(str(pt_path), map_location=device, weights_only=True)

    methods: dict[str, tuple[float, list[float]]] = {"pinned_h2d_ceiling": (ceiling_s, ceiling_all)}
    default_readers = 4  # load_file's default; the orchestra's server and bench model-load use it
    methods["labctl_loader"] = _timed(torch, labctl_load(default_readers), reps)
    for n in READER_VARIANTS:
        methods[f"labctl_loader_{n}_readers"] = _timed(torch, labctl_load(n), reps)
    methods["safetensors_load_file"] = _timed(torch, st, reps)
    methods["torch_load"] = _timed(torch, tl, reps)
    release_pinned()

    # Bit for bit: the loader's tensors are what safetensors gives.
    ours, theirs = load_model_dir(str(path), device=device), st()
    same = ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    del ours, theirs
    _sync(torch)
    if env.cuda:
        torch.cuda.empty_cache()

    gbps = {k: nbytes / s / GB for k, (s, _) in methods.items()}
    sec.figures["methods"] = {
        k: {"median_s": s, "times_s": ts, "gbps": gbps[k]} for k, (s, ts) in methods.items()
    }
    sec.figures["bit_identical_to_safetensors"] = same
    sec.figures["reps"] = reps
    ceiling = gbps["pinned_h2d_ceiling"]
    best = max(v for k, v in gbps.items() if k.startswith("labctl_loader"))
    sec.row(
        "pinned H2D ceiling (same bytes)",
        fmt(ceiling, "GB/s"),
        "torch.empty(pin_memory=True).cuda(non_blocking=True)",
    )
    for key, label in (
        ("labctl_loader", f"labctl loader ({default_readers} readers)"),
        *((f"labctl_loader_{n}_readers", f"labctl loader ({n} readers)") for n in READER_VARIANTS),
        ("safetensors_load_file", f"safetensors load_file(device={device!r})"),
        ("torch_load", f"torch.load(map_location={device!r})"),
    ):
        sec.row(
            label,
            f"{fmt(gbps[key], 'GB/s')} ({fmt(methods[key][0], 's', 3)})",
            f"{gbps[key] / ceiling * 100:.0f}% of ceiling",
        )
    sec.row("labctl tensors == safetensors tensors", "yes" if same else "NO", "every tensor, torch.equal")
    sec.goal(
        "labctl loader / pinned H2D",
        gbps["labctl_loader"] / ceiling,
        0.9,
        "x",
        "at least 90% of the pinned copy",
    )
    sec.goal(
        "labctl loader / safetensors to CUDA",
        gbps["labctl_loader"] / gbps["safetensors_load_file"],
        2.0,
        "x",
        "at least 2x safetensors' load_file(device='cuda')",
    )
    sec.figures["best_labctl_gbps"] = best
    if not same:
        sec.error = "labctl's loader returned tensors that differ from safetensors'"

    # The CLI's own measurement of the same file: every stage, warm-up and forward included.
    _, doc, _ = env.labctl(
        "bench",
        "model-load",
        "--file",
        str(path),
        "--device",
        "cuda:0" if env.cuda else "cpu",
        "--python",
        env.python,
        timeout=600,
    )
    stages = {s["name"]: s for s in (doc or {}).get("stages", [])}
    sec.figures["bench_model_load"] = doc
    for stage in ("ram_cache", "cuda_init", "h2d", "warmup", "forward"):
        s = stages.get(stage) or {}
        if s.get("skipped"):
            sec.skip(f"bench model-load {stage}", str(s["skipped"]))
            continue
        figure = fmt(s.get("seconds"), "s", 3)
        if s.get("gbps") is not None:
            figure += f", {fmt(s.get('gbps'), 'GB/s')}"
        against = []
        if s.get("ceiling_gbps"):
            against.append(
                f"{fmt(s.get('pct_of_ceiling'), '', 0)}% of {fmt(s['ceiling_gbps'], 'GB/s')} ({s.get('ceiling')})"
            )
        if s.get("seed_seconds") is not None:
            against.append(f"seed, scaled to this size: {fmt(s['seed_seconds'], 's', 3)}")
        sec.row(f"bench model-load: {stage}", figure, "; ".join(against))
    return sec
