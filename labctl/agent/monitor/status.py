"""The host's side of `labctl status`: one sample of CPU, memory, model cache, GPUs, warm
orchestra models, running training runs and this month's spend on remote tiers, plus the recent
history of this host's samples.

The history (paths.status_history(), JSON lines) is what lets the controller judge alerts that
need a duration from a single call: the agent appends a short record when the newest one is at
least HISTORY_EVERY_S old, keeps HISTORY_KEEP_S of them and answers the last HISTORY_ANSWER_S,
ages measured by the boot clock so that a wall clock set back or forward stops none of it.
Writers take history.lock, so two calls at once (two `status --watch`, a metrics scrape) never
interleave their lines or lose a pruning rewrite. Standard library only, Python 3.8.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import socket
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

from ..core import paths, procs
from ..core.fsutil import write_atomic
from ..core.gpus import GPU, GpuQueryError, gather_gpus
from ..core.parsers import memory_from_meminfo, parse_meminfo, parse_mounts
from ..core.spec import Opt, Or, command
from ..orchestra import spend
from ..train.limit import process_age
from ..train.runlog import events as runlog_events
from ..train.runlog import tail_lines

# What this feature's answers share (labctl/agent/core/spec.py's shape language).
# A training run on the host, as `monitor.status` reports it. The step figures are what the run's script
# logged (the reference trainer's, or --script's own), so they are "any": their readers check them.
RUN = {
    "run_id": "str",
    "state?": "str?",
    "step?": "any",
    "steps?": "any",
    "loss?": "any",
    "tokens_per_s?": "any",
    "best_loss?": "num?",
    "best_step?": "any",
    "nccl_errors?": "int",
    "last_nccl_error?": "str?",
    "reward?": "any",
    "exec_success_rate?": "any",
    "programs_run?": "any",
    "rotation_wait_s?": "any",
    "orchestra_ms?": "any",
    "gpus?": (["int"], "null"),
    "started?": "time?",
}
STATUS = {
    "time": "time",
    "hostname?": "str?",
    "cpu?": {"count?": "int", "load?": ["num"], "busy_pct?": "num?"},
    "memory": {"total_bytes?": "int", "available_bytes?": "int", "used_bytes": "int"},
    "cache?": (
        {"path?": "str?", "mounted?": "bool", "size_bytes?": "int?", "used_bytes?": "int?"},
        "null",
    ),
    "gpus?": [GPU],
    "gpu_source?": "str?",
    "gpu_error?": "str?",
    "warm?": [{"model?": "str", "gpu?": "any", "port?": "any"}],  # gpu, port: as warm.json has them
    "runs?": [RUN],
    "history?": [
        {
            "t": "time",
            "memory_used_bytes?": "int?",
            "gpus?": [{"index?": "int?", "memory_used_pct?": "num?", "utilization_pct?": "num?"}],
        }
    ],
    "history_error?": "str?",
    "history_notes?": ["str"],
    # agent/orchestra/spend.py status(): null on a host with no remote tier's spend or budget.
    "remote_spend?": (
        {
            "month": "str",
            "dir?": "str",
            "tiers": [
                {
                    "tier": "str",
                    "usd": "num",
                    "prompt_tokens?": "int",
                    "completion_tokens?": "int",
                    "answers?": "int",
                    "budget_per_month?": "num?",
                }
            ],
            "errors?": ["str"],
        },
        "null",
    ),
}

STEP = ("step",)

HISTORY_EVERY_S = 10.0
HISTORY_KEEP_S = 2 * 3600.0
HISTORY_ANSWER_S = 65 * 60.0
# A record's wall stamp and its age by the boot clock disagreeing by more than this: the wall
# clock was set (stepped) since. NTP's slewing stays far below it over HISTORY_KEEP_S.
CLOCK_STEP_S = 5.0
# The controller's bounds on a status answer's numbers (STATUS below, labctl/agent/core/spec.py).
INT_LIMIT = 2**63
TIME_LIMIT = 253402300800.0  # 10000-01-01
CPU_WINDOW_S = 0.2
# The last /proc/stat reading a status call took, beside the history (paths.status_history()),
# so the next call measures busy % from it instead of sleeping CPU_WINDOW_S: used while it is of
# this boot and at most CPU_READING_MAX_S old by the boot clock.
CPU_READING = "cpu.json"
CPU_READING_MAX_S = 30.0
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


def cpu_reading_path() -> str:
    return os.path.join(os.path.dirname(paths.status_history()), CPU_READING)


def read_cpu_reading(path: str, boot: str, mono: float) -> Optional[Tuple[Tuple[int, int], float]]:
    """((busy, total), age in seconds) of the reading kept at `path`, when it is of boot `boot`,
    taken at most CPU_READING_MAX_S before `mono` (boot_clock()) and not after it; else None
    (none kept, unreadable, damaged, of another boot, too old, or stamped in the future)."""
    try:
        with open(path, "rb") as f:
            record = json.loads(f.read(4096))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or not boot or record.get("boot") != boot:
        return None
    m: Any = record.get("m")
    busy, total = _count(record.get("busy")), _count(record.get("total"))
    if not _figure(m, "time") or busy is None or total is None or busy > total:
        return None
    age = mono - float(m)
    if not 0 <= age <= CPU_READING_MAX_S:
        return None
    return (busy, total), age


def _count(value: Any) -> Optional[int]:
    """`value` when it is a count of jiffies as /proc/stat has them (a whole number in 64 bits)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < INT_LIMIT:
        return None
    return value


