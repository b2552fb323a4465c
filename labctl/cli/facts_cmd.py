"""`labctl facts`: what each host really has, in one round trip per host."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from labctl.cli.common import InventoryOpt, JsonOpt, LimitOpt, VerboseOpt
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context


def facts(
    ctx: typer.Context,
    limit: LimitOpt = None,
    torch: Annotated[
        bool, typer.Option("--torch/--no-torch", help="Import torch on hosts to report its versions.")
    ] = True,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """CPU, RAM, GPUs, NICs and bonds, mounts, Python, torch/CUDA/NCCL and Docker per host.

    labctl's agent runs on each host with the host's own Python (shipped there once and
    cached by hash; nothing to install by hand). Where the inventory declares GPUs or RAM
    that the host does not have, the difference is flagged.

    Examples:

        labctl facts

        labctl facts --limit role:train --json | jq '.results[].facts.gpus'
    """
    from labctl.facts.collect import gather_facts
    from labctl.facts.render import render_facts
    from labctl.hosts.fanout import exit_code
    from labctl.hosts.recap import print_recap
    from labctl.inventory.select import select_hosts

    def work(c: Context) -> Outcome:
        results = gather_facts(c, select_hosts(c.inventory, limit), torch=torch)
        out = []
        for r in results:
            d = r.to_json()
            d["facts"] = d.pop("data")
            for k in ("stdout", "stderr", "rc"):
                d.pop(k, None)
            out.append(d)

        def render() -> None:
            render_facts(c.console, [r for r in results if r.ok and r.data])
            print_recap(c.console, results, title="facts")

        return Outcome({"results": out}, render, exit_code(results))

    run_command(ctx, work, inventory, json_out, verbose)
