"""`labctl status` as a person reads it: one table for the lab that fits 80 columns, alerts below.

Pure: it takes the HostStatus list `collect` returns (shapes in the issue 15 contract) and builds
rich renderables, so the same code draws the one-shot table and every `--watch` frame, and unit
tests draw it at 80 columns from fixture samples. Any field of a sample may be missing or None (an
older agent, a host without GPUs): a cell then reads "-", never a traceback.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from rich.console import Group, RenderableType
from rich.text import Text

if TYPE_CHECKING:
    from rich.table import Table

from labctl.monitor.alerts import reading

GIB = 1 << 30
SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow"}


def render_status(
    statuses: list[Any], now: Optional[float] = None, every: Optional[float] = None
) -> RenderableType:
    """The whole screen: a heading line, the table, the alerts; `every` is --watch's period."""
    now = time.time() if now is None else now
    parts: list[RenderableType] = [_heading(statuses, now, every), host_table(statuses)]
    alerts = [a for s in statuses for a in (s.alerts or [])]
    if alerts:
        parts.append(alert_lines(alerts))
    return Group(*parts)


def _heading(statuses: list[Any], now: float, every: Optional[float]) -> Text:
    up = sum(1 for s in statuses if s.reachable)
    text = Text(f"lab status {time.strftime('%H:%M:%S', time.localtime(now))}  ")
    text.append(f"{up}/{len(statuses)} hosts up", style="green" if up == len(statuses) else "bold red")
    if every is not None:
        text.append(f"  every {every:g}s, Ctrl-C to stop", style="dim")
    return text


def host_table(statuses: list[Any]) -> Table:
    # Imported here: `labctl status --json` (status_json) draws no table.
    from rich import box
    from rich.table import Table

    # Widths add up to 80 with the padding: host 10, part 14, use 4, memory 10, °C 3, W 4, the
    # rest (detail, at least 16) folds. A long host name or GPU name is cut, never pushes the table wider.
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), show_edge=False, collapse_padding=True)
    table.add_column("host", max_width=10, no_wrap=True, overflow="ellipsis")
    table.add_column("part", max_width=14, no_wrap=True, overflow="ellipsis")
    table.add_column("use", justify="right", no_wrap=True, min_width=4)
    table.add_column("memory", justify="right", no_wrap=True, min_width=10)
    table.add_column("°C", justify="right", no_wrap=True)
    table.add_column("W", justify="right", no_wrap=True)
    table.add_column("detail", overflow="fold", ratio=1, min_width=16)
    for status in statuses:
        for j, row in enumerate(host_rows(status)):
            table.add_row(status.host if j == 0 else "", *row)
    return table


def host_rows(status: Any) -> list[tuple[Any, ...]]:
    """One host's rows, each (part, use, memory, °C, W, detail), cpu first."""
    if status.reachable and not status.sample:  # skipped (a Windows host): nothing to show
        why = (status.error or "").removeprefix("skipped: ")
        return [(Text("skipped", style="dim"), "", "", "", "", Text(why, style="dim"))]
    if not status.reachable or not status.sample:
        why = status.error or "no answer"
        detail = Text(why)
        if status.hint:
            detail.append(f" {status.hint}", style="dim")
        word = status.status if status.status not in ("ok", "skipped") else "unreachable"
        return [(Text(word, style="bold red"), "", "", "", "", detail)]
    s = status.sample
    rows: list[tuple[Any, ...]] = [_cpu_row(s)]
    cache = s.get("cache")
    if cache:
        rows.append(_cache_row(cache))
    gpus = s.get("gpus") or []
    for g in gpus:
        rows.append(_gpu_row(g))
    if not gpus and s.get("gpu_error"):
        rows.append(("gpus", "", "", "", "", Text(str(s["gpu_error"]), style="dim")))
    warm = s.get("warm") or []
    if warm:
        rows.append(("warm", str(len(warm)), "", "", "", ", ".join(_warm_text(w) for w in warm)))
    for r in s.get("runs") or []:
        rows.append(("run", _pct(_progress(r)), "", "", "", _run_text(r)))
    rows += _remote_rows(s.get("remote_spend"))
    # The host keeps its history itself; a clock that jumped or a file it could not write is said
    # here, or the gap in the history would go unexplained.
    for note in [*(s.get("history_notes") or []), *([s["history_error"]] if s.get("history_error") else [])]:
        rows.append(("history", "", "", "", "", Text(str(note), style="yellow")))
    return rows


