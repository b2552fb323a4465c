"""`labctl ckpt pull`: a cloud session's checkpoints into the storage host's library."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from labctl.cli.common import InventoryOpt, JsonOpt, VerboseOpt, check_option
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context


def pull(
    ctx: typer.Context,
    source: Annotated[
        Path,
        typer.Argument(
            help="The session's output: a folder (a Kaggle /kaggle/working download, a SageMaker "
            "checkpoint folder) or its .tar, .tar.gz or .zip.",
            show_default=False,
        ),
    ],
    run: Annotated[
        Optional[str],
        typer.Option("--run", help="The run these checkpoints belong to (default: the session's settings)."),
    ] = None,
    storage: Annotated[
        Optional[str],
        typer.Option("--storage", help="The storage host (default: the one host with a storage section)."),
    ] = None,
    model: Annotated[
        Optional[str],
        typer.Option(
            "--model",
            help="Also put the newest checkpoint's weights into the model library as NAME, for `labctl cache sync NAME`.",
        ),
    ] = None,
    check: Annotated[bool, check_option("Validate and show what would be sent; change nothing.")] = False,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Bring a cloud session's checkpoints (step-XXXXXXXX.pt + .json, in any folder of SOURCE) into
    the checkpoint library on the storage host, so the next session, cloud or lab, resumes from
    them. Every checkpoint is re-hashed here first: a damaged one is named and nothing is pulled.
    Copies go in parts over SSH (no SFTP needed) and become visible only once verified there; a
    step already in the library is left alone, so pulling twice changes nothing.

    Examples:

        labctl ckpt pull ./kaggle-output --run phase1

        labctl ckpt pull output.tar.gz --model tinylm-phase1
    """
    from labctl.ckpt.pull import pull as run_pull
    from labctl.ckpt.render import PULL_PROGRESS, render_pull
    from labctl.output.progress import shown

    def work(c: Context) -> Outcome:
        progress = shown(c, PULL_PROGRESS)
        out = run_pull(c, source, run=run, storage=storage, model=model, progress=progress, check=check)

        return Outcome(out, lambda: render_pull(c.console, out, check))

    run_command(ctx, work, inventory, json_out, verbose)
