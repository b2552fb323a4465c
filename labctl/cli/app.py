"""The `labctl` command: the root app, its global options, and error handling.

Sub-apps are imported here but keep their heavy imports inside their commands, so
`labctl --help` stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from labctl import __version__
from labctl.cli import (
    bench_cmd,
    cache_cmd,
    ckpt_cmd,
    ckpt_pull_cmd,
    cron_cmd,
    doctor_cmd,
    exec_cmd,
    facts_cmd,
    init_cmd,
    inventory_cmd,
    metrics_cmd,
    orchestra_cmd,
    plan_cmd,
    provision_cmd,
    sandbox_cmd,
    sim_cmd,
    status_cmd,
    train_cmd,
    trust_cmd,
)
from labctl.errors import EXIT_INTERRUPTED, LabctlError

app = typer.Typer(
    name="labctl",
    help=(
        "Run a small GPU lab from one YAML inventory: facts, parallel commands, provisioning, "
        "model cache, training, the LLM orchestra and benchmarks over SSH.\n\n"
        "Start with `labctl sim up` for a simulated lab on this machine, or point -i at your inventory."
    ),
    no_args_is_help=True,
    # --install-completion / --show-completion SHELL (bash, zsh, fish, powershell): Typer's own.
    add_completion=True,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"labctl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    inventory: Annotated[
        Optional[Path],
        typer.Option(
            "--inventory", "-i", help="Inventory YAML (default: $LABCTL_INVENTORY, then inventory/lab.yaml)."
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine output on stdout.")] = False,
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, help="More detail.")] = 0,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    ctx.obj = {"inventory": inventory, "json": json_out, "verbose": verbose}


app.command("init")(init_cmd.init)
app.add_typer(inventory_cmd.app, name="inventory")
app.command("trust")(trust_cmd.trust)
app.command("exec")(exec_cmd.exec_)
app.command("facts")(facts_cmd.facts)
app.command("status", cls=status_cmd.StatusCommand)(status_cmd.status)
app.command("doctor")(doctor_cmd.doctor)
app.command("provision")(provision_cmd.provision)
app.add_typer(cache_cmd.app, name="cache")
ckpt_cmd.app.command("pull")(ckpt_pull_cmd.pull)
app.add_typer(ckpt_cmd.app, name="ckpt")
app.add_typer(cron_cmd.app, name="cron")
app.add_typer(train_cmd.app, name="train")
app.add_typer(plan_cmd.app, name="plan")
app.add_typer(orchestra_cmd.app, name="orchestra")
app.add_typer(sandbox_cmd.app, name="sandbox")
app.command("rotate")(orchestra_cmd.rotate_cmd)
app.add_typer(bench_cmd.app, name="bench")
app.add_typer(sim_cmd.app, name="sim")
app.command("metrics")(metrics_cmd.metrics)


def _wants_json(argv: list[str]) -> bool:
    return "--json" in argv[: argv.index("--")] if "--" in argv else "--json" in argv


def main() -> None:
    # Typer (standalone) already turns usage errors into exit 2 and Ctrl-C into 130;
    # labctl's own errors are rendered here as one paragraph, never a traceback.
    argv = sys.argv[1:]
    try:
        app(args=argv, prog_name="labctl")
    except LabctlError as e:
        _report(e.message, e.hint, e.exit_code, argv)
        sys.exit(e.exit_code)
    except KeyboardInterrupt as e:
        _interrupted(argv, e)
        sys.exit(EXIT_INTERRUPTED)
    except SystemExit as e:
        if e.code == EXIT_INTERRUPTED:  # typer turns Ctrl-C into a silent exit 130
            _interrupted(argv, e)
        raise


def _interrupted(argv: list[str], e: BaseException) -> None:
    from labctl.cli.interrupted import report

    report(argv, e)


def _report(message: str, hint: str, code: int, argv: list[str]) -> None:
    from labctl.output.console import emit_json, make_console, render_error

    if _wants_json(argv):
        emit_json({"error": message, "hint": hint, "exit_code": code})
    render_error(make_console(), "", f"{message}\n{hint}".strip())
