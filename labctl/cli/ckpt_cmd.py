"""`labctl ckpt`: checkpoints kept off the training host, in the storage host's library."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from labctl.cli.ckpt_pull_cmd import pull
from labctl.cli.common import DryRunAlias, InventoryOpt, JsonOpt, VerboseOpt, check_option
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context

app = typer.Typer(
    help=(
        "Checkpoints off the training host: copy the newest to the storage host's library (backup), "
        "see it (list), re-hash it (verify), put one back where a run resumes (restore), bring a cloud session's output in (pull)."
    ),
    no_args_is_help=True,
)

StorageOpt = Annotated[
    Optional[str],
    typer.Option(
        "--storage",
        help="The host holding the library (default: the one with a storage section).",
        show_default=False,
    ),
]
RunOpt = Annotated[Optional[str], typer.Option("--run", help="Only this run (its id).", show_default=False)]
StreamsOpt = Annotated[int, typer.Option("--streams", min=1, max=64, help="Parallel TCP streams per copy.")]
ChunkOpt = Annotated[
    int, typer.Option("--chunk-mb", min=1, max=1024, help="Chunk size in MiB: the unit hashed and resumed.")
]


@app.command("list")
def list_cmd(
    ctx: typer.Context,
    run: RunOpt = None,
    storage: StorageOpt = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """The library's copies (run, step, size, when, origin), each run's newest checkpoint
    still only on a training host, and newer ones damaged there.

    Examples:

        labctl ckpt list

        labctl ckpt list --run p1-20261123-213000-ab12 --json
    """
    from labctl.ckpt.library import copies, find_storage, newest_on_hosts, run_records, superseded
    from labctl.ckpt.render import render_list

    def work(c: Context) -> Outcome:
        lib = find_storage(c.inventory, storage)
        # A run whose folder a newer run writes into now: its checkpoints are listed under that run.
        newer = superseded(run_records(c, None))
        records = [r for r in run_records(c, [run] if run else None) if r["run_id"] not in newer]
        held = copies(c, lib, run)
        found = newest_on_hosts(c, records)
        have = {(e["run_id"], e["step"]) for e in held["entries"]}
        only_on_hosts = []
        for r in records:
            seen: set[int] = set()
            for f in found[r["run_id"]]:
                step = f.get("step")
                if isinstance(step, int) and (r["run_id"], step) not in have and step not in seen:
                    seen.add(step)
                    only_on_hosts.append(
                        {
                            "run_id": r["run_id"],
                            "step": step,
                            "host": f["host"],
                            "dir": f["dir"],
                            "bytes": f.get("bytes"),
                        }
                    )
        # Newer checkpoints a host holds that fail the trainer's validation there: never left unsaid.
        damaged_on_hosts = []
        for r in records:
            for f in found[r["run_id"]]:
                skipped = f.get("skipped")
                for s in skipped if isinstance(skipped, list) else []:
                    if isinstance(s, dict) and isinstance(s.get("step"), int):
                        damaged_on_hosts.append(
                            {
                                "run_id": r["run_id"],
                                "step": s["step"],
                                "host": f["host"],
                                "dir": f.get("dir"),
                                "reason": str(s.get("reason") or "not valid"),
                            }
                        )
        listed = [{k: v for k, v in e.items() if k != "record"} for e in held["entries"]]
        data = {
            "storage": lib.host.name,
            "library": lib.path,
            "copies": listed,
            "only_on_hosts": only_on_hosts,
            "damaged_on_hosts": damaged_on_hosts,
        }

        return Outcome(data, lambda: render_list(c.console, data), 0)

    run_command(ctx, work, inventory, json_out, verbose)


@app.command("backup")
def backup_cmd(
    ctx: typer.Context,
    run: Annotated[
        Optional[list[str]],
        typer.Option("--run", help="Only these runs (repeat); default every recorded run."),
    ] = None,
    check: Annotated[bool, check_option("Say what would be copied and pruned; change nothing.")] = False,
    _dry_run: DryRunAlias = False,
    storage: StorageOpt = None,
    streams: StreamsOpt = 4,
    chunk_mb: ChunkOpt = 64,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Copy each run's newest valid checkpoint host to host into the storage host's library.

    The training host serves, the storage host pulls (verified, resumable chunks; never
    through this machine); the copy is listed only once verified. A newer checkpoint that
    fails validation on its host is named in a warning, with the step taken instead. A step
    already in the library is not copied again unless it is damaged (re-hashed, or found so by
    `ckpt verify`): then it is copied again and replaced. An interrupted backup resumes. Then the
    library is pruned: 30 daily, 13 weekly, 12 monthly copies, and each run's newest copy that
    verifies, are kept.

    Examples:

        labctl ckpt backup

        labctl ckpt backup --run p1-20261123-213000-ab12 --check
    """
    from labctl.ckpt.backup import backup
    from labctl.ckpt.library import find_storage, run_records
    from labctl.ckpt.render import render_backup
    from labctl.output.bars import Bars
    from labctl.output.progress import shown

    def work(c: Context) -> Outcome:
        lib = find_storage(c.inventory, storage)
        records = run_records(c, run)
        bars = Bars(c.console, enabled=not c.json_mode and c.console.is_terminal)
        with bars:
            data = backup(
                c,
                lib,
                records,
                dry_run=check,
                chunk_size=chunk_mb << 20,
                streams=streams,
                progress=shown(c, bars.shows()),
            )

        return Outcome(
            data, lambda: render_backup(c.console, data, check), 1 if data["failed"] or data["damaged"] else 0
        )

    run_command(ctx, work, inventory, json_out, verbose)


