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
    " labctl's loader (its default: a reader per core up to 16; and 4 or 8 readers, a 1 GB ring, 4 streams), safetensors load_file(device='cuda'), torch.load(map_location='cuda')",
    "check labctl's tensors are bit-identical to safetensors'",
    "probes, not labctl's loader: the mapped file registered with CUDA (cudaHostRegister) and copied straight to the card,"
    " whole and pipelined in chunks",
    "goals: labctl >= 90% of pinned H2D, >= 2x safetensors to CUDA",
    "`labctl bench model-load --file ... --device cuda`: every stage of the CLI's own measurement, warm-up and forward included",
]

GB = 1e9
REPS = 5


def _sync(torch: Any) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(torch: Any, fn: Any, reps: int) -> tuple[float, list[float], float]:
    """(median seconds, every time, the first call's time) of `fn`.

    The first call is untimed for the median: it faults the page cache in and warms
    allocators and pinned caches (a fresh process pays it once: it is reported beside).
    Each result is dropped before the next call, so device memory is reused.
    """
    _sync(torch)
    t0 = time.perf_counter()
    fn()
    _sync(torch)
    first = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        _sync(torch)
        t0 = time.perf_counter()
        out = fn()
        _sync(torch)
        times.append(time.perf_counter() - t0)
        del out
    return statistics.median(times), times, first


def _register_pipeline_probe(
    torch: Any, files: list[str], device: str, threads: int, chunk: int
) -> dict[str, Any]:
    """Not labctl's loader: the zero-copy path pipelined. `threads` register chunks of the
    mapped file with CUDA while this thread copies each registered chunk to the card, so
    pinning overlaps the copy; the chunks are unregistered after the last copy."""
    from concurrent.futures import ThreadPoolExecutor

    cudart = torch.cuda.cudart()
    _sync(torch)
    start = time.perf_counter()
    total = 0
    keep = []
    regs: list[tuple[int, int]] = []
    stream = torch.cuda.Stream()

    def reg(ptr: int, n: int) -> int:
        rc = int(cudart.cudaHostRegister(ptr, n, 8))  # cudaHostRegisterReadOnly
        return rc if rc == 0 else int(cudart.cudaHostRegister(ptr, n, 0))

    with ThreadPoolExecutor(threads) as pool:
        for f in files:
            size = os.path.getsize(f)
            host = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage.from_file(f, True, size))
            base = host.data_ptr()
            first = len(regs)  # the chunks of earlier files end here
            dev = torch.empty(size, dtype=torch.uint8, device=device)
            chunks = [(a, min(size, a + chunk)) for a in range(0, size, chunk)]
            futures = [pool.submit(reg, base + a, b - a) for a, b in chunks]
            stream.wait_stream(torch.cuda.current_stream())  # dev's memory may be a freed tensor's
            with torch.cuda.stream(stream):
                for (a, b), fut in zip(chunks, futures, strict=True):
                    rc = fut.result()
                    if rc != 0:
                        # Every chunk that did register is released again before raising.
                        stream.synchronize()
                        here = [
                            base + c[0] for c, f2 in zip(chunks, futures, strict=True) if f2.result() == 0
                        ]
                        for ptr in [r[0] for r in regs[:first]] + here:
                            cudart.cudaHostUnregister(ptr)
                        raise RuntimeError(f"cudaHostRegister of a chunk failed: error {rc}")
                    regs.append((base + a, b - a))
                    dev[a:b].copy_(host[a:b], non_blocking=True)
            keep.append((host, dev))
            total += size
        stream.synchronize()
        copied = time.perf_counter() - start
        list(pool.map(lambda r: cudart.cudaHostUnregister(r[0]), regs))
    done = time.perf_counter() - start
    return {"bytes": total, "to_card_s": copied, "seconds": done, "threads": threads, "chunk": chunk}


