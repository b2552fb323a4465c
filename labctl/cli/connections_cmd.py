"""`labctl connections [close [HOST] | stop]`: what the connection keeper holds (labctl.keeper)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from labctl.cli.common import InventoryOpt, JsonOpt, VerboseOpt
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context

app = typer.Typer(
    help=(
        "The SSH connections kept open between commands (defaults: connections: {persist: 10m}; "
        "0 turns keeping off). Without a command: list them, with host, since when, idle time, "
        "commands served and the agent kept running there.\n\n"
        "Examples:\n\n"
        "    labctl connections\n\n"
        "    labctl connections close m5     # the next command to m5 connects anew\n\n"
        "    labctl connections stop         # the keeper closes everything and exits"
    ),
    invoke_without_command=True,
)


def keeper_state(c: Context) -> dict[str, Any]:
    from labctl.keeper.client import keeper_state as state

    return state(c.inventory_file(), c.inventory.connections.persist)


@app.callback()
def connections(
    ctx: typer.Context,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """List the kept connections: host, since when, idle for how long, commands served.

    Examples:

        labctl connections

        labctl connections close m5     # the next command to m5 connects anew

        labctl connections stop         # the keeper closes everything and exits
    """
    if ctx.invoked_subcommand is not None:
        return

    def work(c: Context) -> Outcome:
        state = keeper_state(c)
        return Outcome(state, lambda: _render(c, state))

    run_command(ctx, work, inventory, json_out, verbose)


def _render(c: Context, state: dict[str, Any]) -> None:
    from rich.table import Table

    from labctl.output.fmt import fmt_duration

    if not state["enabled"]:
        c.console.print("Connection keeping is off (connections: {persist: 0}, or $LABCTL_KEEPER=0).")
    if not state["running"]:
        c.console.print("No keeper is running for this inventory: the next command starts one.")
        return
    if not state["connections"]:
        c.console.print(f"The keeper (pid {state['pid']}) holds no connection.")
        return
    t = Table(title=f"kept connections (keeper pid {state['pid']}, persist {fmt_duration(state['persist'])})")
    for col in ("host", "address", "since", "idle", "commands", "kept agent"):
        t.add_column(col)
    now = time.time()
    for e in state["connections"]:
        idle = "running" if e.get("running") else fmt_duration(e["idle"])
        t.add_row(
            e["host"],
            f"{e['user']}@{e['address']}:{e['port']}",
            fmt_duration(now - e["since"]) + " ago",
            idle,
            str(e["served"]),
            ", ".join(f"pid {a['pid']}: {a['calls']} call(s)" for a in e.get("agents") or []) or "-",
        )
    c.console.print(t)


@app.command("close")
def close(
    ctx: typer.Context,
    host: Annotated[
        Optional[str], typer.Argument(help="A host name (default: every kept connection).")
    ] = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Close kept connections (a command running on one finishes first)."""
    from labctl.keeper import sock as ks
    from labctl.keeper.client import close_connections

    def work(c: Context) -> Outcome:
        from labctl.output.errors import InputError

        if host is not None and host not in c.inventory.hosts:
            raise InputError(
                f"No host {host!r} in {c.inventory_file()}.",
                f"Name one of: {', '.join(c.inventory.hosts)}; or leave HOST out to close every kept connection.",
            )
        path = c.inventory_file()
        try:
            closed = close_connections(path, host)
        except ks.KeeperUnavailable:
            closed = []
        data = {"closed": closed}
        return Outcome(
            data,
            lambda: c.console.print(
                f"closed: {', '.join(closed)}" if closed else "no kept connection to close"
            ),
        )

    run_command(ctx, work, inventory, json_out, verbose)


@app.command("stop")
def stop_(
    ctx: typer.Context,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Stop this inventory's keeper: it closes every connection and exits."""
    from labctl.keeper.client import stop

    def work(c: Context) -> Outcome:
        stopped = stop(c.inventory_file())
        return Outcome(
            {"stopped": stopped},
            lambda: c.console.print("keeper stopped" if stopped else "no keeper was running"),
        )

    run_command(ctx, work, inventory, json_out, verbose)
