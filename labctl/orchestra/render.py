"""Tables for `labctl orchestra` and `labctl rotate` (rich, on stderr like all human output)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from labctl.output.fmt import fmt_age, fmt_duration

if TYPE_CHECKING:
    from rich.console import Console

    from labctl.orchestra.ask import AskResult
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
            f"{verb} take {result.plan.summary()}. Run without --check to carry it out.", soft_wrap=True
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
    table = Table(title="orchestra placement", title_justify="left", show_edge=False, pad_edge=False)
    for col in ("host", "GPU", "memory", "models", "free"):
        table.add_column(col, justify="right" if col in ("memory", "free") else "left")
    for r in view.placement.rows:
        models = ", ".join(f"{n} ({view.placement.needs[n]:.1f} GB)" for n in r.models) or "-"
        table.add_row(
            r.gpu.host,
            f"{r.gpu.index} {r.gpu.model}" + ("" if r.gpu.source == "detected" else " (declared)"),
            f"{r.gpu.memory_gb:g} GB",
            models,
            f"{r.free_gb:.1f} GB",
        )
    console.print(table)
    if view.models:
        _plan_models(console, view)
    for note in view.notes:
        console.print(f"[dim]{escape(note)}[/]", soft_wrap=True)
    for g, why in view.left_out:
        console.print(
            f"[dim]not for the orchestra: {escape(g.host)} GPU {g.index} {escape(g.model)}: {escape(why)}[/]"
        )
    cap = Table(title="capacity (models held at once)", title_justify="left", show_edge=False, pad_edge=False)
    for col in ("model", "needs", "here", "planned", "how"):
        cap.add_column(col)
    for c in view.capacity:
        how = "; ".join([*(f"{n} on {label}" for label, n in c.whole), *c.split]) or "-"
        cap.add_row(c.label, f"{c.need_gb:.1f} GB", str(c.count), c.seed, how)
    console.print(cap)
    for c in view.capacity:
        if c.note:
            console.print(f"[dim]{escape(c.label)}: {escape(c.note)}[/]", soft_wrap=True)
    console.print(
        f"{len(view.warm)} warm of a {view.library}-model library; a model's need is its gpu_gb, else its "
        "weights as the files say (x2 where labctl's server computes 16-bit weights in fp32) + 5% for "
        "activations + the KV cache of its context + the CUDA context; a model whose files were not read "
        "needs its size_gb x (1 + overhead.fraction) + the CUDA context.",
        soft_wrap=True,
    )
    if view.remote:
        _plan_remote(console, view)


def _plan_models(console: Console, view: PlacementView) -> None:
    table = Table(
        title="the library (format, weights and KV cache from the files)",
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    for col in ("model", "format", "engine", "params", "weights", "context", "KV cache", "needs", "from"):
        table.add_column(
            col, justify="right" if col in ("params", "weights", "KV cache", "needs") else "left"
        )
    for m in view.models:
        params = m.get("params")
        kv = m.get("kv_gb")
        table.add_row(
            escape(m["name"]) + (" [green]warm[/]" if m["name"] in view.warm else ""),
            escape(str(m.get("format") or "?")) + (f" {escape(str(m['dtype']))}" if m.get("dtype") else ""),
            escape(m["engine"]),
            "-" if params is None else _count(params),
            _size(m.get("weights_gb")),
            str(m["context"]),
            _size(kv),
            _size(m["need_gb"]),
            escape(m["source"]),
        )
    console.print(table)
    for m in view.models:
        for note in m.get("notes") or []:
            console.print(f"[yellow]{escape(m['name'])}: {escape(note)}[/]", soft_wrap=True)


def _plan_remote(console: Console, view: PlacementView) -> None:
    table = Table(
        title="remote tiers (asked beside the warm set; never contacted by plan)",
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    for col in ("name", "model", "API", "key", "at once", "$ / M tokens in, out", "share", "$ / month"):
        table.add_column(col)
    for r in view.remote:
        env = r["api_key_env"]
        key = (
            "none needed"
            if env is None
            else f"${env} " + ("set here" if r["key_set"] else "[red]not set here[/]")
        )
        price = r["price_per_mtok"]
        budget = r.get("budget_per_month")
        table.add_row(
            escape(r["name"]),
            escape(r["model"]),
            escape(r["base_url"]),
            key,
            str(r["concurrency"]),
            f"{price['input']:g}, {price['output']:g}",
            f"{r.get('share', 1.0):g}",
            "no limit" if budget is None else f"{budget:g}",
        )
    console.print(table)


def _size(gb: float | None) -> str:
    if gb is None:
        return "-"
    return f"{gb:.2f} GB" if gb >= 0.1 else f"{gb * 1000:.1f} MB"


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


SHOWN_CHARS = 48


def render_answers(console: Console, result: AskResult) -> None:
    table = Table(title="orchestra answers", title_justify="left", show_edge=False, pad_edge=False)
    for col in ("model", "latency", "tokens", "answer"):
        table.add_column(col, justify="right" if col in ("latency", "tokens") else "left")
    for a in result.answers:
        if a.ok:
            text = _printable(a.text or "")
            what = escape(text[:SHOWN_CHARS] + ("…" if len(text) > SHOWN_CHARS else ""))
            if a.retried:
                what = f"[yellow](answered by {escape(a.answered_by)})[/] {what}"
        else:
            what = f"[red]{escape(a.error or '')}[/]"
        table.add_row(escape(a.name), f"{a.latency_s:.3f} s", str(a.completion_tokens), what)
    console.print(table)
    for name in result.skipped:
        console.print(f"[dim]{escape(name)}: not asked, its key's variable is not set here[/]")
    console.print(
        f"{len(result.answers)} models asked at once in {result.cycle_s:.3f} s "
        f"(the latencies add up to {sum(a.latency_s for a in result.answers):.3f} s).",
        soft_wrap=True,
    )


def _printable(text: str) -> str:
    # These answers are raw model output: keep a terminal's control sequences out of the table.
    return "".join(c if c.isprintable() else "·" for c in text)


def _said(console: Console, text: str) -> None:
    console.print(f"[dim]{escape(text)}[/]", soft_wrap=True)


def _starting(console: Console, host: str, model: str, gpu: int | None) -> None:
    _said(console, f"{host}: starting {model} on GPU {gpu if gpu is not None else '-'}")


def _health(console: Console, host: str, model: Any, state: Any) -> None:
    _said(console, f"{host}: {model} {state}")


def _stopping(console: Console, host: str, models: list[str]) -> None:
    _said(console, f"{host}: stopping {', '.join(models)}")


def _syncing(console: Console, host: str, models: list[str], source: str) -> None:
    _said(console, f"{host}: syncing {', '.join(models)} into the RAM cache from {source}")


def _repaired(console: Console, note: str) -> None:
    _said(console, f"repaired {note}")


def _not_published(console: Console, host: str, error: Any) -> None:
    _said(console, f"{host}: the trainers' endpoints could not be rewritten: {error}")


def _waiting(console: Console, **fields: Any) -> None:
    from labctl.hosts.hostlock import waiting_text

    _said(console, waiting_text(**fields))


def _warming_first(console: Console) -> None:
    _said(console, "nothing is warm yet: starting the warm set first (not counted in the rotation)")


# How rotate / start / stop and `bench rotation` show the rotation's events: each one dim line.
ROTATION_PROGRESS: dict[str, Callable[..., None]] = {
    "starting": _starting,
    "health": _health,
    "stopping": _stopping,
    "syncing": _syncing,
    "repaired": _repaired,
    "not published": _not_published,
    "waiting": _waiting,
    "warming first": _warming_first,
}
