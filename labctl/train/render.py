"""What `labctl train` shows (rich, on stderr; command lines and job files on stdout)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from labctl.train.results import Attached, Detached, JobPreview, RunsStatus, Stopped, TrainResult
    from labctl.train.spec import LaunchSpec


class LiveView:
    """An attached run on the terminal: a header, then the chosen ranks' lines as they come."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def started(self, spec: LaunchSpec, log_dir: Path) -> None:
        from labctl.output.lines import HostLinePrinter

        self.printer = HostLinePrinter(self.console, max(len(n.host) for n in spec.nodes) + 3)
        self.console.print(
            f"[bold]train {spec.run_id}[/]: phase {spec.phase}, {spec.world_size} processes on "
            f"{', '.join(f'{n.host} ({n.nproc} {n.device})' for n in spec.nodes)}; "
            f"rendezvous {spec.head_address}:{spec.port}; logs {log_dir}"
        )

    def line(self, label: str, text: str, stream: str) -> None:
        self.printer.print(label, text, stream)

    def shows(self) -> dict[str, Callable[..., None]]:
        """The attached run's events (labctl.train.backends.Backend.submit) on this view."""
        return {
            "started": lambda _console, spec, log_dir: self.started(spec, log_dir),
            "line": lambda _console, label, text, stream: self.line(label, text, stream),
        }


def render_result(console: Console, result: TrainResult) -> None:
    from labctl.train import results

    if isinstance(result, results.DryRun):
        render_check(console, result.spec)
    elif isinstance(result, results.JobPreview):
        render_job_preview(console, result)
    elif isinstance(result, results.JobFiles):
        for p in result.files:
            console.print(f"wrote {p}")
        for note in result.notes:
            console.print(f"Note: {note}", markup=False)
        console.print(f"Submit with: {result.submit}")
    elif isinstance(result, results.Detached):
        render_detached(console, result)
    else:
        render_attached(console, result)


def render_detached(console: Console, result: Detached) -> None:
    from labctl.hosts.recap import print_recap

    print_recap(console, result.results, title=f"train {result.run_id} (detached)")
    if result.ok:
        console.print(
            f"Follow with: labctl train status {result.run_id}    End with: labctl train stop {result.run_id}"
        )


def render_attached(console: Console, result: Attached) -> None:
    from labctl.hosts.recap import print_recap

    run_id, steps, left = result.run_id, result.steps, result.remaining
    if result.results:
        print_recap(console, result.results, title=f"train {run_id}")
    if steps and steps[0].get("loss") is not None and steps[-1].get("loss") is not None:
        console.print(
            f"loss {steps[0]['loss']:.4f} at step {steps[0]['step']} → {steps[-1]['loss']:.4f} at step {steps[-1]['step']}"
            + (f"; {result.restarts} restart(s)" if result.restarts else "")
        )
    if left:
        console.print(f"[red]processes of {run_id} still running: {left}[/]")
    else:
        console.print(f"[dim]no process of {run_id} remains on {', '.join(result.checked)}[/]")
    if result.resume_step is not None:
        console.print(
            f"[yellow]time limit reached, resumable at step {result.resume_step}: "
            "run the same command again to resume[/]"
        )


def render_check(console: Console, spec: LaunchSpec) -> None:
    from labctl.train.duration import format_duration

    limit = spec.time_limit_s
    console.print(
        f"[bold]dry run[/] {spec.run_id}: phase {spec.phase}, {spec.world_size} processes, {spec.dist_backend}, "
        f"rendezvous {spec.head_address}:{spec.port}"
        + (f", time limit {format_duration(limit)} (pauses with a checkpoint before it)" if limit else "")
        + f". Preflight passed on {', '.join(n.host for n in spec.nodes)}; nothing launched."
    )
    for n in spec.nodes:
        gpus = f" GPUs {', '.join(n.gpu_names)}" if n.gpu_names else ""
        console.print(f"\n[cyan]{n.host}[/] ({n.nproc} × {n.device}{gpus}):")
        # stdout, unstyled: the line is meant to be copied or piped as it is
        typer.echo(spec.shell_line(n))


