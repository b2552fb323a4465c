"""`labctl doctor`: is this lab fit to train? One pass/warn/fail line per check, each with its fix."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from labctl.cli.common import InventoryOpt, JsonOpt, LimitOpt, VerboseOpt
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context


def doctor(
    ctx: typer.Context,
    limit: LimitOpt = None,
    tier: Annotated[
        Optional[str],
        typer.Option(
            "--tier",
            help="Also check the lab against a scale tier: dev (one development node), research (one research node) or prod (a cluster of 4 nodes).",
        ),
    ] = None,
    alerts: Annotated[
        Optional[Path],
        typer.Option(
            "--alerts", help="Alert thresholds (default: alerts.yaml beside the inventory, then playbooks/)."
        ),
    ] = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """The lab's infrastructure checks before training: one line per check, pass, warn or fail, with its fix.

    Every declared GPU found with its memory; driver and CUDA; the torch build covers each GPU;
    one torch and NCCL on the training hosts; NICs and bonds; bandwidth and latency between two
    hosts (a 1-second `bench network`); disk for checkpoints; the model cache's mount; Docker and
    sandbox images; a cron daemon wherever `labctl cron install` put a job; clock skew; pinned
    host keys; the alerts firing now (critical ones fail); the connection keeper. `--tier` adds a scale tier's figures (GPUs and their
    memory, CPU cores, RAM, storage, network) and says what is missing to reach it. Exit 1 when
    any line fails.

    Examples:

        labctl doctor

        labctl doctor --tier dev --json | jq '.lines[] | select(.status == "fail")'
    """
    from labctl.doctor.checks import check_keeper, check_lab, check_tier
    from labctl.doctor.gather import gather
    from labctl.doctor.model import exit_code
    from labctl.doctor.render import render, to_json
    from labctl.doctor.tiers import TIERS
    from labctl.inventory.select import select_hosts
    from labctl.keeper.client import keeper_state
    from labctl.monitor.alerts import rules_for
    from labctl.output.errors import InputError

    if tier is not None and tier not in TIERS:
        raise InputError(
            f"--tier {tier!r} is not one of the scale tiers.",
            f"Give one of {', '.join(TIERS)}, e.g. --tier dev.",
        )

    def work(c: Context) -> Outcome:
        hosts = select_hosts(c.inventory, limit)
        rules = rules_for(alerts, c.inventory_path)
        found = gather(c, hosts, rules=rules)
        lines = check_lab(found)
        if tier is not None:
            lines += check_tier(found.hosts, TIERS[tier])
        lines += check_keeper(keeper_state(c.inventory_file(), c.inventory.connections.persist))
        return Outcome(to_json(lines, tier), lambda: render(c.console, lines), exit_code(lines))

    run_command(ctx, work, inventory, json_out, verbose)
