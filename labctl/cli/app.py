"""The `labctl` command: the root app, its global options, and error handling.

Its commands are one table, COMMANDS: name -> "labctl.cli.<x>_cmd:<attribute>", read with
`labctl.agent.core.registry.load` like every registry in labctl. The attribute is a Typer app (a
group: `labctl cache ...`), a function (a command: `labctl exec`), or a typer CommandInfo (a
command with its own click class: `labctl status`). The help lists them in the table's order,
commands before groups. Command modules keep their heavy imports inside their commands, so
`labctl --help` stays fast.

`app` (the whole tree) is built on first use; `main()` builds an app with only the command that
argv names when that is clear (`app_for`), so a run imports one command module, not twenty.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.models import CommandInfo

from labctl import __version__
from labctl.agent.core.registry import load
from labctl.output.errors import EXIT_INTERRUPTED, LabctlError

COMMANDS = {
    "init": "labctl.cli.init_cmd:init",
    "inventory": "labctl.cli.inventory_cmd:app",
    "trust": "labctl.cli.trust_cmd:trust",
    "connections": "labctl.cli.connections_cmd:app",
    "exec": "labctl.cli.exec_cmd:exec_",
    "facts": "labctl.cli.facts_cmd:facts",
    "status": "labctl.cli.status_cmd:command",
    "doctor": "labctl.cli.doctor_cmd:doctor",
    "provision": "labctl.cli.provision_cmd:provision",
    "cache": "labctl.cli.cache_cmd:app",
    "ckpt": "labctl.cli.ckpt_cmd:app",
    "cron": "labctl.cli.cron_cmd:app",
    "train": "labctl.cli.train_cmd:app",
    "plan": "labctl.cli.plan_cmd:app",
    "orchestra": "labctl.cli.orchestra_cmd:app",
    "sandbox": "labctl.cli.sandbox_cmd:app",
    "rotate": "labctl.cli.orchestra_cmd:rotate_cmd",
    "bench": "labctl.cli.bench_cmd:app",
    "sim": "labctl.cli.sim_cmd:app",
    "metrics": "labctl.cli.metrics_cmd:metrics",
}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"labctl {__version__}")
        raise typer.Exit()


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


def _register(root: typer.Typer, name: str, entry: str) -> None:
    target = load(entry)
    if isinstance(target, typer.Typer):
        root.add_typer(target, name=name)
    elif isinstance(target, CommandInfo) and target.callback is not None:
        root.command(name, cls=target.cls)(target.callback)
    else:
        root.command(name)(target)


def build_app(names: Iterable[str] | None = None) -> typer.Typer:
    """The root app with the commands `names` of COMMANDS (all of them, in the table's order,
    when None). Each command's module is imported here."""
    built = typer.Typer(
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
    built.callback()(root)
    for name in COMMANDS if names is None else names:
        _register(built, name, COMMANDS[name])
    return built


_full: typer.Typer | None = None


def full_app() -> typer.Typer:
    """The root app with every command (built once): what `labctl.cli.app.app` is."""
    global _full
    if _full is None:
        _full = build_app()
    return _full


def __getattr__(name: str) -> typer.Typer:
    # `app`, the whole command tree, is built on first use, not on import: main() builds only the
    # command it runs (importing all 20 command modules and building their click commands costs
    # ~50 ms on every run).
    if name == "app":
        return full_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The root's own options: those that take a value, and flags. Any other option before the command
# (--help, --version, --install-completion, --show-completion, a typo) wants the whole tree.
_ROOT_VALUE_OPTIONS = ("-i", "--inventory")
_ROOT_FLAGS = ("--json", "--verbose")


def command_of(argv: list[str]) -> str | None:
    """The command of COMMANDS that `argv` runs, when the root's options before it are all known
    ones; None when there is none, it is unknown, or anything is unclear."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in _ROOT_VALUE_OPTIONS:
            i += 2
        elif arg.startswith("--inventory=") or (arg.startswith("-i") and len(arg) > 2 and arg[2] != "-"):
            i += 1  # the value attached (click reads -iFILE as -i FILE)
        elif arg in _ROOT_FLAGS or re.fullmatch(r"-v+", arg):
            i += 1
        elif arg.startswith("-"):
            return None
        else:
            return arg if arg in COMMANDS else None
    return None


def app_for(argv: list[str]) -> typer.Typer:
    """The app to run `argv` with: only the command it names when that is clear (its output is
    the same: no help or error of a command shows its siblings), else every command. Shell
    completion (Typer's `_LABCTL_COMPLETE` variable) always gets every command."""
    name = None if "_LABCTL_COMPLETE" in os.environ else command_of(argv)
    return full_app() if name is None else build_app([name])


def _wants_json(argv: list[str]) -> bool:
    return "--json" in argv[: argv.index("--")] if "--" in argv else "--json" in argv


def main() -> None:
    # Typer (standalone) already turns usage errors into exit 2 and Ctrl-C into 130;
    # labctl's own errors are rendered here as one paragraph, never a traceback.
    argv = sys.argv[1:]
    try:
        app_for(argv)(args=argv, prog_name="labctl")
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


def entry() -> None:
    """The process entry: the `labctl` script and `python -m labctl` (not main(), which tests call
    in-process). Runs main(), then ends the process at once with its exit code.

    Why: an ordinary exit tears the interpreter down, freeing ~600 modules one by one (~35 ms on
    every run), for nothing: the process is ending. What an ordinary exit does that matters is
    done first: stdout and stderr flushed (all the output is written, to a pipe too), the atexit
    handlers run (logging's shutdown, temporary files ...). Not when a non-daemon thread other
    than the main one still runs: an ordinary exit waits for it, so then exit normally. A
    traceback (an error main() did not turn into an exit code) also takes the ordinary way."""
    code = 0
    try:
        main()
    except SystemExit as e:
        if e.code is not None and not isinstance(e.code, int):
            raise  # sys.exit("message"): the interpreter prints it, exit 1
        code = e.code or 0
    _exit_now(code)


def _exit_now(code: int) -> None:
    """os._exit(code) after what an ordinary exit would do that is not teardown; sys.exit(code)
    when that cannot be skipped safely (see entry)."""
    import atexit
    import threading

    main_thread = threading.main_thread()
    if any(t is not main_thread and t.is_alive() and not t.daemon for t in threading.enumerate()):
        sys.exit(code)
    try:
        _flush()
        atexit._run_exitfuncs()
        _flush()
    except BaseException:  # a pipe closed early and the like: the interpreter reports it as ever
        sys.exit(code)
    os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()


def _interrupted(argv: list[str], e: BaseException) -> None:
    from labctl.cli.interrupted import report

    report(argv, e)


def _report(message: str, hint: str, code: int, argv: list[str]) -> None:
    from labctl.output.console import emit_json, make_console, render_error

    if _wants_json(argv):
        emit_json({"error": message, "hint": hint, "exit_code": code})
    render_error(make_console(), "", f"{message}\n{hint}".strip())
