"""What `labctl cache` shows (rich, on stderr): one table or a few lines per command, then the
hosts that failed and the local state their agents repaired."""

from __future__ import annotations

import time
from typing import Any


def print_failures(console: Any, results: Any) -> None:
    from labctl.output.console import render_error

    for r in results:
        if not r.ok:
            msg = r.error or r.status
            if not msg.startswith(r.host):
                msg = f"{r.host}: {msg}"
            render_error(console, "", f"{msg} {r.hint or ''}".strip())


def render_sync(console: Any, results: Any, verbose: int) -> None:
    from rich.table import Table

    from labctl.output.fmt import fmt_bytes, fmt_duration, fmt_rate

    table = Table(title="cache sync", title_justify="left")
    for col in ("host", "model", "result", "size", "copied", "resumed", "time", "rate"):
        right = col in ("size", "copied", "resumed", "time", "rate")
        table.add_column(col, justify="right" if right else "left", overflow="fold", no_wrap=right)
    for r in results:
        d = r.data or {}
        for m in d.get("models", []):
            action = m["action"]
            word = {
                "cached": "[green]cached[/]",
                "fetch": "[yellow]copied[/]",
                "resume": "[yellow]resumed[/]",
                "replace": "[yellow]replaced[/]",  # the source's files changed
            }.get(action, action)
            moved = action != "cached"
            table.add_row(
                r.host,
                m["name"],
                word,
                fmt_bytes(m["bytes"]),
                fmt_bytes(m.get("fetched_bytes")) if moved else "-",
                fmt_bytes(m.get("resumed_bytes")) if m.get("resumed_bytes") else "-",
                fmt_duration(d.get("seconds")) if moved else "-",
                fmt_rate(d.get("rate_bytes_per_s")) if moved else "-",
            )
    if table.rows:
        console.print(table)
    for r in results:
        d = r.data or {}
        for e in d.get("evicted", []):
            what = "partial copy of " if e.get("partial") else ""
            console.print(
                f"[yellow]evicted[/] {what}{e['name']} from {r.host} ({fmt_bytes(e['bytes'])}) to make room"
            )
        served = d.get("served") or {}
        if served and verbose:
            console.print(
                f"[dim]{d['source']} ({d['source_address']}:{d.get('port')}) sent {fmt_bytes(served.get('bytes_sent'))} "
                f"to {', '.join(served.get('peers', []))} over {d.get('streams')} streams[/]"
            )
    print_failures(console, results)


def render_status(console: Any, results: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    from labctl.output.fmt import fmt_age, fmt_bytes

    for r in results:
        if not r.ok:
            continue
        d = r.data
        now = float(d.get("now") or time.time())
        kind = d.get("fstype") if d.get("mounted") else "not a mount: size from the inventory"
        title = (
            f"{r.host}: {d['cache']} ({kind}) {fmt_bytes(d['used_bytes'])} of {fmt_bytes(d['capacity_bytes'])} used, "
            f"{fmt_bytes(d['free_bytes'])} free"
        )
        table = Table(title=escape(title), title_justify="left")
        for col in ("model", "size", "last used", "pinned", "verified", "source"):
            table.add_column(col, justify="right" if col == "size" else "left", overflow="fold")
        models = sorted(d.get("models", {}).values(), key=lambda m: -(m.get("last_used") or 0))
        for m in models:
            present = m.get("present", True)
            table.add_row(
                escape(m["name"]),
                fmt_bytes(m.get("bytes")),
                fmt_age(m.get("last_used"), now),
                "[bold]yes[/]" if m.get("pinned") else "",
                ("[green]yes[/] " + fmt_age(m.get("verified_at"), now))
                if present
                else "[red]missing on disk[/]",
                escape(str(m.get("source") or "").split(":")[0]),
            )
        for p in d.get("partials", []):
            pct = 100.0 * p["done_bytes"] / p["total_bytes"] if p.get("total_bytes") else 0.0
            table.add_row(
                f"[dim]{escape(p['name'])}[/]",
                fmt_bytes(p.get("total_bytes")),
                "",
                "",
                f"[yellow]partial {pct:.0f}%[/] (sync again to resume)",
                escape(str(p.get("source") or "").split(":")[0]),
            )
        for u in d.get("untracked", []):
            table.add_row(f"[dim]{escape(u)}[/]", "", "", "", "[dim]not labctl's[/]", "")
        if not table.rows:
            table.add_row("[dim](empty)[/]", "", "", "", "", "")
        console.print(table)
    print_failures(console, results)


def render_verify(console: Any, results: Any) -> None:
    from rich.table import Table

    from labctl.output.fmt import fmt_bytes, fmt_duration

    table = Table(title="cache verify", title_justify="left")
    for col in ("host", "model", "result", "size", "time", "detail"):
        table.add_column(col, justify="right" if col in ("size", "time") else "left", overflow="fold")
    for r in results:
        for m in (r.data or {}).get("models", []):
            status = m["status"]
            if status == "ok":
                word, detail = "[green]ok[/]", ""
            elif status in ("corrupt", "missing"):
                word = "[yellow]repaired[/]" if m.get("repaired") else f"[red]{status}[/]"
                files = ", ".join(b["path"] for b in m.get("bad", []))
                detail = (
                    "gone from the disk"
                    if status == "missing"
                    else f"{m.get('bad_chunks', 0)} bad chunk(s) in {files}"
                )
                if m.get("repaired"):
                    detail += f"; re-fetched {fmt_bytes(m.get('refetched_bytes'))}"
            else:
                word, detail = f"[red]{status.replace('_', ' ')}[/]", ""
            table.add_row(
                r.host, m["name"], word, fmt_bytes(m.get("bytes")), fmt_duration(m.get("seconds")), detail
            )
    if table.rows:
        console.print(table)
    print_failures(console, results)


def render_evict(console: Any, results: Any) -> None:
    from labctl.output.fmt import fmt_bytes

    for r in results:
        d = r.data or {}
        for e in d.get("evicted", []):
            kind = " (partial copy)" if e.get("partial") else ""
            console.print(f"[yellow]evicted[/] {r.host} {e['name']}{kind}: {fmt_bytes(e['bytes'])} freed")
        for n in d.get("not_cached", []):
            console.print(f"[dim]not cached[/] {r.host} {n}")
    print_failures(console, results)


def render_pin(console: Any, results: Any, name: str, pinned: bool) -> None:
    for r in results:
        if r.ok:
            word = "pinned" if pinned else "unpinned"
            note = "" if r.status == "changed" else " (already)"
            console.print(f"{r.host} {name}: {word}{note}")
    print_failures(console, results)


def print_repairs(console: Any, results: Any) -> None:
    """Damaged local state a host's agent found and repaired (a manifest, a copy's state)."""
    from rich.markup import escape

    for r in results:
        for note in (r.data or {}).get("repairs") or []:
            console.print(f"[yellow]repaired[/] {escape(r.host)}: {escape(note)}", soft_wrap=True)
