"""The recap table printed after every fan-out: host, status, duration, what went wrong."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from labctl.hosts.fanout import HostResult

STATUS_STYLE = {
    "ok": "green",
    "changed": "yellow",
    "skipped": "cyan",
    "failed": "red",
    "unreachable": "red",
    "auth": "red",
    "hostkey": "bold red",
    "timeout": "red",
    "cancelled": "magenta",
}


def recap_table(results: Sequence[HostResult], title: str = "recap") -> Table:
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("host", style="bold")
    table.add_column("status")
    table.add_column("rc", justify="right")
    table.add_column("time", justify="right")
    table.add_column("detail", overflow="fold")
    for r in results:
        style = STATUS_STYLE.get(r.status, "")
        detail = r.error or ""
        if r.hint and not r.ok:
            detail = f"{detail} [dim]{r.hint}[/]" if detail else r.hint
        table.add_row(
            r.host,
            f"[{style}]{r.status}[/]" if style else r.status,
            "" if r.rc is None else str(r.rc),
            f"{r.seconds:.2f}s",
            detail,
        )
    return table


def print_recap(console: Console, results: Sequence[HostResult], title: str = "recap") -> None:
    console.print(recap_table(results, title))
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    console.print(f"[dim]{len(results)} host{'s' if len(results) != 1 else ''}: {summary}[/]")
