"""`labctl init [DIR]`: a starter inventory, the default playbooks and the examples, to edit."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from labctl.cli.common import JsonOpt
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context


def init(
    ctx: typer.Context,
    folder: Annotated[
        Path, typer.Argument(metavar="DIR", help="Folder for the lab's files (created if needed).")
    ] = Path("."),
    force: Annotated[bool, typer.Option("--force", help="Replace files that are already there.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Write a starter inventory (DIR/inventory/lab.yaml), the default playbooks (DIR/playbooks/)
    and the examples (DIR/inventory/examples/: the simulated lab's orchestras for phase 3, this
    machine as a sandbox host).

    The inventory is the seed lab's (four hosts: a training host with a RAM model cache, a
    storage host, an orchestrator, a Windows workstation); make its hosts yours. In DIR,
    labctl's default inventory (inventory/lab.yaml) is this one, so -i can be left out there.
    The playbooks are found beside the inventory by `labctl provision` and `labctl train`,
    from any folder. Files already there are left alone (nothing is written) unless --force.

    Examples:

        labctl init mylab && cd mylab && labctl inventory validate

        export LABCTL_INVENTORY=$PWD/mylab/inventory/lab.yaml
    """
    from labctl.documents.render import render_starter
    from labctl.documents.starter import INVENTORY, write_starter

    written = write_starter(folder, force)
    inv = folder / INVENTORY

    def work(c: Context) -> Outcome:
        return Outcome(
            {"folder": str(folder), "written": [str(p) for p in written], "inventory": str(inv)},
            lambda: render_starter(c.console, folder, written, inv),
        )

    # labctl init needs no inventory: the Context's is never read.
    run_command(ctx, work, json_out=json_out)
