"""`labctl provision`: apply a playbook's resources to hosts, idempotently."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from labctl.cli.common import InventoryOpt, JsonOpt, LimitOpt, VerboseOpt, check_option
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context


def provision(
    ctx: typer.Context,
    playbook: Annotated[
        Optional[Path],
        typer.Option(
            "--playbook",
            "-p",
            help="Playbook YAML. Default: playbooks/provision.yaml beside the inventory, else in the current folder.",
            show_default=False,
        ),
    ] = None,
    limit: LimitOpt = None,
    tags: Annotated[
        Optional[str],
        typer.Option("--tags", "-t", help="Only resources with these types or tags (comma list)."),
    ] = None,
    skip_tags: Annotated[
        Optional[str], typer.Option("--skip-tags", help="Leave out resources with these types or tags.")
    ] = None,
    check: Annotated[bool, check_option("Compute and show every change; change nothing.")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="Show file diffs.")] = False,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Bring hosts to the state a playbook describes: RAM cache, torch env, cron jobs, files.

    Each resource reads the host's state, plans the change as data, applies it and reads
    it back to verify. A second run changes nothing. Hosts run in parallel and one host
    failing never stops the others; on a host, a failed resource stops the ones after it.

    Examples:

        labctl provision --check --diff          # what would change, nothing changed

        labctl provision --tags model_cache,cron --limit m5

        labctl provision --skip-tags torch --json
    """
    from labctl.hosts.fanout import exit_code
    from labctl.inventory.select import select_hosts
    from labctl.output.progress import shown
    from labctl.provision.engine import provision as run_provision
    from labctl.provision.playbook import load_playbook, parse_tags, skipped_plays
    from labctl.provision.render import print_recap, print_skipped_plays, provision_progress

    def work(c: Context) -> Outcome:
        book = load_playbook(playbook, c.inventory_path)
        hosts = select_hosts(c.inventory, limit)
        skipped = skipped_plays(book, c.inventory)

        results, host_results = run_provision(
            c,
            book,
            hosts,
            tags=parse_tags(tags, "--tags"),
            skip_tags=parse_tags(skip_tags, "--skip-tags"),
            check=check,
            # The wait goes to stderr even under --json: a run that seems stuck says why.
            progress=shown(c, provision_progress(check, diff), under_json=("waiting",)),
        )
        data = {
            "playbook": str(book.path),
            "check": check,
            "skipped_plays": skipped,
            "results": [r.to_json() for r in results],
            "hosts": [
                {k: v for k, v in hr.to_json().items() if k not in ("data", "stdout", "stderr", "rc")}
                for hr in host_results
            ],
        }

        def render() -> None:
            if host_results or not skipped:
                print_recap(c.console, host_results, check)
            print_skipped_plays(c.console, book.path, skipped)

        return Outcome(data, render, exit_code(host_results))

    run_command(ctx, work, inventory, json_out, verbose)