def write_cpu_reading(path: str, reading: Tuple[int, int], boot: str, mono: float) -> None:
    """Keep `reading` (taken at boot_clock() `mono` in boot `boot`) for the next status call.
    Best effort: a status answer never fails for it (a read-only disk only means sleeping)."""
    if not boot:
        return
    record = {"boot": boot, "m": mono, "busy": reading[0], "total": reading[1]}
    folder = os.path.dirname(path)
    tmp = ""
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        # Written whole beside it and renamed over it, so a reader never sees half a reading;
        # not fsynced (write_atomic would): a reading lost to a crash is of the boot before,
        # which the next call would not use anyway, and an fsync costs a busy disk tens of ms.
        fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + CPU_READING + ".", suffix=".tmp")  # 0600
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(record, separators=(",", ":")))
        os.replace(tmp, path)
    except (OSError, ValueError):
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def cpu_window(boot: str) -> Tuple[Optional[Tuple[int, int]], Optional[Tuple[int, int]]]:
    """Two /proc/stat readings (before, after) at least CPU_WINDOW_S apart, for busy_pct.

    busy % needs two readings. When the previous status call on this host kept one that is
    still usable (read_cpu_reading), "before" is that one and "after" is read now: busy % is
    then the average since that call (at most CPU_READING_MAX_S), and this call does not sleep,
    which was most of what `monitor.status` cost. Otherwise (first call, a reading too old, of
    another boot, damaged or unreadable) it sleeps CPU_WINDOW_S between two readings as before.
    Either way the newer reading is kept for the next call."""
    path = cpu_reading_path()
    now, mono = cpu_times(), boot_clock()
    kept = read_cpu_reading(path, boot, mono)
    before: Optional[Tuple[int, int]]
    if kept is not None and now is not None and _advanced(kept[0], now):
        before, age = kept
        if age < CPU_WINDOW_S:  # two calls close together: still a window of CPU_WINDOW_S
            time.sleep(CPU_WINDOW_S - age)
            now, mono = cpu_times(), boot_clock()
    else:
        before = now
        time.sleep(CPU_WINDOW_S)
        now, mono = cpu_times(), boot_clock()
    if now is not None:
        write_cpu_reading(path, now, boot, mono)
    return before, now


