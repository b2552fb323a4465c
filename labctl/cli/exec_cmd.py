"""`labctl exec -- CMD`: one command on many hosts at once, output per host."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer

from labctl.cli.common import InventoryOpt, JsonOpt, LimitOpt, VerboseOpt, finite, positive
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context


def exec_(
    ctx: typer.Context,
    command: Annotated[
        list[str], typer.Argument(help="The command, after `--`. Runs through the host's shell.")
    ],
    limit: LimitOpt = None,
    timeout: Annotated[
        Optional[float],
        typer.Option(
            "--timeout", "-t", callback=positive, help="Seconds before a host's command is stopped."
        ),
    ] = None,
    forks: Annotated[
        Optional[int], typer.Option("--forks", "-f", min=1, help="Hosts at once (default: all).")
    ] = None,
    network: Annotated[
        bool,
        typer.Option(
            "--network",
            help="The command changes the network: run it detached in a transaction that the host "
            "reverts by itself unless labctl reconnects and confirms. Hosts go one at a time.",
        ),
    ] = False,
    revert_after: Annotated[
        float,
        typer.Option(
            "--revert-after",
            min=5,
            callback=finite,
            max=3600,
            help="With --network: seconds after which the host restores its old network unless confirmed.",
        ),
    ] = 90.0,
    verify: Annotated[
        Optional[str],
        typer.Option(
            "--verify",
            help="With --network: a command that must exit 0 on the host, run over the new connection, "
            "before the change is confirmed.",
        ),
    ] = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Run one shell command on every chosen host in parallel.

    Output lines are printed as they arrive, prefixed with the host (stdout to stdout,
    stderr to stderr); a recap table follows on stderr. The command is stopped on every
    Linux host on Ctrl-C or `--timeout`, and nothing keeps running there; on a Windows host
    (Win32-OpenSSH) it may keep running, and the recap says so.

    Exit code: 0 when every host ran it and exited 0; 1 otherwise.

    Examples:

        labctl exec -- uptime

        labctl exec --limit role:train -- nvidia-smi -L

        labctl exec --json -l m5,irina -- df -h /mnt

        labctl exec -l m5 --network --verify 'ping -c1 -W2 192.168.1.20' -- ip addr add 10.0.9.10/24 dev eno2

    With --network the command cannot lock you out: the host backs up its network config
    (/etc/netplan and the like) and live state, runs the command detached from the SSH session,
    and restores both after --revert-after seconds unless labctl got back in over a fresh SSH
    connection, the --verify command passed and labctl confirmed. If labctl cannot get back in,
    it waits for the revert, reconnects and reports what it saw (exit 1).
    """
    from labctl.hosts.fanout import HostResult, HostRun, exit_code, fan_out
    from labctl.hosts.recap import print_recap
    from labctl.inventory.select import select_hosts
    from labctl.output.lines import HostLinePrinter
    from labctl.transport.base import still_running_hint

    line = " ".join(command)
    if not line.strip():
        from labctl.output.errors import InputError

        raise InputError("No command given.", "Put it after `--`, e.g. labctl exec -- uptime")
    if not network and verify is not None:
        from labctl.output.errors import InputError

        raise InputError("--verify only goes with --network.", "Add --network, or drop --verify.")

    def work(c: Context) -> Outcome:
        hosts = select_hosts(c.inventory, limit)
        printer = HostLinePrinter(c.console, max(len(h.name) for h in hosts))
        palette = [
            "cyan",
            "magenta",
            "green",
            "yellow",
            "blue",
            "bright_cyan",
            "bright_magenta",
            "bright_green",
        ]
        colour = {h.name: palette[i % len(palette)] for i, h in enumerate(hosts)}

        def net_step(run: HostRun) -> HostResult:
            from labctl.hosts.fanout import Skipped
            from labctl.network.exec_change import run_network_command

            name = run.host.name
            if run.host.is_windows:
                raise Skipped("windows")

            def on_line(stream: str, text: str) -> None:
                if not c.json_mode:
                    printer.print(name, text, stream, colour[name])

            return run_network_command(run, line, revert_after, verify, timeout, on_line)

        def step(run: HostRun) -> HostResult:
            name = run.host.name

            def on_line(stream: str, text: str) -> None:
                printer.print(name, text, stream, colour[name])

            res = run.conn.run(
                line,
                timeout=timeout or run.host.command_timeout,
                cancel=run.cancel,
                on_line=None if c.json_mode else on_line,
            )
            hint = None
            if res.timed_out:
                status, err = "timeout", f"stopped after {timeout or run.host.command_timeout:g} s"
            elif res.cancelled:
                status, err = "cancelled", "stopped by Ctrl-C"
            elif res.rc == 0:
                status, err = "ok", None
            else:
                status, err = "failed", f"exit code {res.rc}"
            if res.may_still_run:
                why = f"ran past {timeout or run.host.command_timeout:g} s" if res.timed_out else "Ctrl-C"
                err = (
                    f"{why}: labctl closed its session, but {name} runs Windows, where that does not stop "
                    "the command: it may still be running there"
                )
                hint = still_running_hint(name)
            return HostResult(
                name,
                status,
                rc=res.rc,
                stdout=res.stdout,
                stderr=res.stderr,
                error=err,
                hint=hint,
                extra={"may_still_run": True} if res.may_still_run else {},
            )

        results = fan_out(
            c, hosts, net_step if network else step, max_workers=forks, label="exec", progress=c.json_mode
        )
        title = f"exec: {line if len(line) <= 60 else line[:57] + '...'}"
        return Outcome(
            {"command": line, "results": [r.to_json() for r in results]},
            lambda: print_recap(c.console, results, title=title),
            exit_code(results),
        )

    run_command(ctx, work, inventory, json_out, verbose)
