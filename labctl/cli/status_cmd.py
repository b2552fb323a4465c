"""`labctl status`: the whole lab in one table, once or refreshed in place (`--watch`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from typer.core import TyperCommand
from typer.models import CommandInfo

from labctl.cli.common import InventoryOpt, JsonOpt, LimitOpt, VerboseOpt, positive
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context

DEFAULT_EVERY = 2.0
WATCH_OPTS = ("--watch", "-w")


def with_watch_value(args: list[str]) -> list[str]:
    """`args` with the default period after a bare `--watch` (none follows, or no number does).

    typer 0.29 dropped click's optional option values (`flag_value` only warns), and `--watch` alone
    is how a watch is started most of the time, so the value is supplied before parsing.
    """
    out: list[str] = []
    for i, arg in enumerate(args):
        out.append(arg)
        if arg == "--":
            return out + args[i + 1 :]
        if arg in WATCH_OPTS and not (i + 1 < len(args) and _is_number(args[i + 1])):
            out.append(f"{DEFAULT_EVERY:g}")
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class StatusCommand(TyperCommand):
    """`labctl status`'s command: `--watch` with or without SECONDS."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, with_watch_value(args))


def status(
    ctx: typer.Context,
    watch: Annotated[
        Optional[float],
        typer.Option(
            "--watch",
            "-w",
            metavar="[SECONDS]",
            callback=positive,
            help=f"Refresh in place every SECONDS (default {DEFAULT_EVERY:g}) until Ctrl-C.",
            show_default=False,
        ),
    ] = None,
    limit: LimitOpt = None,
    alerts: Annotated[
        Optional[Path],
        typer.Option(
            "--alerts",
            help="Alert rules YAML. Default: playbooks/alerts.yaml beside the inventory, else in the current "
            "folder, else labctl's defaults (the same thresholds as playbooks/alerts.yaml).",
            show_default=False,
        ),
    ] = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """CPU, RAM, load and model-cache fill per host; utilisation, memory, temperature and power
    per GPU; warm orchestra models and running training runs; alerts below the table.

    One agent round trip per host. With --watch the SSH connections stay open between
    refreshes, a host that stops answering shows as unreachable while the others keep
    updating, and it comes back by itself. Exit 1 when a host is unreachable (not with --watch).

    Examples:

        labctl status

        labctl status --watch 5 --limit role:train

        labctl status --json | jq '.hosts[] | select(.reachable | not) | .host'
    """
    from labctl.inventory.select import select_hosts
    from labctl.monitor.alerts import rules_for
    from labctl.monitor.render import render_status, status_json

    def work(c: Context) -> Optional[Outcome]:
        if watch is not None and c.json_mode:
            from labctl.output.errors import InputError

            raise InputError(
                "--watch redraws a table in place, and --json prints one document: they do not go together.",
                "Drop --watch for one JSON document (run it again to refresh), or drop --json to watch the table.",
            )
        hosts = select_hosts(c.inventory, limit)
        rules = rules_for(alerts, c.inventory_path)
        if watch is not None:
            _watch(c, hosts, rules, watch)
            return None
        statuses = _collect(c, hosts, rules)
        return Outcome(
            status_json(statuses),
            lambda: c.console.print(render_status(statuses)),
            0 if all(s.reachable for s in statuses) else 1,
        )

    run_command(ctx, work, inventory, json_out, verbose)


# labctl's command table (labctl.cli.app.COMMANDS) names this: the command with its own class.
command = CommandInfo(cls=StatusCommand, callback=status)


def _collect(c: Context, hosts: list[Any], rules: Any) -> list[Any]:
    from labctl.monitor.collect import collect

    return collect(c, hosts, rules)


def _watch(c: Context, hosts: list[Any], rules: Any, every: float) -> None:
    """Refresh until Ctrl-C, which ends it with exit 0: stopping a watch is how it is used."""
    import time

    from rich.live import Live
    from rich.text import Text

    from labctl.monitor.render import render_status
    from labctl.output.console import has_no_reader

    def frames() -> Iterator[Any]:
        # A watch whose reader has gone (`2>&1 | head`) ends, as Ctrl-C ends it: it only shows.
        while not has_no_reader(c.console):
            started = time.monotonic()
            yield render_status(_collect(c, hosts, rules), every=every)
            time.sleep(max(0.0, every - (time.monotonic() - started)))

    try:
        if not c.console.is_terminal:
            # Live only draws its last frame off a terminal; a log of the watch gets every frame.
            for frame in frames():
                c.console.print(frame)
            return
        with Live(
            Text(f"collecting from {len(hosts)} hosts…"),
            console=c.console,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
        ) as live:
            for frame in frames():
                live.update(frame, refresh=True)
    except KeyboardInterrupt:
        pass
