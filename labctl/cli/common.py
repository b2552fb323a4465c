"""Options every command takes, and the Context they build.

Typer has no inherited options, so each command declares `InventoryOpt`, `JsonOpt` and
`VerboseOpt` and calls `make_context`; values given before the sub-command
(`labctl --json exec ...`) are remembered by the root callback and used as defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from labctl.context import Context

InventoryOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--inventory",
        "-i",
        help="Inventory YAML. Default: $LABCTL_INVENTORY, then inventory/lab.yaml.",
        show_default=False,
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Machine output: one JSON document on stdout, nothing else.")
]
VerboseOpt = Annotated[int, typer.Option("--verbose", "-v", count=True, help="More detail; repeat for more.")]
LimitOpt = Annotated[
    Optional[str],
    typer.Option(
        "--limit",
        "-l",
        help="Hosts to act on: a name, a comma list (m5,irina), a role (role:train), or a glob (node*).",
        show_default=False,
    ),
]


def make_context(
    ctx: typer.Context,
    inventory: Optional[Path] = None,
    json_out: bool = False,
    verbose: int = 0,
) -> Context:
    root = ctx.find_root().obj or {}
    return Context.create(
        inventory_path=inventory or root.get("inventory"),
        json_mode=json_out or bool(root.get("json")),
        verbose=max(verbose, int(root.get("verbose", 0))),
    )
