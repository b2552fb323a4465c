"""What `labctl sim` shows (rich, on stderr)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def render_up(console: Any, lab: Any, verbose: int) -> None:
    """What `sim up` changed, then the hosts and the inventory it wrote."""
    if lab.changes:
        for change in lab.changes:
            console.print(f"  [green]+[/] {change}")
    else:
        console.print(f"Nothing to change: the sim's {len(lab.hosts)} hosts are up.")
    console.print(
        f"[bold]{len(lab.hosts)}[/] hosts on {lab.bridge} ({lab.subnet}, {lab.rate}). "
        f"Inventory: [cyan]{_rel(lab.inventory_path)}[/]"
    )
    if verbose:
        for name, address in lab.hosts.items():
            console.print(f"  {name:<14} {address}")


def render_status(console: Any, rows: list[Any], dir: Path) -> None:
    """One row per sim host, or how to bring a sim up."""
    from rich.table import Table

    if not rows:
        console.print(f"No sim in {dir}. Bring one up: sudo labctl sim up --dir {dir}")
        return
    table = Table(title=f"sim in {dir}")
    for col in ("host", "namespace", "address", "sshd pid", "alive", "port 22"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r.name,
            r.namespace,
            r.address,
            str(r.sshd_pid or "-"),
            "[green]yes[/]" if r.alive else "[red]no[/]",
            "[green]open[/]" if r.reachable else "[red]refused[/]",
        )
    console.print(table)


def render_down(console: Any, removed: list[str], dir: Path) -> None:
    """What `sim down` removed."""
    if not removed:
        console.print(f"Nothing to remove in {dir}.")
    for item in removed:
        console.print(f"  [red]-[/] {item}")


def render_stopped(console: Any, host: str, changed: bool) -> None:
    console.print(f"Stopped {host}." if changed else f"{host} was not running.")


def render_started(console: Any, host: str, changed: bool) -> None:
    console.print(f"Started {host}." if changed else f"{host} is already running.")


def _rel(p: Path) -> str:
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)
