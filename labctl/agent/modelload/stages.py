"""Host side of `labctl bench model-load`: each stage of loading a model, measured on its own.

Runs with a Python that has torch (the host's torch_env). Every stage is timed alone and
next to its ceiling measured in the same process: the memory-copy bandwidth for reading
from the RAM cache, the pinned host-to-device bandwidth for the copy to the GPU.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional

from ..core.errors import AgentError
from ..core.spec import Opt, command

# What this feature's answers share (labctl/agent/core/spec.py's shape language).
STAGE = {"bytes?": "int", "seconds?": "num", "skipped?": "str"}

GB = 1e9


def _median_time(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def drop_file_cache(path: str) -> None:
    """Drop `path`'s pages from the page cache so the next read comes from the device."""
    fd = os.open(path, os.O_RDONLY)
    try:
        # Dirty pages (a model just written) cannot be dropped until they are on the device.
        try:
            os.fsync(fd)
        except OSError:
            pass
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def model_files(path: str) -> List[str]:
    if os.path.isfile(path):
        return [path]
    files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise AgentError(f"no .safetensors file in {path}", "not_found")
    return files


@command(
    takes={"path": "str"},
    answers={"bytes": "int", "seconds": "num", "fstype?": "str?"},
)
def read_cold_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """storage_cold: read a model's files once with their pages dropped first (stdlib only)."""
    files = model_files(args["path"])
    total = 0
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    for f in files:
        drop_file_cache(f)
    start = time.perf_counter()
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while True:
                n = fh.readinto(view)
                if not n:
                    break
                total += n
    seconds = time.perf_counter() - start
    # On tmpfs (or with pages that cannot be dropped) this is not a device read: say so.
    return {"bytes": total, "seconds": seconds, "fstype": _fstype(files[0])}


def _fstype(path: str) -> Optional[str]:
    best, fstype = "", None
    real = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if (
                len(parts) > 2
                and (real == parts[1] or real.startswith(parts[1].rstrip("/") + "/"))
                and len(parts[1]) >= len(best)
            ):
                best, fstype = parts[1], parts[2]
    return fstype


def memcpy_gbps(torch: Any, nbytes: int = 1 << 30) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8)
    src.fill_(1)
    dst = torch.empty_like(src)
    return nbytes / _median_time(lambda: dst.copy_(src), 5) / GB


def pinned_h2d_gbps(torch: Any, device: str, nbytes: int = 1 << 30) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def copy() -> None:
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(device)

    copy()
    return nbytes / _median_time(copy, 5) / GB


def warm_up(torch: Any, config: Dict[str, Any], tensors: Dict[str, Any], device: str, seq: int) -> Any:
    """(model, tokens): the tinylm around loaded `tensors`, after its first forward pass on `seq` tokens.

    Built on the meta device and given the tensors: no second copy of the weights. Raises
    AgentError (bad_model) when that pass gives non-finite logits.
    """
    from ..models.tinylm import build_model

    with torch.device("meta"):
        model = build_model(config)
    model.load_state_dict(tensors, strict=True, assign=True)
    model.eval()
    tokens = torch.randint(0, int(config["vocab"]), (1, seq), device=device)
    with torch.no_grad():
        logits = model(tokens)
        if str(device).startswith("cuda"):
            torch.cuda.synchronize(device)
    if not bool(torch.isfinite(logits).all()):
        raise AgentError("the model's first forward pass gave non-finite logits", "bad_model")
    return model, tokens


CUDA_INIT = "import time, torch; t = time.perf_counter(); torch.cuda.init(); torch.empty(1, device=%r); torch.cuda.synchronize(); print(time.perf_counter() - t)"


@command(
    takes={"path": "str", "device": Opt("str", "cpu"), "seq": Opt("int", 128), "reps": Opt("int", 3)},
    answers={
        "stages": {"ram_cache": {"bytes": "int", "seconds?": "num"}, "*": STAGE},
        "memcpy_gbps?": "num?",
        "h2d_pinned_gbps?": "num?",
    },
)
def load_stages_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """ram_cache, h2d, cuda_init, warmup and forward for the model at args["path"]."""
    import torch

    from .loader import load_file

    path = args["path"]
    device = args["device"]
    seq = args["seq"]
    reps = args["reps"]
    files = model_files(path)
    config_path = os.path.join(path, "config.json") if os.path.isdir(path) else None
    out: Dict[str, Any] = {"device": device, "torch": torch.__version__, "files": len(files)}
    stages: Dict[str, Any] = {}
    out["memcpy_gbps"] = memcpy_gbps(torch)

    # ram_cache: the cache's pages into host memory, as the loader does it on the CPU.
    tensors: Dict[str, Any] = {}
    total = sum(os.path.getsize(f) for f in files)

    def read_all() -> None:
        tensors.clear()
        for f in files:
            tensors.update(load_file(f, device="cpu"))

    read_all()  # the first read faults in the tmpfs pages; time the steady state
    stages["ram_cache"] = {"bytes": total, "seconds": _median_time(read_all, reps)}

    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise AgentError(f"{device} asked for, but torch {torch.__version__} sees no GPU here", "no_gpu")
    if cuda:
        init = subprocess.run(
            [sys.executable, "-c", CUDA_INIT % device], capture_output=True, text=True, timeout=300
        )
        if init.returncode != 0:
            raise AgentError("CUDA start-up failed: " + init.stderr.strip()[-500:], "cuda")
        stages["cuda_init"] = {"seconds": float(init.stdout.strip().splitlines()[-1])}
        out["h2d_pinned_gbps"] = pinned_h2d_gbps(torch, device)
        gpu: Dict[str, Any] = {}

        def to_gpu() -> None:
            gpu.clear()
            for f in files:
                gpu.update(load_file(f, device=device))
            torch.cuda.synchronize(device)

        to_gpu()
        stages["h2d"] = {"bytes": total, "seconds": _median_time(to_gpu, reps)}
        tensors = gpu
    else:
        stages["cuda_init"] = {"skipped": "device is cpu" if torch.cuda.is_available() else "no GPU here"}
        stages["h2d"] = {"skipped": "device is cpu" if torch.cuda.is_available() else "no GPU here"}

    if config_path and os.path.exists(config_path):
        with open(config_path) as f:
            config = json.load(f)
        start = time.perf_counter()
        model, tokens = warm_up(torch, config, tensors, device, seq)
        stages["warmup"] = {"seconds": time.perf_counter() - start}

        def forward() -> None:
            with torch.no_grad():
                model(tokens)
            if cuda:
                torch.cuda.synchronize(device)

        stages["forward"] = {"seconds": _median_time(forward, max(reps, 5)), "tokens": seq}
    else:
        stages["warmup"] = stages["forward"] = {
            "skipped": "no config.json beside the weights: not a model labctl can build"
        }
    out["stages"] = stages
    return out
