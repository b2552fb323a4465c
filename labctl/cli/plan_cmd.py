"""`labctl plan week`: a week of training sessions over free cloud GPU quotas and the lab's GPUs."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from labctl.cli.common import InventoryOpt, JsonOpt
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context

app = typer.Typer(
    help="Plan training over time-boxed GPU quotas (Kaggle, SageMaker, the lab).", no_args_is_help=True
)


def _start(text: Optional[str]) -> datetime:
    """--start as given (a date alone: its 00:00); without it the next whole hour, not today's 00:00 long past."""
    from labctl.output.errors import InputError
    from labctl.plan.schedule import plan_start

    if text is None:
        return plan_start(datetime.now())
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise InputError(
            f"--start {text!r} is not a date.",
            "Write it as YYYY-MM-DD or YYYY-MM-DDTHH:MM, e.g. --start 2026-11-30 or --start 2026-11-30T09:00.",
        ) from None
    if not when.tzinfo:
        return when
    # An offset given (Z, +01:00) is converted: the plan is drawn and printed in local time.
    try:
        return when.astimezone().replace(tzinfo=None)
    except OverflowError:  # 0001-01-01T00:00+05:00 is a day before the first one in local time
        raise InputError(
            f"--start {text}: in local time it falls outside the dates Python can represent "
            f"({datetime.min.date()} to {datetime.max.date()}).",
            "Give a date between those, e.g. --start 2026-11-30 or --start 2026-11-30T09:00Z.",
        ) from None


@app.command("week")
def week(
    ctx: typer.Context,
    file: Annotated[
        Optional[Path],
        typer.Option(
            "--file",
            "-f",
            help="Plan file (default: playbooks/plan.yaml beside the inventory, then labctl's example: Kaggle's and SageMaker's free quotas).",
        ),
    ] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Also write a Gantt chart PNG here.")] = None,
    start: Annotated[
        Optional[str],
        typer.Option(
            "--start",
            help="When the plan starts, YYYY-MM-DD (00:00) or YYYY-MM-DDTHH:MM; its week is that day's (default: the next whole hour).",
        ),
    ] = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Schedule the plan's jobs over the platforms' quotas for one week: which job runs where and
    when, from which step to which, the checkpoint hand-offs between sessions, the hours left
    unused and when each job finishes. Tokens/s come from `labctl train` runs on the lab where
    there are any (the run records beside the inventory), else from the plan file, else scaled
    from another GPU's figure by a published table that the output names.

    Examples:

        labctl plan week

        labctl plan week -f playbooks/plan.yaml --plot week.png --start 2026-11-30
    """
    from labctl.output.errors import InputError, install_extra
    from labctl.plan import spec
    from labctl.plan.render import render_week
    from labctl.plan.schedule import schedule
    from labctl.plan.throughput import measured_rates
    from labctl.train.runs import runs_dir

    first = _start(start)

    def work(c: Context) -> Outcome:
        plan_file = file
        if plan_file is None:
            try:
                plan_file = spec.default_path(c.inventory_path)
            except InputError:  # no plan of the lab's own: seed 001's, as packaged
                plan_file = spec.packaged_path()
        plan = spec.load_plan(plan_file)
        result = schedule(plan, measured_rates(runs_dir(c.inventory_path)), first)
        if plot is not None:
            try:
                from labctl.plan.gantt import write_gantt

                write_gantt(result, plot)
            except ImportError:
                raise InputError(
                    "--plot needs matplotlib, which is not installed.",
                    f"Install labctl's plot extra ({install_extra('plot')}), or leave out --plot.",
                ) from None
        doc = result.to_json()
        doc["plan_file"] = str(plan_file)
        doc["plot"] = str(plot) if plot is not None else None

        return Outcome(doc, lambda: render_week(c.console, result, plan_file, plot))

    run_command(ctx, work, inventory, json_out)
