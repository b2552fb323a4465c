"""Options every command takes, and the Context they build.

Typer has no inherited options, so each command declares `InventoryOpt`, `JsonOpt` and
`VerboseOpt` and hands them to `labctl.cli.runner.run_command`, which calls `make_context`;
values given before the sub-command (`labctl --json exec ...`) are remembered by the root
callback and used as defaults.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperOption

from labctl.hosts.context import Context

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


# `--check` is labctl's one word for "compute and show, change nothing". Some commands called
# it `--dry-run` until issue 40; that name still works for one release, hidden from --help.
# The alias stores nothing of its own: it leaves a mark that the command's --check reads, so
# `--dry-run` and `--check` parse to the same parameters. Click processes the options given on
# the command line before the ones left out, so a bare `--dry-run` is seen before `--check`.
_OLD_NAME_GIVEN = "labctl.check_by_old_name"


def _check_or_old_name(ctx: typer.Context, value: bool) -> bool:
    return bool(value) or bool(ctx.meta.pop(_OLD_NAME_GIVEN, False))


def _old_name_given(ctx: typer.Context, value: bool) -> None:
    if value:
        ctx.meta[_OLD_NAME_GIVEN] = True


def check_option(help: str) -> Any:
    """The `--check` option, with this command's words for what it shows."""
    return typer.Option("--check", help=help, callback=_check_or_old_name)


# Declare it beside a `check_option`, as `_dry_run: DryRunAlias = False`; it is never passed a value.
DryRunAlias = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        hidden=True,
        expose_value=False,
        callback=_old_name_given,
        help="The old name of --check, kept for one release.",
    ),
]


MAX_POSITIVE = 1e9  # 31 years of seconds: past about 9e9 s a timer overflows (sleep, socket timeouts)


def positive(value: Optional[float]) -> Optional[float]:
    """A typer callback for a number that must be finite and above 0 (seconds, sizes): the
    range checks typer offers pass `nan`, and -1 would mean "no limit" further down."""
    if value is not None and not (math.isfinite(value) and 0 < value <= MAX_POSITIVE):
        raise typer.BadParameter(f"{value} is not a number above 0 and at most {MAX_POSITIVE:g}.")
    return value


def finite(value: Optional[float]) -> Optional[float]:
    """A typer callback for a number whose range typer checks (min/max): those checks pass `nan`
    (every comparison with it is false), and `inf` where there is no max."""
    if value is not None and not (math.isfinite(value) and abs(value) <= MAX_POSITIVE):
        raise typer.BadParameter(f"{value} is not a finite number of at most {MAX_POSITIVE:g}.")
    return value


def _flags_take_no_value() -> None:
    """Show flags bare in --help (`--json`, not `--json <bool>`).

    typer 0.29's rich help prints a type beside every option, flags and counters included
    (`--json <bool>`, `--help <bool>`, `-v <int>`), as if they took a value; its plain help
    leaves it out. Every command module imports this one, so the fix is made once here.
    """
    shown = TyperOption.display_type_rich
    if getattr(shown, "labctl_flags_bare", False):
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> Optional[str]:
        return None if self.is_flag or self.count else shown(self, ctx)

    display_type_rich.labctl_flags_bare = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_take_no_value()


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