def _register_probe(torch: Any, files: list[str], device: str) -> dict[str, Any]:
    """Not labctl's loader: what a zero-copy path would give. The file is mapped and its page
    cache pages registered with CUDA (cudaHostRegister, read-only), then copied straight to
    the device: no copy through a pinned ring, but the pages are pinned on every load."""
    cudart = torch.cuda.cudart()
    out: dict[str, Any] = {"register_s": 0.0, "copy_s": 0.0, "unregister_s": 0.0, "bytes": 0}
    _sync(torch)
    start = time.perf_counter()
    keep = []
    for f in files:
        size = os.path.getsize(f)
        host = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage.from_file(f, True, size))
        t0 = time.perf_counter()
        rc = cudart.cudaHostRegister(host.data_ptr(), size, 8)  # cudaHostRegisterReadOnly
        if int(rc) != 0:
            rc = cudart.cudaHostRegister(host.data_ptr(), size, 0)
        if int(rc) != 0:
            raise RuntimeError(f"cudaHostRegister on the mapped file failed: error {int(rc)}")
        t1 = time.perf_counter()
        dev = torch.empty(size, dtype=torch.uint8, device=device)
        dev.copy_(host, non_blocking=True)
        _sync(torch)
        t2 = time.perf_counter()
        cudart.cudaHostUnregister(host.data_ptr())
        t3 = time.perf_counter()
        out["register_s"] += t1 - t0
        out["copy_s"] += t2 - t1
        out["unregister_s"] += t3 - t2
        out["bytes"] += size
        keep.append(dev)
    out["seconds"] = time.perf_counter() - start
    return out


