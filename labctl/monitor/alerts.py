"""Alerts judged from one host's `monitor.status` sample (labctl/agent/monitor/status.py) and its history.

The rules come from playbooks/alerts.yaml (seed 004's "Monitoring and Alerting" thresholds by
default), validated like every other document (file:line, exit 2). `evaluate` is pure: the
same sample and rules give the same alerts, so `monitor.status`, `doctor` and `metrics` agree.

Alerts that need a duration use the history the agent keeps on the host: a GPU's memory is
"above 95% for 5 minutes" when every sample from at least 5 minutes ago up to now is above
(the newest sample is the current one); host memory "grows 2 GB/hour" when the least-squares
slope of the samples in the window says so and they span at least half the window, so one
spike in a few seconds is not read as a rate.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import Field

from labctl.documents.defaults import shown_path
from labctl.documents.loader import load_model
from labctl.inventory.model import Strict

DEFAULT_ALERTS = Path("playbooks/alerts.yaml")
GB = 1024**3  # labctl's GB are GiB, as the inventory's ram_gb and size_gb
Severity = Literal["warning", "critical"]


class Rule(Strict):
    enabled: bool = Field(default=True, description="true, or false to turn the alert off")
    severity: Severity = Field(default="warning", description="warning or critical")


class GpuMemoryRule(Rule):
    above_pct: float = Field(default=95, gt=0, le=100, description="a percentage, e.g. above_pct: 95")
    for_minutes: float = Field(
        default=5, ge=0, le=60, description="minutes (at most 60), e.g. for_minutes: 5"
    )


class GpuIdleRule(Rule):
    below_pct: float = Field(default=50, gt=0, le=100, description="a percentage, e.g. below_pct: 50")
    for_minutes: float = Field(
        default=5, ge=0, le=60, description="minutes (at most 60), e.g. for_minutes: 5"
    )


class GpuTemperatureRule(Rule):
    severity: Severity = Field(default="critical", description="warning or critical")
    above_c: float = Field(default=85, gt=0, description="degrees Celsius, e.g. above_c: 85")


class HostMemoryGrowthRule(Rule):
    above_gb_per_hour: float = Field(default=2, gt=0, description="GB per hour, e.g. above_gb_per_hour: 2")
    window_minutes: float = Field(
        default=60,
        ge=2,
        le=60,
        description="minutes between 2 and 60 (the host keeps 65), e.g. window_minutes: 60",
    )


class NcclRule(Rule):
    severity: Severity = Field(default="critical", description="warning or critical")


class LossStalledRule(Rule):
    steps: int = Field(default=1000, gt=0, description="a number of steps, e.g. steps: 1000")


class CacheFullRule(Rule):
    above_pct: float = Field(default=90, gt=0, le=100, description="a percentage, e.g. above_pct: 90")


class AlertRules(Strict):
    gpu_memory: GpuMemoryRule = Field(default_factory=lambda: GpuMemoryRule())
    gpu_idle_while_training: GpuIdleRule = Field(default_factory=lambda: GpuIdleRule())
    gpu_temperature: GpuTemperatureRule = Field(default_factory=lambda: GpuTemperatureRule())
    host_memory_growth: HostMemoryGrowthRule = Field(default_factory=lambda: HostMemoryGrowthRule())
    nccl_errors: NcclRule = Field(default_factory=lambda: NcclRule())
    loss_stalled: LossStalledRule = Field(default_factory=lambda: LossStalledRule())
    model_cache_full: CacheFullRule = Field(default_factory=lambda: CacheFullRule())


class AlertsFile(Strict):
    alerts: AlertRules = Field(default_factory=lambda: AlertRules())


@dataclass
class Alert:
    name: str
    host: str
    severity: str
    message: str
    value: Optional[float]
    threshold: Optional[float]
    gpu: Optional[int] = None
    run_id: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def packaged_path() -> Path:
    from importlib import resources

    return Path(str(resources.files("labctl") / "data" / "playbooks" / "alerts.yaml"))


def default_path(inventory_path: Path | None = None) -> Path:
    """playbooks/alerts.yaml beside the inventory, then its parent, then here (like orchestra.yaml)."""
    from labctl.documents.defaults import find_default
    from labctl.hosts.context import resolve_inventory_path

    return find_default(DEFAULT_ALERTS, resolve_inventory_path(inventory_path), "alerts file", "--alerts")


def rules_for(given: Path | None, inventory_path: Path | None) -> AlertRules:
    """The rules a command uses: the file given (--alerts), else alerts.yaml where the default
    files are found, else seed 004's thresholds as packaged: alerts need no file to work."""
    from labctl.output.errors import InputError

    if given is not None:
        return load_rules(given)
    try:
        found = default_path(inventory_path)
    except InputError:  # no file anywhere: the defaults; a broken file found is still an error
        return load_rules(None)
    return load_rules(found)


