"""Tables for `labctl orchestra` and `labctl rotate` (rich, on stderr like all human output)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from labctl.output.fmt import fmt_age, fmt_duration

if TYPE_CHECKING:
    from rich.console import Console

    from labctl.orchestra.decide import PlacementView
    from labctl.orchestra.rotate import RotationResult
    from labctl.orchestra.spec import Orchestra
    from labctl.orchestra.status import Status


def _when(at: float | None) -> str:
    if not at:
        return "-"
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(at))
    return f"{stamp} ({fmt_age(at, now)})" if at <= now else f"{stamp} (in {fmt_duration(at - now)})"


def gpu_cell(index: int | None, model: str | None, source: str | None) -> str:
    """A GPU as a table shows it; one the inventory declares but the host did not report (no
    driver, the simulated lab) is marked, so it is not taken for a card that was found."""
    if index is None:
        return "-"
    text = f"{index} {model or ''}".strip()
    return f"{text} (declared)" if source == "declared" else text


def render_status(console: Console, st: Status) -> None:
    table = Table(title="orchestra", title_justify="left", show_edge=False, pad_edge=False)
    for col in ("host", "model", "GPU", "port", "since", "health"):
        table.add_column(col)
    for r in st.rows:
        gpu = gpu_cell(r.get("gpu"), r.get("gpu_model"), r.get("gpu_source"))
        health = "[green]answers[/]" if r["healthy"] else f"[red]{escape(str(r.get('error') or 'down'))}[/]"
        table.add_row(
            r["host"],
            escape(r["name"]),
            escape(gpu),
            str(r.get("port") or "-"),
            _when(r.get("since")),
            health,
        )
    if st.rows:
        console.print(table)
    else:
        console.print("Nothing is warm. Load the warm set with `labctl orchestra start`.")
    console.print(
        f"{st.healthy} of {st.warm_size} warm models answer. Last rotation: {_when((st.last or {}).get('at'))}; "
        f"next: {_next_rotation(st)}. "
        f"RAM cache over the recorded rotations: {st.cache_hits} hits, {st.cache_misses} misses.",
        soft_wrap=True,
    )
    if st.rows and st.pinned_not_warm:
        names = ", ".join(st.pinned_not_warm)
        console.print(
            f"[yellow]pinned, not warm:[/] {escape(names)}; `labctl orchestra start` brings "
            f"{'it' if len(st.pinned_not_warm) == 1 else 'them'} in (make-before-break).",
            soft_wrap=True,
        )
    for n in st.notes:
        console.print(f"[yellow]needs repair[/] {escape(n)} (the next rotation repairs it)", soft_wrap=True)
    for n in st.others:
        console.print(f"[dim]another lab's[/] {escape(n)}", soft_wrap=True)
    sch = st.schedule
    if sch.get("hint"):
        lead = "to run it" if sch.get("installed") else "schedule it with"
        console.print(f"[yellow]{lead}:[/] {escape(sch['hint'])}", soft_wrap=True)
    if sch.get("also_on"):
        console.print(
            f"[yellow]rotation[/] also scheduled on {escape(', '.join(sch['also_on']))}: two schedules rotate "
            f"the same warm set; remove one with `labctl cron remove rotate --host HOST`.",
            soft_wrap=True,
        )


def _next_rotation(st: Status) -> str:
    """The next rotation as the installed schedule has it, or why there is none."""
    sch = st.schedule
    asked = f" (could not ask {', '.join(sch['unanswered'])})" if sch.get("unanswered") else ""
    if not sch.get("installed"):
        return (
            f"[red]not scheduled[/]: no host has labctl's rotate job{escape(asked)}, so nothing "
            f"rotates every {fmt_duration(st.every_s)} as the file says"
        )
    where = f"{escape(str(sch.get('schedule')))} on {escape(str(sch.get('host')))}"
    if not sch.get("daemon_running"):
        return f"[red]never[/]: {where} is installed, but no daemon there runs it"
    if not st.next_at:
        return f"[red]never[/]: {where} matches no date"
    return f"{_when(st.next_at)} ({where})"


def render_rotation(console: Console, result: RotationResult, orch: Orchestra) -> None:
    plan = result.plan
    verb = "would" if result.dry_run else ""
    for n in result.repairs:
        console.print(
            f"[yellow]{'would repair' if result.dry_run else 'repaired'}[/] {escape(n)}", soft_wrap=True
        )
    if not plan.steps:
        console.print(
            f"Nothing to do: {escape(plan.reason or 'the warm set is as planned')}.", soft_wrap=True
        )
        return
    table = Table(
        title=f"{result.kind}{' (dry run: nothing was changed)' if result.dry_run else ''}",
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    for col in ("step", "model", "host", "GPU", "mode"):
        table.add_column(col)
    if not result.dry_run:
        for col in ("cache", "load", "warm-up", "health", "stop"):
            table.add_column(col, justify="right")
    times = {(t.model, "start"): t for t in result.joined} | {(t.model, "stop"): t for t in result.left}
    for s in plan.steps:
        gpu = gpu_cell(s.gpu, s.gpu_model, s.gpu_source)
        row = [s.action, s.model, s.host, escape(gpu), s.mode or "-"]
        if not result.dry_run:
            t = times.get((s.model, s.action))
            if t is None:
                row += ["", "", "", "", ""]
            elif s.action == "start":
                cache = "hit" if t.cache_hit else f"{t.cache:.1f}s"
                row += [cache, f"{t.load:.2f}s", f"{t.warmup:.2f}s", f"{t.health + t.start:.2f}s", ""]
            else:
                row += ["", "", "", "", f"{t.stop:.2f}s"]
        table.add_row(*row)
    console.print(table)
    if result.dry_run:
        console.print(
            f"{verb} take {result.plan.summary()}. Run without --dry-run to carry it out.", soft_wrap=True
        )
    else:
        share = result.seconds / orch.every_s if orch.every_s else 0.0
        console.print(
            f"{result.kind}: {plan.summary()} in {fmt_duration(result.seconds)} "
            f"({share:.3%} of the {fmt_duration(orch.every_s)} cadence).",
            soft_wrap=True,
        )


def render_bench(console: Console, report: dict[str, Any]) -> None:
    seed = report["seed"]
    table = Table(
        title="bench rotation (per joining model)", title_justify="left", show_edge=False, pad_edge=False
    )
    for col in ("stage", "measured", "planned"):
        table.add_column(col, justify="right" if col != "stage" else "left")
    pm = report["per_model"]
    rows = [
        ("cache (sync if missing)", pm["cache"], None),
        ("load (files → device)", pm["load"], seed["per_model_load_s"]),
        ("warm-up (first forward)", pm["warmup"], seed["per_model_warmup_s"]),
        ("start + health wait", pm["start"] + pm["health"], None),
        ("stop (per leaving model)", pm["stop"], None),
    ]
    for name, got, want in rows:
        table.add_row(name, f"{got:.2f} s", "-" if want is None else f"{want:g} s")
    table.add_row("whole rotation", f"{report['rotation_s']:.2f} s", f"{seed['rotation_s']:g} s")
    share = report["share_of_cadence"]
    table.add_row(
        "share of the cadence",
        "-" if share is None else f"{share:.4%}",
        f"{seed['share_of_4h']:.2%} (of 4 h)",
    )
    console.print(table)
    console.print(
        f"Joined {', '.join(report['joined']) or '-'}; left {', '.join(report['left']) or '-'}. "
        f"Loading and warming by hand would take {report['bare_load_warmup_s']:.2f} s of it; labctl's orchestration "
        f"(process start, health checks, SSH, stops) added {report['orchestration_overhead_s']:.2f} s. "
        f"Cache: {report['cache_hits']} hits, {report['cache_misses']} misses.",
        soft_wrap=True,
    )


def render_plan(console: Console, view: PlacementView) -> None:
    view.render(console)
