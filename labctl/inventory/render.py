"""What `labctl inventory` shows (rich, on stderr)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from labctl.inventory.model import Inventory


def render_valid(console: Any, inv: Inventory) -> None:
    console.print(
        f"[green]ok[/] {inv.path}: lab '{inv.lab}', {len(inv.hosts)} hosts ({', '.join(inv.hosts)}), "
        f"roles: {', '.join(inv.roles()) or 'none'}"
    )


def render_hosts(console: Any, inv: Inventory) -> None:
    """Every host with its defaults merged in, one row each."""
    from rich.table import Table

    table = Table(title=f"{inv.lab} ({inv.path})", title_justify="left")
    for col in ("host", "address", "login", "os", "roles", "GPUs", "RAM", "model cache", "bond"):
        table.add_column(col, overflow="fold")
    for h in inv.hosts.values():
        gpus = ", ".join(f"{g.count}x {g.model} {g.memory_gb:g}GB" for g in h.gpus) or "-"
        login = "local" if h.connection == "local" else f"{h.user}@:{h.port}"
        cache = f"{h.model_cache.path} {h.model_cache.size_gb:g}GB" if h.model_cache else "-"
        bond = f"{h.bond.name} {h.bond.mode} {'+'.join(h.bond.interfaces)}" if h.bond else "-"
        table.add_row(
            h.name,
            h.address,
            login,
            h.os,
            ", ".join(h.roles),
            gpus,
            f"{h.ram_gb:g}GB" if h.ram_gb else "-",
            cache,
            bond,
        )
    console.print(table)