def load_rules(path: Path | None) -> AlertRules:
    """The alerts file at `path`, validated (every problem at once, exit 2); None: the packaged defaults."""
    path = packaged_path() if path is None else Path(path)
    return load_model(
        path,
        "alerts file",
        AlertsFile,
        missing_hint=f"Pass one with --alerts, or get the default {DEFAULT_ALERTS} with `labctl init`.",
        shape="an alerts file is a mapping: alerts: {gpu_memory: {...}, ...}",
        then=f"`labctl status --alerts {shlex.quote(shown_path(path))}` reads it again",
    ).alerts


# --- judging ---------------------------------------------------------------------------------


def reading(value: Any) -> Optional[float]:
    """`value` as a float when it is a number a sample can hold, else None: true/false are no
    readings (bool is an int to Python), and an integer past a float's range is no reading either."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def streak_start(
    points: list[tuple[float, Optional[float]]], bad: Callable[[float], bool]
) -> Optional[float]:
    """The time since which every point (t, value) is `bad`, newest included; None if the newest is not."""
    since = None
    for t, value in sorted(points, key=lambda p: p[0], reverse=True):
        if value is None or not bad(value):
            break
        since = t
    return since


def growth_per_hour(points: list[tuple[float, float]]) -> Optional[float]:
    """Least-squares slope of (t, bytes) in bytes per hour; None with fewer than two times."""
    if len(points) < 2:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var <= 0:
        return None
    return sum((t - mt) * (v - mv) for t, v in points) / var * 3600.0


def _gpu_series(
    sample: dict[str, Any], index: int, key: str, now_value: Optional[float]
) -> list[tuple[float, Optional[float]]]:
    """(t, value) of one GPU from the history, ending with the sample's own value (which wins
    over a history record of the same moment)."""
    now = float(sample["time"])
    points: list[tuple[float, Optional[float]]] = []
    for record in sample.get("history") or []:
        for g in record.get("gpus") or []:
            if g.get("index") == index and float(record["t"]) < now:
                points.append((float(record["t"]), g.get(key)))
    points.append((now, now_value))
    return points


def _pct(used: Optional[int], total: Optional[int]) -> Optional[float]:
    return 100.0 * used / total if used is not None and total else None


def _gpu_alerts(host: str, sample: dict[str, Any], rules: AlertRules) -> list[Alert]:
    out: list[Alert] = []
    now = float(sample["time"])
    runs = sample.get("runs") or []
    # The GPUs runs train on; a run without CUDA_VISIBLE_DEVICES sees every GPU.
    every_gpu = any(run.get("gpus") is None for run in runs)
    training = {i for run in runs for i in run.get("gpus") or []}
    started = [r["started"] for r in runs if r.get("started") is not None]
    run_since = min(started) if started else None
    mem, idle, temp = rules.gpu_memory, rules.gpu_idle_while_training, rules.gpu_temperature
    for gpu in sample.get("gpus") or []:
        index = gpu.get("index")
        label = f"GPU {index} ({gpu.get('name') or 'unknown'})"
        pct = _pct(gpu.get("memory_used_bytes"), gpu.get("memory_total_bytes"))
        if mem.enabled and pct is not None:
            since = streak_start(
                _gpu_series(sample, index, "memory_used_pct", pct), lambda v: v > mem.above_pct
            )
            if since is not None and now - since >= mem.for_minutes * 60:
                out.append(
                    Alert(
                        "gpu_memory",
                        host,
                        mem.severity,
                        f"{label} memory {pct:.0f}% used, above {mem.above_pct:g}% for "
                        f"{(now - since) / 60:.0f} min",
                        round(pct, 1),
                        mem.above_pct,
                        gpu=index,
                    )
                )
        util = gpu.get("utilization_pct")
        in_run = bool(runs) and (every_gpu or index in training)
        if idle.enabled and in_run and util is not None:
            since = streak_start(
                _gpu_series(sample, index, "utilization_pct", util), lambda v: v < idle.below_pct
            )
            if since is not None and run_since is not None:
                since = max(since, run_since)
            if since is not None and now - since >= idle.for_minutes * 60:
                out.append(
                    Alert(
                        "gpu_idle_while_training",
                        host,
                        idle.severity,
                        f"{label} {util}% busy while a run trains, below {idle.below_pct:g}% for "
                        f"{(now - since) / 60:.0f} min",
                        float(util),
                        idle.below_pct,
                        gpu=index,
                    )
                )
        celsius = gpu.get("temperature_c")
        if temp.enabled and celsius is not None and celsius > temp.above_c:
            out.append(
                Alert(
                    "gpu_temperature",
                    host,
                    temp.severity,
                    f"{label} at {celsius} °C, above {temp.above_c:g} °C",
                    float(celsius),
                    temp.above_c,
                    gpu=index,
                )
            )
    return out


def _memory_alert(host: str, sample: dict[str, Any], rules: AlertRules) -> list[Alert]:
    rule = rules.host_memory_growth
    if not rule.enabled:
        return []
    now = float(sample["time"])
    window = rule.window_minutes * 60
    points = [
        (float(r["t"]), float(r["memory_used_bytes"]))
        for r in sample.get("history") or []
        if r.get("memory_used_bytes") is not None and now - window <= r["t"] < now
    ]
    points.append((now, float(sample["memory"]["used_bytes"])))
    if not points or now - min(t for t, _ in points) < window / 2:
        return []  # too short a stretch to call a rate per hour
    rate = growth_per_hour(points)
    if rate is None or rate / GB <= rule.above_gb_per_hour:
        return []
    return [
        Alert(
            "host_memory_growth",
            host,
            rule.severity,
            f"memory use growing {rate / GB:.1f} GB/hour over the last {(now - min(t for t, _ in points)) / 60:.0f} "
            f"min, above {rule.above_gb_per_hour:g} GB/hour (a leak?)",
            round(rate / GB, 2),
            rule.above_gb_per_hour,
        )
    ]


def _run_alerts(host: str, sample: dict[str, Any], rules: AlertRules) -> list[Alert]:
    out: list[Alert] = []
    for run in sample.get("runs") or []:
        run_id = run.get("run_id")
        nccl = rules.nccl_errors
        count = run.get("nccl_errors") or 0
        if nccl.enabled and count > 0:
            last = run.get("last_nccl_error") or ""
            out.append(
                Alert(
                    "nccl_errors",
                    host,
                    nccl.severity,
                    f"run {run_id}: {count} NCCL error line{'s' if count != 1 else ''} in its logs"
                    + (f"; newest: {last}" if last else ""),
                    float(count),
                    0.0,
                    run_id=run_id,
                )
            )
        stall = rules.loss_stalled
        # The steps are what the run's script logged: judged only when both are numbers.
        step, best_step = reading(run.get("step")), reading(run.get("best_step"))
        if stall.enabled and step is not None and best_step is not None and step - best_step >= stall.steps:
            out.append(
                Alert(
                    "loss_stalled",
                    host,
                    stall.severity,
                    f"run {run_id}: loss not improved for {step - best_step:.0f} steps (best {run.get('best_loss')} "
                    f"at step {run.get('best_step')}, now {run.get('loss')} at step {run.get('step')})",
                    step - best_step,
                    float(stall.steps),
                    run_id=run_id,
                )
            )
    return out


def _cache_alert(host: str, sample: dict[str, Any], rules: AlertRules) -> list[Alert]:
    rule = rules.model_cache_full
    cache = sample.get("cache")
    if not rule.enabled or not cache or not cache.get("mounted"):
        return []
    pct = _pct(cache.get("used_bytes"), cache.get("size_bytes"))
    if pct is None or pct <= rule.above_pct:
        return []
    return [
        Alert(
            "model_cache_full",
            host,
            rule.severity,
            f"model cache {cache.get('path')} {pct:.0f}% full, above {rule.above_pct:g}%",
            round(pct, 1),
            rule.above_pct,
        )
    ]


def evaluate(host_name: str, sample: dict[str, Any], rules: AlertRules) -> list[Alert]:
    """Every alert `sample` (one `monitor.status` answer) raises under `rules`; pure."""
    return (
        _gpu_alerts(host_name, sample, rules)
        + _memory_alert(host_name, sample, rules)
        + _run_alerts(host_name, sample, rules)
        + _cache_alert(host_name, sample, rules)
    )