def _cpu_row(s: dict[str, Any]) -> tuple[Any, ...]:
    cpu = s.get("cpu") or {}
    mem = s.get("memory") or {}
    load = cpu.get("load") or []
    detail = "load " + " ".join(_num(x, 2) for x in load[:3]) if load else ""
    return (
        f"cpu ×{cpu.get('count', '?')}",
        _pct(cpu.get("busy_pct")),
        _used_of(mem.get("used_bytes"), mem.get("total_bytes")),
        "",
        "",
        detail,
    )


def _cache_row(cache: dict[str, Any]) -> tuple[Any, ...]:
    size, used = cache.get("size_bytes"), cache.get("used_bytes")
    fill = (
        used / size * 100
        if isinstance(size, (int, float)) and size and isinstance(used, (int, float))
        else None
    )
    path = str(cache.get("path") or "")
    detail = Text(path) if cache.get("mounted") else Text(f"{path} not mounted", style="yellow")
    return ("cache", _pct(fill), _used_of(used, size), "", "", detail)


def _gpu_row(g: dict[str, Any]) -> tuple[Any, ...]:
    name = _short_gpu_name(str(g.get("name") or "?"))
    power = g.get("power_w")
    return (
        f"gpu{g.get('index', '?')} {name}",
        _pct(g.get("utilization_pct")),
        _used_of(g.get("memory_used_bytes"), g.get("memory_total_bytes")),
        "-" if g.get("temperature_c") is None else str(g["temperature_c"]),
        "-" if power is None else f"{power:.0f}",
        "",
    )


def _short_gpu_name(name: str) -> str:
    # "Tesla V100-PCIE-16GB" / "NVIDIA GeForce RTX 4090": the vendor and family words say nothing
    # the model does not, and the part column is 14 wide.
    for word in ("NVIDIA ", "Tesla ", "GeForce ", "Quadro ", "-PCIE", "-SXM2", "-SXM4", "-SXM5"):
        name = name.replace(word, "")
    return name


def _warm_text(w: dict[str, Any]) -> str:
    where = [f"gpu{w['gpu']}" if w.get("gpu") is not None else "", f":{w['port']}" if w.get("port") else ""]
    return f"{w.get('model', '?')} {''.join(where)}".strip()


def _remote_rows(spend: Any) -> list[tuple[Any, ...]]:
    """A row per remote tier: this month's spend on this host, as a share of its budget."""
    if not isinstance(spend, dict):
        return []
    rows: list[tuple[Any, ...]] = []
    month = str(spend.get("month") or "")
    for t in spend.get("tiers") or []:
        usd, budget = reading(t.get("usd")), reading(t.get("budget_per_month"))
        if usd is None:
            continue
        used = usd * 100 / budget if budget else None
        detail = Text(f"{t.get('tier', '?')} ${usd:,.2f}" + (f" of ${budget:,.2f}" if budget else ""))
        detail.append(f" in {month}")
        if budget and usd >= budget:
            detail.append("  budget reached: not asked until next month", style="yellow")
        rows.append(("remote", _pct(used), "", "", "", detail))
    for error in spend.get("errors") or []:
        rows.append(("remote", "", "", "", "", Text(str(error), style="yellow")))
    return rows


def _progress(r: dict[str, Any]) -> Optional[float]:
    step, steps = r.get("step"), r.get("steps")
    if not (isinstance(step, int) and isinstance(steps, int) and steps > 0):
        return None
    try:
        return step * 100 / steps
    except OverflowError:  # a script's step count past a float's range
        return None


