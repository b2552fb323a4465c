"""`labctl sim`: a simulated lab on this machine, one network namespace and sshd per host."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from labctl.cli.common import JsonOpt, VerboseOpt
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context

app = typer.Typer(
    help="A simulated lab on this machine: each host a network namespace with its own sshd, NICs "
    "shaped to 1 Gbit, and private /etc/fstab, crontabs and /mnt. Needs root.",
    no_args_is_help=True,
)

DirOpt = Annotated[
    Path,
    typer.Option("--dir", help="Where the sim keeps its inventory, keys and state.json."),
]
HostArg = Annotated[str, typer.Argument(help="A sim host, e.g. irina.", show_default=False)]


@app.command()
def up(
    ctx: typer.Context,
    hosts: Annotated[
        Optional[str],
        typer.Option(
            "--hosts",
            help="Comma-separated host names. Default: m5,irina,pharaoh,workstation.",
            show_default=False,
        ),
    ] = None,
    count: Annotated[
        Optional[int],
        typer.Option("--count", help="Total hosts: the names first, then node01, node02, ...", min=1),
    ] = None,
    rate: Annotated[
        Optional[str],
        typer.Option("--rate", help="Link rate of each NIC, both directions (tc syntax). Default: 1gbit."),
    ] = None,
    dir: DirOpt = Path(".labctl/sim"),
    bridge: Annotated[
        Optional[str],
        typer.Option("--bridge", help="Bridge name, fixed when the sim is first built. Default: lcbr0."),
    ] = None,
    prefix: Annotated[
        Optional[str], typer.Option("--prefix", help="Namespace name prefix. Default: lc- (lc-m5, ...).")
    ] = None,
    subnet: Annotated[
        Optional[str],
        typer.Option("--subnet", help="IPv4 subnet; .1 is this machine. Default: 10.250.0.0/24."),
    ] = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Build the simulated lab, or bring it in line with the options: safe to run again.

    Writes DIR/inventory.yaml, DIR/keys/ (client key, known_hosts) and DIR/state.json.
    Running it again changes nothing but restarts dead sshds; options left out keep what the lab
    has. With --hosts/--count the lab becomes exactly those hosts; a new --rate re-shapes links.

    Example: sudo labctl sim up --count 16 && labctl -i .labctl/sim/inventory.yaml facts
    """
    from labctl import sim
    from labctl.sim.render import render_up

    names = [h for h in hosts.split(",")] if hosts is not None else None

    def work(c: Context) -> Outcome:
        lab = sim.up(
            dir,
            hosts=names,
            count=count,
            rate=rate,
            bridge=bridge,
            prefix=prefix,
            subnet=subnet,
            console=c.console,
        )

        return Outcome(lab.as_dict(), lambda: render_up(c.console, lab, verbose))

    run_command(ctx, work, None, json_out, verbose)


@app.command()
def status(
    ctx: typer.Context,
    dir: DirOpt = Path(".labctl/sim"),
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Show each sim host: namespace, address, sshd pid, whether sshd runs and port 22 answers.

    Exits 1 when a host is down.

    Example: sudo labctl sim status --json
    """
    from labctl import sim
    from labctl.sim.render import render_status

    def work(c: Context) -> Outcome:
        rows = sim.status(dir)
        down = [r.name for r in rows if not r.reachable]

        return Outcome(
            {"dir": str(dir.resolve()), "hosts": [r.as_dict() for r in rows]},
            lambda: render_status(c.console, rows, dir),
            1 if down else 0,
        )

    run_command(ctx, work, None, json_out, verbose)


@app.command()
def down(
    ctx: typer.Context,
    dir: DirOpt = Path(".labctl/sim"),
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Remove the simulated lab: exactly the namespaces, links, rule and files `up` recorded.

    Every process left in a host's namespace is killed. Nothing recorded: nothing to do.

    Example: sudo labctl sim down
    """
    from labctl import sim
    from labctl.sim.render import render_down

    def work(c: Context) -> Outcome:
        removed = sim.down(dir, console=c.console)

        return Outcome(
            {"dir": str(dir.resolve()), "removed": removed}, lambda: render_down(c.console, removed, dir)
        )

    run_command(ctx, work, None, json_out, verbose)


@app.command()
def stop(
    ctx: typer.Context,
    host: HostArg,
    dir: DirOpt = Path(".labctl/sim"),
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Make a sim host look dead: kill its sshd and everything else running in it.

    Its port 22 then refuses connections until `labctl sim start HOST` (or `sim up`).

    Example: sudo labctl sim stop irina
    """
    from labctl import sim
    from labctl.sim.render import render_stopped

    def work(c: Context) -> Outcome:
        changed = sim.stop_host(dir, host)
        return Outcome({"host": host, "stopped": changed}, lambda: render_stopped(c.console, host, changed))

    run_command(ctx, work, None, json_out, verbose)


@app.command()
def start(
    ctx: typer.Context,
    host: HostArg,
    dir: DirOpt = Path(".labctl/sim"),
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Start a stopped sim host's sshd again.

    Example: sudo labctl sim start irina
    """
    from labctl import sim
    from labctl.sim.render import render_started

    def work(c: Context) -> Outcome:
        changed = sim.start_host(dir, host)
        return Outcome({"host": host, "started": changed}, lambda: render_started(c.console, host, changed))

    run_command(ctx, work, None, json_out, verbose)