@app.command("verify")
def verify_cmd(
    ctx: typer.Context,
    run: RunOpt = None,
    remove_damaged: Annotated[
        bool,
        typer.Option(
            "--remove-damaged",
            help="Drop the copies found damaged now (for a checkpoint no host holds any more).",
        ),
    ] = False,
    storage: StorageOpt = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Re-hash every copy in the library against its manifest (the weekly check);
    name each damaged one with the reason and the command that mends it. Exit 1 when any is
    damaged. A damaged copy is marked, so the next backup copies it again.

    Examples:

        labctl ckpt verify

        labctl ckpt verify --run p1-20261123-213000-ab12 --json
    """
    from labctl.ckpt.library import find_storage, library_run_id, repair_hints
    from labctl.ckpt.render import render_verify
    from labctl.hosts.agent_ship import ask_agent

    def work(c: Context) -> Outcome:
        lib = find_storage(c.inventory, storage)
        args: dict[str, Any] = {"lib": lib.path, "mark": True, "remove_damaged": remove_damaged}
        if run:
            args["run_id"] = library_run_id(run, "--run")
        answer = ask_agent(c, lib.host, "ckpt.lib_verify", args, timeout=7 * 24 * 3600.0)
        bad = [e for e in answer["entries"] if e["status"] == "damaged"]
        hints = repair_hints(c, lib, bad)
        entries = [{k: v for k, v in e.items() if k != "record"} for e in answer["entries"]]
        if run and not entries:
            from labctl.output.errors import InputError

            raise InputError(
                f"The library on {lib.host.name} ({lib.path}) holds no copy of run '{run}'.",
                "`labctl ckpt list` shows what it holds.",
            )
        for e in entries:
            if (e["run_id"], e["step"]) in hints:
                e["hint"] = hints[(e["run_id"], e["step"])]["text"]
        damaged = [e for e in entries if e["status"] == "damaged"]
        removed = [e for e in entries if e["status"] == "removed"]
        data = {
            "storage": lib.host.name,
            "library": lib.path,
            "entries": entries,
            "damaged": damaged,
            "removed": removed,
        }

        return Outcome(data, lambda: render_verify(c.console, data), 1 if damaged else 0)

    run_command(ctx, work, inventory, json_out, verbose)


@app.command("restore")
def restore_cmd(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(help="The run whose checkpoint to put back.")],
    to: Annotated[str, typer.Option("--to", help="The host the run will resume on.", show_default=False)],
    step: Annotated[
        Optional[int],
        typer.Option("--step", min=0, help="Which step (default: the newest copy).", show_default=False),
    ] = None,
    folder: Annotated[
        Optional[str],
        typer.Option(
            "--dir", help="Where on HOST (default: the run's checkpoint folder).", show_default=False
        ),
    ] = None,
    storage: StorageOpt = None,
    streams: StreamsOpt = 4,
    chunk_mb: ChunkOpt = 64,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Copy a checkpoint from the library to HOST, where a run with that checkpoint folder
    resumes from it. The copy is re-hashed before it is sent and checked again on HOST before
    its files appear, whole or not at all; a damaged one is refused, naming the run's newest
    copy that verifies.

    Examples:

        labctl ckpt restore p1-20261123-213000-ab12 --to m5

        labctl ckpt restore p1-20261123-213000-ab12 --to m5 --step 1000 --dir /data/ckpt/phase1
    """
    from labctl.cache.targets import host_named
    from labctl.ckpt.library import find_storage
    from labctl.ckpt.render import render_restore
    from labctl.ckpt.restore import restore
    from labctl.output.bars import Bars
    from labctl.output.progress import shown

    def work(c: Context) -> Outcome:
        lib = find_storage(c.inventory, storage)
        host = host_named(c.inventory, to)
        bars = Bars(c.console, enabled=not c.json_mode and c.console.is_terminal)
        with bars:
            data = restore(
                c,
                lib,
                run,
                host,
                step=step,
                folder=folder,
                chunk_size=chunk_mb << 20,
                streams=streams,
                progress=shown(c, bars.shows()),
            )

        return Outcome(data, lambda: render_restore(c.console, data), 0)

    run_command(ctx, work, inventory, json_out, verbose)


app.command("pull")(pull)  # last: the help lists it after the library's own commands
