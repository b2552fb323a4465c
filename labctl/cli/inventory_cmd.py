"""`labctl inventory validate|show`: load and check the inventory, and print it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from labctl.cli.common import InventoryOpt, JsonOpt, VerboseOpt
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context

app = typer.Typer(help="Load, check and print the inventory.", no_args_is_help=True)


@app.command()
def validate(
    ctx: typer.Context, inventory: InventoryOpt = None, json_out: JsonOpt = False, verbose: VerboseOpt = 0
) -> None:
    """Check the inventory: YAML syntax, unknown keys, types, addresses, key files.

    Every problem is listed with its file, line and field and what to write instead;
    the exit code is 2 when there is any.

    Example: labctl -i inventory/lab.yaml inventory validate
    """

    def work(c: Context) -> Outcome:
        inv = c.inventory
        data = {
            "ok": True,
            "path": str(inv.path),
            "lab": inv.lab,
            "hosts": list(inv.hosts),
            "roles": inv.roles(),
        }
        text = (
            f"[green]ok[/] {inv.path}: lab '{inv.lab}', {len(inv.hosts)} hosts ({', '.join(inv.hosts)}), "
            f"roles: {', '.join(inv.roles()) or 'none'}"
        )
        return Outcome(data, lambda: c.console.print(text))

    run_command(ctx, work, inventory, json_out, verbose)


@app.command()
def show(
    ctx: typer.Context, inventory: InventoryOpt = None, json_out: JsonOpt = False, verbose: VerboseOpt = 0
) -> None:
    """Print every host with its defaults merged in: address, roles, GPUs, RAM, cache, bond.

    Example: labctl inventory show --json | jq '.hosts.m5.gpus'
    """
    from rich.table import Table

    def work(c: Context) -> Outcome:
        inv = c.inventory
        data = {
            "lab": inv.lab,
            "path": str(inv.path),
            "hosts": {n: h.model_dump(mode="json", exclude_none=True) for n, h in inv.hosts.items()},
        }

        def render() -> None:
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
            c.console.print(table)

        return Outcome(data, render)

    run_command(ctx, work, inventory, json_out, verbose)
