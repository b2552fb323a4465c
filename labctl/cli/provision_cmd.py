"""`labctl provision`: apply a playbook's resources to hosts, idempotently."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from labctl.cli.common import InventoryOpt, JsonOpt, LimitOpt, VerboseOpt
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context


def provision(
    ctx: typer.Context,
    playbook: Annotated[
        Optional[Path],
        typer.Option(
            "--playbook",
            "-p",
            help="Playbook YAML. Default: playbooks/provision.yaml beside the inventory, else in the current folder.",
            show_default=False,
        ),
    ] = None,
    limit: LimitOpt = None,
    tags: Annotated[
        Optional[str],
        typer.Option("--tags", "-t", help="Only resources with these types or tags (comma list)."),
    ] = None,
    skip_tags: Annotated[
        Optional[str], typer.Option("--skip-tags", help="Leave out resources with these types or tags.")
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Compute and show every change; change nothing.")
    ] = False,
    diff: Annotated[bool, typer.Option("--diff", help="Show file diffs.")] = False,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Bring hosts to the state a playbook describes: RAM cache, torch env, cron jobs, files.

    Each resource reads the host's state, plans the change as data, applies it and reads
    it back to verify. A second run changes nothing. Hosts run in parallel and one host
    failing never stops the others; on a host, a failed resource stops the ones after it.

    Examples:

        labctl provision --check --diff          # what would change, nothing changed

        labctl provision --tags model_cache,cron --limit m5

        labctl provision --skip-tags torch --json
    """
    from rich.markup import escape

    from labctl.hosts.fanout import exit_code
    from labctl.inventory.select import select_hosts
    from labctl.provision.engine import ResourceResult
    from labctl.provision.engine import provision as run_provision
    from labctl.provision.playbook import load_playbook, parse_tags, skipped_plays

    def work(c: Context) -> Outcome:
        book = load_playbook(playbook, c.inventory_path)
        hosts = select_hosts(c.inventory, limit)
        skipped = skipped_plays(book, c.inventory)

        def on_event(r: ResourceResult) -> None:
            if not c.json_mode:
                print_event(c.console, r, check, diff)

        results, host_results = run_provision(
            c,
            book,
            hosts,
            tags=parse_tags(tags, "--tags"),
            skip_tags=parse_tags(skip_tags, "--skip-tags"),
            check=check,
            on_event=on_event,
            on_wait=lambda msg: c.console.print(f"[yellow]{escape(msg)}[/]", soft_wrap=True),
        )
        data = {
            "playbook": str(book.path),
            "check": check,
            "skipped_plays": skipped,
            "results": [r.to_json() for r in results],
            "hosts": [
                {k: v for k, v in hr.to_json().items() if k not in ("data", "stdout", "stderr", "rc")}
                for hr in host_results
            ],
        }

        def render() -> None:
            if host_results or not skipped:
                print_recap(c.console, host_results, check)
            print_skipped_plays(c.console, book.path, skipped)

        return Outcome(data, render, exit_code(host_results))

    run_command(ctx, work, inventory, json_out, verbose)


STYLE = {"ok": "green", "changed": "yellow", "failed": "red", "skipped": "cyan"}


def print_event(console: Any, r: Any, check: bool, diff: bool) -> None:
    from rich.markup import escape

    word = "would change" if check and r.status == "changed" else r.status
    line = f"[{STYLE.get(r.status, '')}]{word:>12}[/] [bold]{r.host}[/] {escape(r.resource)} [dim]{r.seconds:.2f}s[/]"
    console.print(line, soft_wrap=True)
    for s in r.summary:
        console.print(f"{'':>13} - {escape(s)}", soft_wrap=True)
    if r.error:
        console.print(f"{'':>13} [red]{escape(r.error)}[/] {escape(r.hint or '')}", soft_wrap=True)
    if diff and r.diff:
        from rich.syntax import Syntax

        console.print(Syntax(r.diff, "diff", theme="ansi_dark", background_color="default", word_wrap=True))


def print_skipped_plays(console: Any, path: Path, skipped: list[dict[str, Any]]) -> None:
    from rich.markup import escape

    for p in skipped:
        what = f"play {p['play'] + 1}" + (f" {p['name']!r}" if p["name"] else "")
        where = f"{path}:{p['line']}"
        console.print(
            f"[cyan]skipped[/] {escape(what)} [dim]({escape(where)})[/]: {escape(p['reason'])}",
            soft_wrap=True,
        )


def print_recap(console: Any, host_results: Any, check: bool) -> None:
    from rich.table import Table

    table = Table(
        title="provision --check (nothing was changed)" if check else "provision", title_justify="left"
    )
    for col in ("host", "ok", "changed", "failed", "skipped", "time", "detail"):
        table.add_column(
            col,
            justify="right" if col in ("ok", "changed", "failed", "skipped", "time") else "left",
            overflow="fold",
        )
    for hr in host_results:
        e = hr.extra
        table.add_row(
            hr.host,
            str(e.get("ok", 0)),
            f"[yellow]{e.get('changed', 0)}[/]" if e.get("changed") else "0",
            f"[red]{e.get('failed', 0)}[/]" if e.get("failed") else "0",
            str(e.get("skipped", 0)),
            f"{hr.seconds:.2f}s",
            _detail(hr),
        )
    console.print(table)


def _detail(hr: Any) -> str:
    """Why a host did not end ok: its own error (it failed before any resource ran, or was
    unreachable), else the resource that failed. Empty for a host that is fine."""
    from rich.markup import escape

    if hr.ok:
        return ""
    word = "" if hr.status == "failed" else f"{hr.status}: "
    if hr.error:
        hint = f" [dim]{escape(hr.hint)}[/]" if hr.hint else ""
        return f"[red]{word}[/]{escape(hr.error)}{hint}"
    failed = [r for r in hr.data or [] if r.status == "failed"]
    if failed:
        r = failed[0]
        return f"[red]{escape(r.resource)}:[/] {escape(r.error or 'failed')}"
    return f"[red]{hr.status}[/]"