def render_job_preview(console: Console, result: JobPreview) -> None:
    spec = result.spec
    node = spec.nodes[0]
    gpus = f"{result.gpus_per_node} GPUs" if result.gpus_per_node else "CPUs"
    console.print(
        f"[bold]dry run[/] {spec.run_id}: phase {spec.phase} as a {result.backend} job on {spec.nnodes} "
        f"node{'s' if spec.nnodes != 1 else ''} × {gpus}, {node.nproc} {node.device} process"
        f"{'es' if node.nproc != 1 else ''} each ({spec.world_size} in all, {spec.dist_backend}). "
        "No lab host asked; nothing written."
    )
    for f in result.files:
        if f.text is None:
            console.print(f"\n[cyan]{f.name}[/] ({f.size} bytes, not text: not shown)")
            continue
        console.print(f"\n[cyan]{f.name}[/]:")
        typer.echo(f.text, nl=not f.text.endswith("\n"))
    for note in result.notes:
        console.print(f"Note: {note}", markup=False)


def render_settings(console: Console, rows: list[dict[str, Any]], profiles: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(title="training settings (playbooks/train.yaml, --set KEY=VALUE)", title_justify="left")
    for col in ("setting", "default", "e.g.", "what it is"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["setting"], r["default"], r["example"], r["meaning"])
    console.print(table, markup=False)
    shown = Table(title="profiles (--profile NAME; --set wins over them)", title_justify="left")
    for col in ("profile", "sets", "what it is for"):
        shown.add_column(col, overflow="fold")
    for p in profiles:
        shown.add_row(p["profile"], " ".join(p["sets"]), p["meaning"])
    console.print(shown, markup=False)


def render_backends(console: Console, rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(title="train backends (--backend NAME) and their options", title_justify="left")
    for col in ("backend", "option", "type", "default", "what it is"):
        table.add_column(col, overflow="fold")
    for row in rows:
        if not row["options"]:
            table.add_row(row["backend"], "(none)", "", "", "")
        for o in row["options"]:
            default = "" if o["default"] is None else str(o["default"])
            table.add_row(row["backend"], o["flag"], o["type"], default, o["help"])
    console.print(table, markup=False)


def render_status(console: Console, result: RunsStatus) -> None:
    from rich.table import Table

    from labctl.train.launch import format_event

    if not result.rows:
        console.print(f"No runs recorded in {result.root}.")
        return
    table = Table(title="training runs")
    table.add_column("run", no_wrap=True)
    for col in ("phase", "state", "hosts", "last event"):
        table.add_column(col)
    for r in result.rows:
        event = result.last_event(r)
        # A host that could not say (unreachable, failed) says why beside its state.
        per_host = ", ".join(
            f"{h}: {s.get('state')}" + (f" ({s['error']})" if s.get("error") else "")
            for h, s in r["host_state"].items()
        ) or ", ".join(r["hosts"])
        state = r.get("state", "?")
        if state == "paused" and r.get("resume_step") is not None:
            state = f"paused (resumable at step {r['resume_step']})"
        if state == "failed" and r.get("reason"):
            state = f"failed: {r['reason']}"
        table.add_row(
            r["run_id"],
            str(r.get("phase")),
            state,
            per_host,
            format_event(event, r["run_id"]) if event else "",
        )
    console.print(table)


def render_show(console: Console, doc: dict[str, Any]) -> None:
    from labctl.train.launch import format_event, format_sample

    rec = doc["run"]
    console.print(
        f"[bold]{rec['run_id']}[/]: phase {rec.get('phase')}, {rec.get('state', '?')}, "
        f"hosts {', '.join(rec.get('hosts') or [])}; logs {rec.get('log_dir')}",
        soft_wrap=True,
        highlight=False,
    )
    if doc.get("last_event"):
        console.print(format_event(doc["last_event"], rec["run_id"]), markup=False, soft_wrap=True)
    for sample in doc.get("samples") or []:
        console.print("")
        console.print(format_sample(sample), markup=False, soft_wrap=True, highlight=False)


def render_stopped(console: Console, result: Stopped) -> None:
    if result.remaining:
        console.print(f"[red]still running after SIGKILL: {result.remaining}[/]")
    else:
        console.print(f"stopped {result.run_id}: no process of it remains on {', '.join(result.checked)}")
