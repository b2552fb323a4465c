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

    from labctl.inventory.render import render_valid

    def work(c: Context) -> Outcome:
        inv = c.inventory
        data = {
            "ok": True,
            "path": str(inv.path),
            "lab": inv.lab,
            "hosts": list(inv.hosts),
            "roles": inv.roles(),
        }
        return Outcome(data, lambda: render_valid(c.console, inv))

    run_command(ctx, work, inventory, json_out, verbose)


@app.command()
def show(
    ctx: typer.Context, inventory: InventoryOpt = None, json_out: JsonOpt = False, verbose: VerboseOpt = 0
) -> None:
    """Print every host with its defaults merged in: address, roles, GPUs, RAM, cache, bond.

    Example: labctl inventory show --json | jq '.hosts.m5.gpus'
    """
    from labctl.inventory.render import render_hosts

    def work(c: Context) -> Outcome:
        inv = c.inventory
        data = {
            "lab": inv.lab,
            "path": str(inv.path),
            "hosts": {n: h.model_dump(mode="json", exclude_none=True) for n, h in inv.hosts.items()},
        }

        return Outcome(data, lambda: render_hosts(c.console, inv))

    run_command(ctx, work, inventory, json_out, verbose)
