"""The one frame every command runs in: Context in, connections closed, JSON or text out, exit code.

A command checks what it can without a Context (its arguments), then hands `run_command` its
work: a function of the Context that returns an `Outcome`. The runner builds the Context from
the command's options and the root's, closes its connections whether the work returned or
raised, then prints the Outcome's document with --json or calls its renderer otherwise, and
exits with the Outcome's code, the same in both modes. Errors the work raises (LabctlError,
Ctrl-C) pass through to `labctl.cli.app.main`, which reports them.

A command whose work shows things as it goes and has nothing left to print at the end (a
watch, a server) returns None from its work: it exits 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Optional

import typer

from labctl.cli.common import make_context
from labctl.hosts.context import Context


@dataclass
class Outcome:
    """What a command's work found: `data` is the document --json prints, `render` shows it to a
    person (it runs after the connections are closed), `code` is the exit code in both modes."""

    data: Any
    render: Callable[[], None]
    code: int = 0


def run_command(
    ctx: typer.Context,
    work: Callable[[Context], Optional[Outcome]],
    inventory: Optional[Path] = None,
    json_out: bool = False,
    verbose: int = 0,
) -> NoReturn:
    c = make_context(ctx, inventory, json_out, verbose)
    try:
        outcome = work(c)
    finally:
        c.close()
    if outcome is None:
        raise typer.Exit(0)
    if c.json_mode:
        c.emit(outcome.data)
    else:
        outcome.render()
    raise typer.Exit(outcome.code)
