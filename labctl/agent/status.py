"""The host's side of `labctl status`: one sample of CPU, memory, model cache, GPUs, warm
orchestra models and running training runs, plus the recent history of this host's samples.

The history (paths.status_history(), JSON lines) is what lets the controller judge alerts that
need a duration from a single call: the agent appends a short record when the newest one is at
least HISTORY_EVERY_S old, keeps HISTORY_KEEP_S of them and answers the last HISTORY_ANSWER_S.
Writers take history.lock, so two calls at once (two `status --watch`, a metrics scrape) never
interleave their lines or lose a pruning rewrite. Standard library only, Python 3.8.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import time
from typing import Any, Dict, List, Optional, Tuple

from . import paths, procs
from .fsutil import write_atomic
from .gpus import GpuQueryError, gather_gpus
from .parsers import memory_from_meminfo, parse_meminfo, parse_mounts
from .runlog import events as runlog_events
from .runlog import tail_lines

STEP = ("step",)

HISTORY_EVERY_S = 10.0
HISTORY_KEEP_S = 2 * 3600.0
HISTORY_ANSWER_S = 65 * 60.0
CPU_WINDOW_S = 0.2
LOG_TAIL_BYTES = 64 * 1024
METRICS_TAIL_BYTES = 4 * 1024 * 1024  # enough for every logged step of a long run: best_loss needs them
MAX_RUN_LOGS = 64
# What NCCL and torch's ProcessGroupNCCL print when a collective fails; ordinary "NCCL INFO"
# lines (printed with NCCL_DEBUG=INFO) are not errors.
NCCL_ERROR_RE = re.compile(
    r"NCCL WARN|NCCL error|nccl(?:Internal|System|UnhandledCuda|InvalidUsage|InvalidArgument|Remote)Error"
    r"|NCCL communicator was aborted|ProcessGroupNCCL\S*.*(?:[Tt]imeout|[Ee]rror|[Ww]atchdog caught)"
)
GPU_SOURCES = {"pynvml": "nvml", "nvidia-smi": "nvidia-smi", "none": "none"}


def cpu_times() -> Optional[Tuple[int, int]]:
    """(busy, total) jiffies from /proc/stat's first line."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


def busy_pct(before: Optional[Tuple[int, int]], after: Optional[Tuple[int, int]]) -> Optional[float]:
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round(100.0 * (after[0] - before[0]) / (after[1] - before[1]), 1)


def memory_sample(meminfo: str) -> Dict[str, int]:
    """The sample's memory from /proc/meminfo's text, read as `labctl facts` reads it."""
    info = memory_from_meminfo(parse_meminfo(meminfo))
    total, available = info["total_bytes"], info["available_bytes"]
    return {"total_bytes": total, "available_bytes": available, "used_bytes": max(0, total - available)}


def memory() -> Dict[str, int]:
    try:
        with open("/proc/meminfo") as f:
            return memory_sample(f.read())
    except (OSError, KeyError):
        return {"total_bytes": 0, "available_bytes": 0, "used_bytes": 0}


def mount_points() -> List[str]:
    try:
        with open("/proc/self/mounts") as f:
            return [m["mountpoint"] for m in parse_mounts(f.read())]
    except OSError:
        return []


def cache_state(path: Optional[str]) -> Optional[Dict[str, Any]]:
    if not path:
        return None
    out: Dict[str, Any] = {"path": path, "mounted": False, "size_bytes": None, "used_bytes": None}
    out["mounted"] = os.path.normpath(path) in mount_points()
    if out["mounted"]:
        try:
            st = os.statvfs(path)
        except OSError:
            return out
        out["size_bytes"] = st.f_blocks * st.f_frsize
        out["used_bytes"] = (st.f_blocks - st.f_bfree) * st.f_frsize
    return out