def _advanced(before: Tuple[int, int], after: Tuple[int, int]) -> bool:
    """Whether `after` can follow `before` on one host: neither count went back, busy by no more
    than the total (a kept reading that fails this is not of this host's counters)."""
    return 0 <= after[0] - before[0] <= after[1] - before[1]


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


PHASE3_KEYS = ("reward", "exec_success_rate", "programs_run", "rotation_wait_s", "orchestra_ms")


def progress(events: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The newest step's figures and the best loss so far (the first step that reached it)."""
    out: Dict[str, Any] = dict.fromkeys(
        ("step", "steps", "loss", "lr", "tokens_per_s", "grad_norm", "best_loss", "best_step")
    )
    for event in events:
        loss: Any = event.get("loss")
        # nan, inf or an int past a float's range are no loss, and would fail the answer.
        if not _figure(loss, "num") or not math.isfinite(float(loss)):
            continue
        if out["best_loss"] is None or loss < out["best_loss"]:
            out["best_loss"], out["best_step"] = float(loss), event.get("step")
    if events:
        last = events[-1]
        for key in ("step", "steps", "loss", "lr", "tokens_per_s", "grad_norm"):
            out[key] = last.get(key)
        # A phase-3 run's figures since its previous step event (labctl/agent/train/phase3.py).
        for key in PHASE3_KEYS:
            if key in last:
                out[key] = last[key]
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
    """When `pid` started, on the wall clock as it reads now: its age comes from the boot clock,
    so a clock set back since the run started does not put the start in the future (which
    held off "GPU idle while training" until the clock caught up)."""
    age = process_age(pid)
    return None if age is None else time.time() - age


def _visible_gpus(value: Optional[str]) -> Optional[List[int]]:
    """CUDA_VISIBLE_DEVICES as indices; None when unset (every GPU), [] for a CPU run."""
    if value is None:
        return None
    out = []
    for part in value.split(","):
        part = part.strip()
        if part.isascii() and part.isdigit():  # as CUDA reads it: '١' is no GPU index
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


def boot_id() -> str:
    """This boot's id: boot_clock() readings compare only within one boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def boot_clock() -> float:
    """Seconds since boot, suspended time included (a host that slept did not stop aging its
    samples); time.monotonic() where the platform has no CLOCK_BOOTTIME."""
    clock_id = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(clock_id) if clock_id is not None else time.monotonic()


class Clock:
    """One reading of both clocks: `wall` (time.time(), what a sample shows) and `mono`
    (boot_clock(), what ages are measured by within boot `boot`)."""

    def __init__(self, wall: float, mono: Optional[float] = None, boot: str = "") -> None:
        self.wall, self.mono, self.boot = wall, mono, boot

    @classmethod
    def now(cls) -> "Clock":
        return cls(time.time(), boot_clock(), boot_id())

    def stamp(self, record: Dict[str, Any]) -> Dict[str, Any]:
        """`record` with this reading's monotonic time and boot (when known)."""
        if self.mono is not None and self.boot:
            record = dict(record, m=self.mono, boot=self.boot)
        return record

    def boot_age(self, record: Dict[str, Any]) -> Optional[float]:
        """Seconds since `record` was written by the boot clock, a clock set back or forward
        since notwithstanding; None for a record of another boot (or of an older agent)."""
        m = record.get("m")
        if self.mono is None or not self.boot or record.get("boot") != self.boot:
            return None
        if not isinstance(m, (int, float)) or m > self.mono:
            return None
        return float(self.mono - m)

    def age(self, record: Dict[str, Any]) -> float:
        """Seconds since `record` was written: its boot_age, else by its wall stamp."""
        age = self.boot_age(record)
        return self.wall - float(record["t"]) if age is None else age


def _span(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    hours, minutes = divmod(round(seconds / 60.0), 60)
    if not hours:
        return f"{minutes} min"
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _figure(value: Any, kind: str) -> bool:
    """`value` is a number of `kind` ("int", "num", "time") as the controller checks a status
    answer (STATUS, in labctl/agent/core/spec.py's shape language): finite, an int within
    64 bits, a time between 1970 and the year 10000."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind == "time":
        return math.isfinite(value) and 0 <= value < TIME_LIMIT
    if isinstance(value, int):
        return -INT_LIMIT <= value < INT_LIMIT
    return kind == "num" and math.isfinite(value)


def _sound(record: Any) -> bool:
    """Whether a history line is a record this agent could have written: what it holds is
    read as numbers (ages, spans, dates) and answered, so one inf, nan or stamp out of range
    would fail the whole host's status."""
    if not isinstance(record, dict) or not _figure(record.get("t"), "time"):
        return False
    if "m" in record and not _figure(record["m"], "time"):  # seconds since boot: never negative
        return False
    if "note" in record and not isinstance(record["note"], str):
        return False
    used = record.get("memory_used_bytes")
    gpus = record.get("gpus", [])
    if (used is not None and not _figure(used, "int")) or not isinstance(gpus, list):
        return False
    for g in gpus:
        if not isinstance(g, dict):
            return False
        figures = (
            (g.get("index"), "int"),
            (g.get("memory_used_pct"), "num"),
            (g.get("utilization_pct"), "num"),
        )
        if any(v is not None and not _figure(v, kind) for v, kind in figures):
            return False
    return True


def _read_history(path: str) -> Tuple[List[Dict[str, Any]], int]:
    """The history's records in the order they were appended (not sorted by their stamps: a
    clock set back makes those go back too), and how many damaged lines were skipped."""
    out: List[Dict[str, Any]] = []
    damaged = 0
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return out, damaged
    lines = data.decode("utf-8", "replace").splitlines()
    # A last line with no newline yet may be a write in progress (reading only takes no lock):
    # skipped like a cut one, but not counted.
    last = len(lines) - 1 if not data.endswith(b"\n") else len(lines)
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            record = None  # a line cut by a crash or a full disk: skip it, keep the rest
        if _sound(record):
            out.append(record)
        elif line.strip() and i != last:
            damaged += 1
    return out, damaged


def _damaged_note(path: str, damaged: int) -> List[str]:
    return [f"{damaged} damaged line(s) of {path} skipped"] if damaged else []


def _settle(records: List[Dict[str, Any]], clock: Clock) -> Tuple[List[Dict[str, Any]], List[str], bool]:
    """(records kept, notes on clock changes found now, whether the file must be rewritten).

    A record of this boot whose wall stamp disagrees with its boot-clock age by more than
    CLOCK_STEP_S saw the clock set since: it is re-dated to the clock as it reads now, so
    durations ("for 5 minutes") and one record per HISTORY_EVERY_S hold across the change. A
    record of another boot (or an older agent's) stamped in the future can only be dated by
    that stamp, which is wrong: it is dropped. Either way a note says so, kept in the history
    for HISTORY_KEEP_S, instead of the history going silent until the clock catches up."""
    kept: List[Dict[str, Any]] = []
    rewrite = False
    step = 0.0  # the largest clock change found; < 0: set back
    moved = 0
    last_moved: Optional[float] = None  # the newest re-dated sample, on today's clock
    dropped: List[float] = []
    for r in records:
        age = clock.age(r)
        step_since = (clock.wall - float(r["t"])) - age
        if clock.boot_age(r) is not None and abs(step_since) > CLOCK_STEP_S:
            r = dict(r, t=clock.wall - age)
            rewrite = True
            if "note" not in r:
                moved += 1
                last_moved = r["t"]
                step = step_since if abs(step_since) > abs(step) else step
        elif age < -CLOCK_STEP_S:
            dropped.append(-age)
            rewrite = True
            continue
        if age > HISTORY_KEEP_S:
            rewrite = True
            continue
        kept.append(r)
    notes: List[str] = []
    if moved and last_moved is not None:
        way, since, now = "back" if step < 0 else "forward", _utc(last_moved), _utc(clock.wall)
        notes.append(
            f"clock went {way} {_span(step)} between {since} and {now}; the {moved} sample(s) "
            "from before were re-dated by the boot clock"
        )
    if dropped:
        ahead, now = _span(max(dropped)), _utc(clock.wall)
        notes.append(
            f"clock went back: {len(dropped)} sample(s) stamped up to {ahead} after now ({now}) were dropped"
        )
    return kept, notes, rewrite


def update_history(
    path: str, record: Optional[Dict[str, Any]], now: float, clock: Optional[Clock] = None
) -> List[Dict[str, Any]]:
    """Append `record` when the newest is >= HISTORY_EVERY_S old, prune past HISTORY_KEEP_S;
    the records of the last HISTORY_ANSWER_S in the order they came. `record` None: read only.
    `clock`: this call's reading of both clocks (default: `now` alone, the wall clock).

    Notes on a clock that was set (see _settle) come among the records as {"t", "note"}."""
    clock = clock or Clock(now)
    if record is None:
        history, damaged = _read_history(path)
        records, notes, _ = _settle(history, clock)
        return _answer(records, notes + _damaged_note(path, damaged), clock)
    record = clock.stamp(record)
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    with open(os.path.join(folder, "history.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        history, damaged = _read_history(path)
        records, notes, rewrite = _settle(history, clock)
        added = [clock.stamp({"t": clock.wall, "note": n}) for n in notes]
        samples = [r for r in records if "note" not in r]
        if added or not samples or clock.age(samples[-1]) >= HISTORY_EVERY_S:
            added.append(record)
        if rewrite or not os.path.exists(path):
            records += added
            text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
            write_atomic(path, text.encode(), mode=0o600)
        elif added:
            records += added
            with open(path, "a") as f:
                f.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in added))
    # Said on every answer, not kept as a note: the lines stay until the next rewrite drops them.
    return _answer(records, _damaged_note(path, damaged), clock)


def _answer(records: List[Dict[str, Any]], notes: List[str], clock: Clock) -> List[Dict[str, Any]]:
    out = [
        {k: v for k, v in r.items() if k not in ("m", "boot")}
        for r in records
        if clock.age(r) <= HISTORY_ANSWER_S
    ]
    return out + [{"t": clock.wall, "note": n} for n in notes]


@command(
    takes={"cache_path": Opt("str?", None), "host": Or("str", ""), "record": Opt("bool", True)},
    answers=STATUS,
)
def status_command(args: Dict[str, Any]) -> Dict[str, Any]:
    clock = Clock.now()
    # busy % needs two readings (the load averages alone lag by minutes): see cpu_window.
    before, after = cpu_window(clock.boot)
    try:
        load = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        load = [0.0, 0.0, 0.0]
    source, gpus, gpu_error = gpu_sample()
    sample: Dict[str, Any] = {
        "time": clock.wall,
        "hostname": socket.gethostname(),
        "cpu": {"count": os.cpu_count() or 1, "load": load, "busy_pct": busy_pct(before, after)},
        "memory": memory(),
        "cache": cache_state(args["cache_path"]),
        "gpus": gpus,
        "gpu_source": source,
        "gpu_error": gpu_error,
        "warm": warm_models(),
        "runs": running_runs(args["host"]),
        # On a host that trains: this month's spend on each remote tier, against its budget.
        "remote_spend": spend.status(),
    }
    record = history_record(sample) if args["record"] else None
    try:
        history = update_history(paths.status_history(), record, clock.wall, clock)
    except OSError as exc:  # a full or read-only disk: the sample still answers, without history
        history = update_history(paths.status_history(), None, clock.wall, clock)
        sample["history_error"] = f"cannot write {paths.status_history()}: {exc.strerror or exc}"
    sample["history"] = [r for r in history if "note" not in r]
    # "clock went back 2 h at ...": why the history's stamps moved, or why samples are missing.
    sample["history_notes"] = [str(r["note"]) for r in history if "note" in r]
    return sample