def _pinned_ceiling(torch: Any, nbytes: int, cuda: bool, reps: int) -> tuple[float, list[float], float]:
    """The copy the issue names as the ceiling, for the file's byte count (freed on return)."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    src.fill_(7)
    return _timed(torch, lambda: src.cuda(non_blocking=True) if cuda else src.clone(), reps)


def run(env: CheckEnv) -> Section:
    import torch
    from safetensors.torch import load_file as st_load

    from labctl.agent.modelload.loader import default_readers, load_model_dir, model_files, release_pinned

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
    ceiling = _pinned_ceiling(torch, nbytes, env.cuda, reps)

    def labctl_load(**kw: int) -> Any:
        return lambda: load_model_dir(str(path), device=device, **kw)

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

    methods: dict[str, tuple[float, list[float], float]] = {"pinned_h2d_ceiling": ceiling}
    readers = default_readers()
    labels = {"labctl_loader": f"labctl loader (default: {readers} readers, 256 MB ring, 2 streams)"}
    methods["labctl_loader"] = _timed(torch, labctl_load(), reps)
    # Beside the default: what fewer readers, a larger ring or more streams would give.
    variants: list[tuple[str, str, dict[str, int]]] = [
        (
            "labctl_loader_4_readers",
            "labctl loader, 4 readers (the default before this check)",
            {"readers": 4},
        ),
        ("labctl_loader_8_readers", "labctl loader, 8 readers", {"readers": 8}),
        ("labctl_loader_ring_1g", "labctl loader, 1 GB ring", {"ring_bytes": 1 << 30}),
        ("labctl_loader_4_streams", "labctl loader, 4 streams", {"streams": 4}),
    ]
    for key, label, kw in variants:
        if kw.get("readers") == readers:
            continue
        labels[key] = label
        methods[key] = _timed(torch, labctl_load(**kw), reps)
    labels["safetensors_load_file"] = f"safetensors load_file(device={device!r})"
    methods["safetensors_load_file"] = _timed(torch, st, reps)
    labels["torch_load"] = f"torch.load(map_location={device!r})"
    methods["torch_load"] = _timed(torch, tl, reps)
    release_pinned()

    # Bit for bit: the loader's tensors are what safetensors gives.
    ours, theirs = load_model_dir(str(path), device=device), st()
    same = ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    del ours, theirs
    _sync(torch)
    if env.cuda:
        torch.cuda.empty_cache()

    gbps = {k: nbytes / m[0] / GB for k, m in methods.items()}
    sec.figures["methods"] = {
        k: {"median_s": m[0], "times_s": m[1], "first_call_s": m[2], "gbps": gbps[k]}
        for k, m in methods.items()
    }
    sec.figures["default_readers"] = readers
    sec.figures["bit_identical_to_safetensors"] = same
    sec.figures["reps"] = reps
    top = gbps["pinned_h2d_ceiling"]
    best = max(v for k, v in gbps.items() if k.startswith("labctl_loader"))
    sec.row(
        "pinned H2D ceiling (same bytes)",
        f"{fmt(top, 'GB/s')} ({fmt(methods['pinned_h2d_ceiling'][0], 's', 3)})",
        "torch.empty(pin_memory=True).cuda(non_blocking=True)",
    )
    for key, label in labels.items():
        sec.row(
            label,
            f"{fmt(gbps[key], 'GB/s')} ({fmt(methods[key][0], 's', 3)}; first call {fmt(methods[key][2], 's', 3)})",
            f"{gbps[key] / top * 100:.0f}% of ceiling",
        )
    if env.cuda:
        # The loader's reading half alone (page cache -> its pinned ring, nothing sent to the
        # card): whether reading or copying is what holds it below the ceiling.
        from labctl.agent.modelload.loader import _give_ring, _take_ring, pipeline, read_header

        ring = _take_ring(torch, 256 << 20, readers + 2)
        headers = [read_header(f) for f in files]

        def reads() -> None:
            for h in headers:
                pipeline(
                    h.path, h.data_start, h.data_bytes, ring.views, readers, lambda *a: None, lambda s: None
                )

        r = _timed(torch, reads, reps)
        _give_ring(ring)
        release_pinned()
        sec.figures["reads_alone"] = {"median_s": r[0], "times_s": r[1], "gbps": nbytes / r[0] / GB}
        sec.row(
            f"the loader's reads alone ({readers} readers into its pinned ring, no copy to the card)",
            fmt(nbytes / r[0] / GB, "GB/s"),
            f"{nbytes / r[0] / GB / top * 100:.0f}% of ceiling",
        )
        try:
            probe = _register_probe(torch, files, device)
            sec.figures["zero_copy_probe"] = probe
            sec.row(
                "probe (not labctl's loader): the mapped file registered with CUDA, copied straight",
                f"{fmt(probe['bytes'] / probe['seconds'] / GB, 'GB/s')} ({fmt(probe['seconds'], 's', 3)})",
                f"register {fmt(probe['register_s'], 's', 3)}, copy {fmt(probe['bytes'] / probe['copy_s'] / GB, 'GB/s')},"
                f" unregister {fmt(probe['unregister_s'], 's', 3)}",
            )
        except Exception as exc:  # a probe: its failure is a finding, not the section's
            sec.skip("zero-copy probe (cudaHostRegister on the mapped file)", f"{type(exc).__name__}: {exc}")
        probes = []
        for threads, chunk in ((8, 64 << 20), (16, 32 << 20)):
            try:
                runs = [_register_pipeline_probe(torch, files, device, threads, chunk) for _ in range(3)]
                _sync(torch)
                torch.cuda.empty_cache()
            except Exception as exc:
                sec.skip(f"pipelined zero-copy probe ({threads} threads)", f"{type(exc).__name__}: {exc}")
                continue
            med = sorted(runs, key=lambda r: r["seconds"])[1]
            probes.append(med)
            sec.row(
                f"probe (not labctl's loader): pipelined registration, {threads} threads, {chunk >> 20} MB chunks",
                f"{fmt(med['bytes'] / med['seconds'] / GB, 'GB/s')} ({fmt(med['seconds'], 's', 3)}, median of 3)",
                f"{med['bytes'] / med['seconds'] / GB / top * 100:.0f}% of ceiling; on the card after"
                f" {fmt(med['to_card_s'], 's', 3)} ({med['bytes'] / med['to_card_s'] / GB / top * 100:.0f}%), the rest unregistering",
            )
        sec.figures["zero_copy_pipeline_probes"] = probes
        _sync(torch)
        torch.cuda.empty_cache()
    sec.row("labctl tensors == safetensors tensors", "yes" if same else "NO", "every tensor, torch.equal")
    sec.goal(
        "labctl loader / pinned H2D",
        gbps["labctl_loader"] / top,
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