def gpu_sample() -> Tuple[str, List[Dict[str, Any]], Optional[str]]:
    """(gpu_source, gpus in the sample's shape, error) from NVML, else nvidia-smi."""
    try:
        source, found = gather_gpus()
    except GpuQueryError as exc:
        return "none", [], str(exc)
    keys = ("index", "name", "uuid", "utilization_pct", "memory_total_bytes", "memory_used_bytes")
    gpus = []
    for gpu in found:
        row = {k: gpu.get(k) for k in keys}
        row["temperature_c"] = gpu.get("temperature_c")
        row["power_w"] = gpu.get("power_w")
        gpus.append(row)
    return GPU_SOURCES.get(source, source), gpus, None


def warm_models(path: str = paths.WARM_STATE) -> List[Dict[str, Any]]:
    try:
        with open(path) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return []
    models = state.get("models") if isinstance(state, dict) else None
    out = []
    for m in models if isinstance(models, list) else []:
        if isinstance(m, dict) and m.get("name"):
            out.append({"model": str(m["name"]), "gpu": m.get("gpu"), "port": m.get("port")})
    return out


def progress(events: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The newest step's figures and the best loss so far (the first step that reached it)."""
    out: Dict[str, Any] = dict.fromkeys(
        ("step", "steps", "loss", "lr", "tokens_per_s", "grad_norm", "best_loss", "best_step")
    )
    for event in events:
        loss = event.get("loss")
        if isinstance(loss, (int, float)) and (out["best_loss"] is None or loss < out["best_loss"]):
            out["best_loss"], out["best_step"] = float(loss), event.get("step")
    if events:
        last = events[-1]
        for key in ("step", "steps", "loss", "lr", "tokens_per_s", "grad_norm"):
            out[key] = last.get(key)
    return out


def nccl_errors(log_dir: str) -> Tuple[int, Optional[str]]:
    """NCCL error lines in the tails of a run's logs, and the newest one."""
    count, last = 0, None
    found = 0
    for root, _dirs, files in os.walk(log_dir):
        for name in sorted(files):
            if name == "metrics.jsonl" or not (name.endswith(".log") or name.endswith(".txt")):
                continue
            found += 1
            if found > MAX_RUN_LOGS:
                return count, last
            for line in tail_lines(os.path.join(root, name), LOG_TAIL_BYTES):
                if NCCL_ERROR_RE.search(line):
                    count += 1
                    last = line.strip()[:300]
    return count, last


def _started(pid: int) -> Optional[float]:
    try:
        return os.stat(f"/proc/{pid}").st_mtime
    except OSError:
        return None


def _visible_gpus(value: Optional[str]) -> Optional[List[int]]:
    """CUDA_VISIBLE_DEVICES as indices; None when unset (every GPU), [] for a CPU run."""
    if value is None:
        return None
    out = []
    for part in value.split(","):
        part = part.strip()
        if part.isdigit():
            out.append(int(part))
    return out


def running_runs(host: str, root_dir: Optional[str] = None) -> List[Dict[str, Any]]:
    """Training runs with a process on this host (LABCTL_HOST `host` where given, as in the sim)."""

    def want(env: Dict[str, str]) -> bool:
        if not env.get("LABCTL_RUN_ID"):
            return False
        return not host or env.get("LABCTL_HOST") in (None, host)

    found = procs.scan(("LABCTL_RUN_ID", "LABCTL_HOST", "CUDA_VISIBLE_DEVICES"), want)
    by_run: Dict[str, Dict[str, Any]] = {}
    for p in found:
        run = by_run.setdefault(p["env"]["LABCTL_RUN_ID"], {"pids": [], "gpus": set(), "all_gpus": False})
        run["pids"].append(p["pid"])
        visible = _visible_gpus(p["env"].get("CUDA_VISIBLE_DEVICES"))
        if visible is None:
            run["all_gpus"] = True
        else:
            run["gpus"].update(visible)
    base = root_dir or paths.local_home() + "/runs"
    out = []
    for run_id in sorted(by_run):
        log_dir = os.path.join(base, run_id)
        events = runlog_events(
            tail_lines(os.path.join(log_dir, "metrics.jsonl"), METRICS_TAIL_BYTES), kinds=STEP
        )
        if not events:  # a detached run's rank 0 also prints its events to console.log
            events = runlog_events(
                tail_lines(os.path.join(log_dir, "console.log"), LOG_TAIL_BYTES), "[rank0]:", STEP
            )
        count, last = nccl_errors(log_dir) if os.path.isdir(log_dir) else (0, None)
        starts = [s for s in (_started(pid) for pid in by_run[run_id]["pids"]) if s is not None]
        row: Dict[str, Any] = {"run_id": run_id, "state": "running"}
        row.update(progress(events))
        row.update({"nccl_errors": count, "last_nccl_error": last})
        # Beyond the contract's keys: which GPUs the run uses (None: every GPU) and since when,
        # so "GPU idle while training" judges only the run's GPUs and only after it started.
        row["gpus"] = None if by_run[run_id]["all_gpus"] else sorted(by_run[run_id]["gpus"])
        row["started"] = min(starts) if starts else None
        out.append(row)
    return out


def history_record(sample: Dict[str, Any]) -> Dict[str, Any]:
    gpus = []
    for g in sample.get("gpus") or []:
        total, used = g.get("memory_total_bytes"), g.get("memory_used_bytes")
        pct = round(100.0 * used / total, 2) if total and used is not None else None
        gpus.append(
            {"index": g.get("index"), "memory_used_pct": pct, "utilization_pct": g.get("utilization_pct")}
        )
    return {"t": sample["time"], "memory_used_bytes": sample["memory"]["used_bytes"], "gpus": gpus}


def _read_history(path: str) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return out
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash or a full disk: skip it, keep the rest
        if isinstance(record, dict) and isinstance(record.get("t"), (int, float)):
            out.append(record)
    out.sort(key=lambda r: r["t"])
    return out


def update_history(path: str, record: Optional[Dict[str, Any]], now: float) -> List[Dict[str, Any]]:
    """Append `record` when the newest is >= HISTORY_EVERY_S old, prune past HISTORY_KEEP_S;
    the records of the last HISTORY_ANSWER_S, oldest first. `record` None: read only."""
    if record is None:
        return [r for r in _read_history(path) if r["t"] >= now - HISTORY_ANSWER_S]
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    with open(os.path.join(folder, "history.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        records = _read_history(path)
        if not records or now - records[-1]["t"] >= HISTORY_EVERY_S:
            records.append(record)
            kept = [r for r in records if r["t"] >= now - HISTORY_KEEP_S]
            if len(kept) < len(records) or not os.path.exists(path):
                text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in kept)
                write_atomic(path, text.encode(), mode=0o600)
            else:
                with open(path, "a") as f:
                    f.write(json.dumps(record, separators=(",", ":")) + "\n")
            records = kept
    return [r for r in records if r["t"] >= now - HISTORY_ANSWER_S]


def status_command(args: Dict[str, Any]) -> Dict[str, Any]:
    before = cpu_times()
    time.sleep(CPU_WINDOW_S)  # busy % needs two readings; the load averages alone lag by minutes
    after = cpu_times()
    try:
        load = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        load = [0.0, 0.0, 0.0]
    source, gpus, gpu_error = gpu_sample()
    sample: Dict[str, Any] = {
        "time": time.time(),
        "hostname": socket.gethostname(),
        "cpu": {"count": os.cpu_count() or 1, "load": load, "busy_pct": busy_pct(before, after)},
        "memory": memory(),
        "cache": cache_state(args.get("cache_path")),
        "gpus": gpus,
        "gpu_source": source,
        "gpu_error": gpu_error,
        "warm": warm_models(),
        "runs": running_runs(str(args.get("host") or "")),
    }
    record = history_record(sample) if args.get("record", True) else None
    try:
        sample["history"] = update_history(paths.status_history(), record, sample["time"])
    except OSError as exc:  # a full or read-only disk: the sample still answers, without history
        sample["history"] = update_history(paths.status_history(), None, sample["time"])
        sample["history_error"] = f"cannot write {paths.status_history()}: {exc.strerror or exc}"
    return sample
