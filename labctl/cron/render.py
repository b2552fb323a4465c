"""What `labctl cron` shows: the schedules table, jobs nothing runs, and an install's or a
removal's recap (rich, on stderr)."""

from __future__ import annotations

from typing import Any


def print_change(console: Any, out: Any, check: bool, title: str) -> None:
    """What `cron install` or `cron remove` did (or, with --check, would do), after its events."""
    from rich.markup import escape

    from labctl.provision.render import print_recap

    for note in out.notes:
        console.print(f"[cyan]{escape(note)}[/]", soft_wrap=True)
    print_recap(console, out.hosts, check)
    if "command" in out.info:
        console.print(
            f"{escape(title)} on [bold]{escape(out.info['host'])}[/] ({escape(out.info['schedule'])}): "
            f"{escape(out.info['command'])}",
            soft_wrap=True,
        )
        if "orchestra_file" in out.info:
            console.print(
                f"  by the orchestra file {escape(out.info['orchestra_file'])}, copied there as "
                f"{escape(out.info['orchestra_copy'])}",
                soft_wrap=True,
            )
        for comp in out.info.get("companions", []):
            console.print(
                f"  with {escape(comp['job'])} ({escape(comp['schedule'])}): {escape(comp['command'])}",
                soft_wrap=True,
            )


def print_jobs(console: Any, results: Any) -> None:
    import time

    from rich.markup import escape
    from rich.table import Table

    def at(t: Any) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))

    table = Table(title="labctl schedules", title_justify="left")
    for col in ("host", "job", "schedule", "command", "last run", "result", "next run"):
        table.add_column(col, overflow="fold")
    for r in results:
        for j in r.data or []:
            last = j.get("last") or {}
            when = at(last["end"]) if last.get("end") else "never"
            rc = last.get("rc")
            result = "" if not last else ("[green]0[/]" if rc == 0 else f"[red]{rc}[/]")
            if j.get("daemon_running") is False:
                upcoming = "[red]none: nothing runs it[/]"
            else:
                upcoming = at(j["next"]) if j.get("next") else ""
            table.add_row(
                r.host,
                escape(str(j.get("name"))),
                escape(str(j.get("schedule") or "")),
                escape(str(j.get("command") or j.get("line") or "")),
                when,
                result,
                upcoming,
            )
    console.print(table)


def print_idle(console: Any, results: Any) -> None:
    from rich.markup import escape

    from labctl.cron.install import idle_jobs, idle_text

    for r in results:
        if idle_jobs(r.data or []):
            what, fix = idle_text(r.host, r.data)
            console.print(f"[red]{escape(what)}.[/] {escape(fix)}", soft_wrap=True)
