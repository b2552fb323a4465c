"""`labctl cron install|list|remove`: labctl's scheduled jobs, run on the orchestrator host."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from labctl.cli.common import InventoryOpt, JsonOpt, VerboseOpt, check_option
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context

app = typer.Typer(
    help="Schedule labctl jobs (rotate, facts, ckpt-backup) on the orchestrator host, so they run with no laptop on.",
    no_args_is_help=True,
)

HostOpt = Annotated[
    Optional[str],
    typer.Option("--host", help="The host that runs the schedule (default: the one with role orchestrator)."),
]


@app.command("install")
def install(
    ctx: typer.Context,
    job: Annotated[
        str, typer.Argument(help="The job: rotate, facts, ckpt-backup or ckpt-verify.", show_default=False)
    ],
    every: Annotated[
        Optional[str],
        typer.Option(
            "--every", help="Period: 30m, 4h, 1d, ... (rotate: default the orchestra file's `every`)."
        ),
    ] = None,
    schedule: Annotated[
        Optional[str], typer.Option("--schedule", help="Cron fields instead, e.g. '0 */4 * * *'.")
    ] = None,
    daily: Annotated[bool, typer.Option("--daily", help="Once a day, at midnight: --every 1d.")] = False,
    file: Annotated[
        Optional[Path],
        typer.Option(
            "--file",
            "-f",
            help="rotate: the orchestra file the job rotates by, copied to the orchestrator. Default: "
            "the one `labctl rotate` finds (playbooks/orchestra.yaml beside the inventory, else here).",
            show_default=False,
        ),
    ] = None,
    host: HostOpt = None,
    check: Annotated[bool, check_option("Show what would change; change nothing.")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="Show file diffs.")] = False,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Install JOB on the orchestrator: labctl itself at this version, its own SSH key (made
    there; its public half authorised on every Linux host), a copy of the inventory, pinned
    host keys and playbooks, and the cron entry (flock-locked, logged to
    /var/log/labctl/JOB.log; a systemd timer where systemd runs). A second run changes nothing.
    A job may bring companions on their own schedule: ckpt-backup brings the weekly ckpt-verify
    (Sundays 06:00, after that night's backup has finished). rotate copies the orchestra file
    (-f, else the default `labctl rotate` reads) and runs by it; its `every` is the default period.
    The entry runs only where a cron daemon runs: `labctl doctor` checks it.

    Examples:

        labctl cron install rotate -f playbooks/orchestra.yaml

        labctl cron install facts --schedule '*/30 * * * *' --check --diff

        labctl cron install ckpt-backup --daily
    """
    from labctl.cron.every import resolve_schedule
    from labctl.cron.install import install as run_install
    from labctl.output.errors import InputError

    if daily:
        if every is not None or schedule is not None:
            raise InputError("Give --daily, --every or --schedule, not two of them.", "e.g. --daily.")
        every = "1d"

    def work(c: Context) -> Outcome:
        period = every
        orchestra_file = None
        if job == "rotate":
            from labctl.orchestra.spec import default_path, load_orchestra, require_rotation, serving_hosts

            orchestra_file = file or default_path(c.inventory_path)
            orch = load_orchestra(orchestra_file)
            require_rotation(orch, orchestra_file)
            serving_hosts(orch, c.inventory, orchestra_file)  # a file for another lab fails here, not at 4am
            if period is None and schedule is None:
                period = orch.every  # the cadence lives in one place
        elif file is not None:
            raise InputError(
                f"-f names an orchestra file, which only the rotate job reads ({job} does not).",
                f"Leave out -f: labctl cron install {job} ...",
            )
        when = resolve_schedule(period, schedule)
        out = run_install(
            c, job, when, host, check, progress=_events(c, check, diff), orchestra_file=orchestra_file
        )
        return _outcome(c, out, check, f"cron install {job}")

    run_command(ctx, work, inventory, json_out, verbose)


@app.command("list")
def list_(
    ctx: typer.Context,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Every labctl schedule on every Linux host: schedule, command, last run and its result."""
    from labctl.cron.install import list_jobs
    from labctl.cron.render import print_idle, print_jobs
    from labctl.hosts.fanout import exit_code
    from labctl.hosts.recap import print_recap

    def work(c: Context) -> Outcome:
        results = list_jobs(c)
        data = {
            "jobs": [{"host": r.host, **j} for r in results for j in (r.data or [])],
            "hosts": [
                {k: v for k, v in r.to_json().items() if k in ("host", "status", "error", "hint", "daemons")}
                for r in results
            ],
        }

        def render() -> None:
            print_jobs(c.console, results)
            print_idle(c.console, results)
            if not all(r.ok for r in results):
                print_recap(c.console, results, title="cron list")

        return Outcome(data, render, exit_code(results))

    run_command(ctx, work, inventory, json_out, verbose)


@app.command("remove")
def remove(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(help="The job's name, as `labctl cron list` shows it.", show_default=False)
    ],
    host: HostOpt = None,
    purge: Annotated[
        bool, typer.Option("--purge", help="Also remove the key's authorisations and the installed labctl.")
    ] = False,
    check: Annotated[bool, check_option("Show what would change; change nothing.")] = False,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Remove the job NAME from the orchestrator (with --purge, everything `cron install` put there)."""
    from labctl.cron.install import remove as run_remove

    def work(c: Context) -> Outcome:
        out = run_remove(c, name, host, purge, check, progress=_events(c, check, False))
        return _outcome(c, out, check, f"cron remove {name}")

    run_command(ctx, work, inventory, json_out, verbose)


def _events(c: Any, check: bool, diff: bool) -> Any:
    from labctl.output.progress import shown
    from labctl.provision.render import provision_progress

    # Only the resources' lines: cron has never said that it waits for another provision's lock.
    return shown(c, {"resource": provision_progress(check, diff)["resource"]})


def _outcome(c: Context, out: Any, check: bool, title: str) -> Outcome:
    from labctl.cron.render import print_change
    from labctl.hosts.fanout import exit_code

    data = {
        **out.info,
        "check": check,
        "changed": any(r.changed for r in out.results),
        "notes": out.notes,
        "results": [r.to_json() for r in out.results],
        "hosts": [
            {k: v for k, v in hr.to_json().items() if k not in ("data", "stdout", "stderr", "rc")}
            for hr in out.hosts
        ],
    }

    return Outcome(data, lambda: print_change(c.console, out, check, title), exit_code(out.hosts))