def _run_text(r: dict[str, Any]) -> Text:
    # A run's figures are what its script logged (RUN in labctl/agent/monitor/status.py): shown when numbers.
    step, steps = _whole(r.get("step")), _whole(r.get("steps"))
    parts = [
        str(r.get("run_id", "?")),
        f"step {'-' if step is None else step}" + (f"/{steps}" if steps else ""),
    ]
    loss, speed = reading(r.get("loss")), reading(r.get("tokens_per_s"))
    if loss is not None:
        parts.append(f"loss {loss:.4g}")
    if speed is not None:
        parts.append(f"{_si(speed)} tok/s")
    parts += _phase3_parts(r)
    text = Text("  ".join(parts))
    from labctl.train.launch import zero_reward_hint

    if isinstance(r.get("programs_run"), int):  # what a reward of 0 means, and where to look
        text.append(zero_reward_hint(r, str(r.get("run_id") or "")), style="yellow")
    if r.get("nccl_errors"):
        text.append(f"  {r['nccl_errors']} NCCL errors", style="bold red")
    return text


def _phase3_parts(r: dict[str, Any]) -> list[str]:
    """A phase-3 run's reward, the share of its code that ran, and its slowest model's p95."""
    out = []
    reward, ran = reading(r.get("reward")), reading(r.get("exec_success_rate"))
    if reward is not None:
        out.append(f"reward {reward:.3f}")
    if ran is not None:
        out.append(f"code ran {ran:.0%}")
    models = r.get("orchestra_ms")
    p95s = (
        [reading(m.get("p95")) for m in models.values() if isinstance(m, dict)]
        if isinstance(models, dict)
        else []
    )
    slowest = max((v for v in p95s if v is not None), default=None)
    if slowest is not None:
        out.append(f"orchestra p95 {slowest:,.0f} ms ({len(p95s)} models)")
    return out


def alert_lines(alerts: list[Any]) -> Text:
    """Critical first, then warnings; one line each, folded at the screen's edge."""
    order = {"critical": 0, "warning": 1}
    text = Text()
    for a in sorted(alerts, key=lambda a: (order.get(a.severity, 2), a.host, a.name)):
        where = a.host
        if getattr(a, "gpu", None) is not None:
            where += f" gpu{a.gpu}"
        if getattr(a, "run_id", None):
            where += f" run {a.run_id}"
        if text:
            text.append("\n")
        text.append(f"{a.severity.upper()} ", style=SEVERITY_STYLE.get(a.severity, "bold"))
        text.append(f"{where}: ", style="bold")
        text.append(f"{a.message} ({a.name})")
    return text


def status_json(statuses: list[Any]) -> dict[str, Any]:
    """`status --json`: a row per host, `reachable` false with error and hint where it did not answer."""
    return {"hosts": [s.to_json() for s in statuses]}


def _pct(x: Any) -> str:
    return f"{x:.0f}%" if isinstance(x, (int, float)) else "-"


def _num(x: Any, digits: int) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "-"


def _used_of(used: Any, total: Any) -> str:
    """ "12.3/64G": GiB, one decimal for the used part where it fits in the column (10 wide)."""
    if not isinstance(total, (int, float)) or not total:
        return "-" if not isinstance(used, (int, float)) else f"{used / GIB:.1f}G"
    t = f"{total / GIB:.0f}"
    u = "-" if not isinstance(used, (int, float)) else f"{used / GIB:.1f}"
    if len(u) + len(t) + 2 > 10 and u != "-":
        u = f"{used / GIB:.0f}"
    return f"{u}/{t}G"


def _whole(x: Any) -> Optional[int]:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _si(x: float) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.1f}{unit}"
    return f"{x:.0f}"


def render_textfile(console: Any, target: Path, statuses: list[Any]) -> None:
    """`labctl metrics --textfile`: what was written, and each host exported as down."""
    down = [s for s in statuses if not s.reachable]
    firing = sum(len(s.alerts) for s in statuses)
    skipped = [f"{s.host}: {s.error}" for s in statuses if s.reachable and s.sample is None]
    note = f" (skipped {'; '.join(skipped)})" if skipped else ""
    console.print(f"wrote {target}: {len(statuses) - len(skipped)} hosts{note}, {firing} alerts firing")
    for s in down:
        console.print(f"{s.host}: {s.status} ({s.error}); exported as labctl_host_up 0")
