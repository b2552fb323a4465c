"""What `labctl provision` (and `labctl cron`, which provisions through the same engine) shows:
one line per resource as it finishes, then a recap table per host (rich, on stderr)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def _waiting(console: Any, **fields: Any) -> None:
    from rich.markup import escape

    from labctl.hosts.hostlock import waiting_text

    console.print(f"[yellow]{escape(waiting_text(**fields))}[/]", soft_wrap=True)


def provision_progress(check: bool, diff: bool) -> dict[str, Callable[..., None]]:
    """How `provision` and `cron` show labctl.provision.engine's events: a resource's lines as
    it finishes (a change as "would change" under --check, with its diff under --diff), and a
    yellow line while another provision holds a host."""
    return {
        "resource": lambda console, result: print_event(console, result, check, diff),
        "waiting": _waiting,
    }


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
