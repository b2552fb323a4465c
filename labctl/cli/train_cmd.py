"""`labctl train --phase N`: torchrun across the lab's hosts, and `train status` / `train stop`."""

from __future__ import annotations

import shlex
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from labctl.cli.common import InventoryOpt, JsonOpt, VerboseOpt, make_context

app = typer.Typer(no_args_is_help=False, invoke_without_command=True)


class Backend(StrEnum):
    ssh = "ssh"
    slurm = "slurm"
    k8s = "k8s"


class Device(StrEnum):
    auto = "auto"
    cuda = "cuda"
    cpu = "cpu"


def _ranks(text: str) -> set[int] | None:
    if text.strip() == "all":
        return None
    try:
        return {int(x) for x in text.split(",") if x.strip()}
    except ValueError:
        from labctl.errors import InputError

        raise InputError(
            f"--ranks {text!r} is not a list of ranks.", "Write e.g. --ranks 0,1 or --ranks all."
        ) from None


@app.callback()
def train(
    ctx: typer.Context,
    phase: Annotated[
        Optional[int], typer.Option("--phase", "-p", min=1, help="The training phase (1-4 in the seed lab).")
    ] = None,
    file: Annotated[
        Optional[Path], typer.Option("--file", "-f", help="Phases file (default playbooks/train.yaml).")
    ] = None,
    set_: Annotated[
        Optional[list[str]],
        typer.Option(
            "--set", "-s", help="Override a setting: --set steps=40, --set model.d_model=64. Repeatable."
        ),
    ] = None,
    limit: Annotated[
        Optional[str],
        typer.Option(
            "--limit", "-l", help="Train on these hosts instead of the phase's `hosts` (--limit syntax)."
        ),
    ] = None,
    device: Annotated[
        Optional[Device],
        typer.Option("--device", help="cuda, cpu (gloo on CPUs), or auto (the phase's `device`)."),
    ] = None,
    python: Annotated[
        Optional[str],
        typer.Option("--python", help="Interpreter with torch on the hosts (default: their torch_env)."),
    ] = None,
    script: Annotated[
        Optional[Path],
        typer.Option(
            "--script", help="Your training script (copied to each host) instead of the reference trainer."
        ),
    ] = None,
    script_args: Annotated[
        str, typer.Option("--script-args", help="Arguments for --script, as one shell-quoted string.")
    ] = "",
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Preflight, then print each host's exact command and environment."),
    ] = False,
    backend: Annotated[
        Backend,
        typer.Option("--backend", help="ssh launches now; slurm / k8s write a job file for the same run."),
    ] = Backend.ssh,
    output: Annotated[
        Optional[Path], typer.Option("--output", "-o", help="Folder for --backend slurm/k8s files.")
    ] = None,
    image: Annotated[
        Optional[str], typer.Option("--image", help="Container image for --backend k8s.")
    ] = None,
    partition: Annotated[
        Optional[str], typer.Option("--partition", help="Slurm partition for --backend slurm.")
    ] = None,
    time_limit: Annotated[
        Optional[str], typer.Option("--time", help="Slurm time limit, e.g. 2-00:00:00.")
    ] = None,
    min_nodes: Annotated[
        Optional[int],
        typer.Option("--min-nodes", min=1, help="k8s elastic minReplicas (default: every node)."),
    ] = None,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach", "-d", help="Start and return; follow with `train status`, end with `train stop`."
        ),
    ] = False,
    ranks: Annotated[
        str, typer.Option("--ranks", help="Ranks whose output is shown: 0 (default), 0,1, or all.")
    ] = "0",
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Launch torchrun on every training host for phase N, stream rank 0, and clean up after.

    Before anything starts, every host is checked: torch supports each chosen GPU, torch and
    NCCL versions match, the rendezvous port is free, the interface for NCCL/gloo, disk for
    checkpoints, and for phase 3 the LLM orchestra's warm set. Any problem names the host and
    the fix, and nothing is launched.

    Each host runs `python -m torch.distributed.run` (c10d rendezvous on the first host) in a
    process group that dies with the SSH session. Ctrl-C or a failed host stops every host
    (SIGTERM, then SIGKILL after `stop_grace`) and labctl checks that no process of the run is
    left. Every rank's output goes to `.labctl/runs/RUN/` beside the inventory.

    Exit code: 0 the run finished; 1 preflight refused or a host failed; 2 bad input; 130 Ctrl-C.

    Examples:

        labctl train --phase 1 --dry-run

        labctl train --phase 1 --limit m5,irina --device cpu --set steps=50

        labctl train --phase 2 --detach && labctl train status

        labctl train --phase 2 --backend k8s --image registry.lab/cet:1 -o jobs/
    """
    if ctx.invoked_subcommand is not None:
        return
    from labctl.errors import InputError

    if phase is None:
        raise InputError("Which phase? --phase is required.", "Write e.g. labctl train --phase 1 --dry-run")
    c = make_context(ctx, inventory, json_out, verbose)
    try:
        _launch(
            c,
            phase=phase,
            file=file,
            sets=set_ or [],
            limit=limit,
            device=device.value if device else None,
            python=python,
            script=script,
            script_args=tuple(shlex.split(script_args)),
            dry_run=dry_run,
            backend=backend.value,
            output=output,
            image=image,
            partition=partition,
            time_limit=time_limit,
            min_nodes=min_nodes,
            detach=detach,
            ranks=_ranks(ranks),
        )
    finally:
        c.close()


def _launch(c: Any, *, phase: int, file: Path | None, sets: list[str], limit: str | None, device: str | None,
            python: str | None, script: Path | None, script_args: tuple[str, ...], dry_run: bool, backend: str,
            output: Path | None, image: str | None, partition: str | None, time_limit: str | None,
            min_nodes: int | None, detach: bool, ranks: set[int] | None) -> None:  # fmt: skip
    from labctl.errors import InputError
    from labctl.inventory.select import select_hosts
    from labctl.train import launch, runs
    from labctl.train.phases import load_phases

    settings = load_phases(file).settings(phase, sets)
    if script is None and settings.script:
        script = Path(settings.script)
    if script is not None and not script.is_file():
        raise InputError(f"No script at {script}.", "Give the path of your training script on this machine.")
    hosts = launch.linux_hosts(select_hosts(c.inventory, limit or settings.hosts))
    run_id = runs.new_run_id(phase)
    spec = launch.prepare(
        c,
        settings=settings,
        phase=phase,
        run_id=run_id,
        hosts=hosts,
        device=device,
        python=python,
        script=str(script) if script else None,
        script_args=script_args,
    )
    if dry_run:
        _print_dry_run(c, spec)
        return
    if backend != "ssh":
        from labctl.train.backends import write_job

        folder = output or runs.runs_dir(c.inventory.path) / run_id / backend
        spec = _for_cluster(
            spec, settings.checkpoint_dir == type(settings).model_fields["checkpoint_dir"].default
        )
        paths = write_job(
            spec,
            backend,
            folder,
            image=image,
            partition=partition,
            time_limit=time_limit,
            min_nodes=min_nodes,
        )
        if c.json_mode:
            c.emit({"run_id": run_id, "backend": backend, "files": [str(p) for p in paths]})
        else:
            for p in paths:
                c.console.print(f"wrote {p}")
            # sbatch runs the script from where it is submitted, and it finds the trainer beside it.
            submit = (
                f"cd {shlex.quote(str(paths[0].parent))} && sbatch {paths[0].name}"
                if backend == "slurm"
                else f"kubectl apply -f {shlex.quote(str(paths[0]))}"
            )
            c.console.print(f"Submit with: {submit}")
        return
    if script is not None:
        launch.ship_script(c, spec, hosts, script)
    root = runs.runs_dir(c.inventory.path)
    record = {
        "run_id": run_id,
        "phase": phase,
        "inventory": str(c.inventory.path),
        "hosts": [n.host for n in spec.nodes],
        "log_dir": spec.log_dir,
        "grace": settings.stop_grace,
        "detached": detach,
        "started": time.time(),
        "state": "running",
        "world_size": spec.world_size,
        "device": spec.nodes[0].device,
        "commands": {n.host: spec.shell_line(n) for n in spec.nodes},
    }
    runs.save(root, record)
    if detach:
        results = launch.run_detached(c, spec, hosts)
        ok = all(r.ok for r in results)
        if not ok:
            launch.stop_everywhere(c, run_id, hosts, settings.stop_grace, spec.log_dir)
        runs.update(root, run_id, state="running" if ok else "failed")
        if c.json_mode:
            c.emit({"run_id": run_id, "detached": True, "results": [r.to_json() for r in results]})
        else:
            from labctl.recap import print_recap

            print_recap(c.console, results, title=f"train {run_id} (detached)")
            if ok:
                c.console.print(
                    f"Follow with: labctl train status {run_id}    End with: labctl train stop {run_id}"
                )
        raise typer.Exit(0 if ok else 1)
    _attached(c, spec, hosts, settings.stop_grace, root, run_id, ranks)


def _for_cluster(spec: Any, default_ckpt: bool) -> Any:
    """The run's paths for a cluster job: relative to where the job starts, not in labctl's host folder."""
    import dataclasses

    settings = {**spec.settings, "metrics_path": f"labctl-runs/{spec.run_id}/metrics.jsonl"}
    if default_ckpt:
        settings["checkpoint_dir"] = f"checkpoints/phase{spec.phase}"
    return dataclasses.replace(spec, settings=settings, log_dir="")


def _attached(
    c: Any, spec: Any, hosts: list[Any], grace: int, root: Path, run_id: str, ranks: set[int] | None
) -> None:
    from labctl.cli.lines import HostLinePrinter
    from labctl.train import launch, runs

    printer = HostLinePrinter(c.console, max(len(n.host) for n in spec.nodes) + 3)
    if not c.json_mode:
        c.console.print(
            f"[bold]train {run_id}[/]: phase {spec.phase}, {spec.world_size} processes on "
            f"{', '.join(f'{n.host} ({n.nproc} {n.device})' for n in spec.nodes)}; "
            f"rendezvous {spec.head_address}:{spec.port}; logs {root / run_id}"
        )
    stream = launch.Stream(root / run_id, ranks, None if c.json_mode else printer.print)
    stream.open([n.host for n in spec.nodes])
    try:
        outcome = launch.run_attached(c, spec, hosts, stream, grace)
    finally:
        stream.close()
    steps = [e for e in outcome.events if e.get("event") == "step"]
    done = any(e.get("event") == "done" for e in outcome.events)
    left = {h: p for h, p in outcome.remaining.items() if p}
    ok = bool(outcome.results) and all(r.ok for r in outcome.results) and not outcome.interrupted
    state = "interrupted" if outcome.interrupted else ("finished" if ok else "failed")
    runs.update(root, run_id, state=state, ended=time.time(), remaining=left)
    summary = {
        "run_id": run_id,
        "phase": spec.phase,
        "state": state,
        "world_size": spec.world_size,
        "hosts": [r.to_json() for r in outcome.results],
        "failed_host": outcome.failed_host,
        "steps_logged": len(steps),
        "first_step": steps[0]["step"] if steps else None,
        "last_step": steps[-1]["step"] if steps else None,
        "first_loss": steps[0]["loss"] if steps else None,
        "last_loss": steps[-1]["loss"] if steps else None,
        # Rank 0 says "start" each time its workers (re)start. Its TORCHELASTIC_RESTART_COUNT stays 0
        # when another host failed and this one only re-joined, so the starts are what count.
        "restarts": max(
            sum(1 for e in outcome.events if e.get("event") == "start") - 1,
            max((int(e.get("restart") or 0) for e in outcome.events), default=0),
            0,
        ),
        "resumed_from": [e.get("resumed_from") for e in outcome.events if e.get("event") == "start"],
        "done": done,
        "first_step_seconds": outcome.first_step_seconds,
        "remaining_processes": left,
        "log_dir": str(root / run_id),
    }
    if c.json_mode:
        c.emit(summary)
    else:
        from labctl.recap import print_recap

        if outcome.results:
            print_recap(c.console, outcome.results, title=f"train {run_id}")
        if steps and steps[0].get("loss") is not None and steps[-1].get("loss") is not None:
            c.console.print(
                f"loss {steps[0]['loss']:.4f} at step {steps[0]['step']} → {steps[-1]['loss']:.4f} at step {steps[-1]['step']}"
                + (f"; {summary['restarts']} restart(s)" if summary["restarts"] else "")
            )
        if left:
            c.console.print(f"[red]processes of {run_id} still running: {left}[/]")
        else:
            c.console.print(f"[dim]no process of {run_id} remains on {', '.join(outcome.remaining)}[/]")
    if outcome.interrupted:
        raise typer.Exit(130)
    raise typer.Exit(0 if ok and not left else 1)


def _print_dry_run(c: Any, spec: Any) -> None:
    if c.json_mode:
        c.emit(
            {
                "run_id": spec.run_id,
                "phase": spec.phase,
                "backend": spec.dist_backend,
                "world_size": spec.world_size,
                "rendezvous": f"{spec.head_address}:{spec.port}",
                "settings": spec.settings,
                "hosts": [
                    {
                        "host": n.host,
                        "nproc": n.nproc,
                        "device": n.device,
                        "gpus": list(n.gpu_names),
                        "env": n.env,
                        "argv": spec.torchrun_argv(n),
                        "command": spec.shell_line(n),
                    }
                    for n in spec.nodes
                ],
            }
        )
        return
    c.console.print(
        f"[bold]dry run[/] {spec.run_id}: phase {spec.phase}, {spec.world_size} processes, {spec.dist_backend}, "
        f"rendezvous {spec.head_address}:{spec.port}. Preflight passed on {', '.join(n.host for n in spec.nodes)}; nothing launched."
    )
    for n in spec.nodes:
        gpus = f" GPUs {', '.join(n.gpu_names)}" if n.gpu_names else ""
        c.console.print(f"\n[cyan]{n.host}[/] ({n.nproc} × {n.device}{gpus}):")
        typer.echo(spec.shell_line(n))


@app.command("status")
def status(
    ctx: typer.Context,
    run_id: Annotated[Optional[str], typer.Argument(help="A run id (default: the recent runs).")] = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Runs recorded here and, for those still running, what their hosts say (step, loss, state)."""
    from rich.table import Table

    from labctl.train import launch, runs

    c = make_context(ctx, inventory, json_out, verbose)
    try:
        root = runs.runs_dir(c.inventory.path)
        records = [runs.load(root, run_id)] if run_id else runs.list_runs(root)[:10]
        rows: list[dict[str, Any]] = []
        for rec in records:
            hosts_state: dict[str, Any] = {}
            if rec.get("state") == "running" or run_id:
                hosts = launch.record_hosts(c, rec)
                for res in launch.host_status(c, rec, hosts):
                    hosts_state[res.host] = res.data if res.ok else {"state": res.status, "error": res.error}
                states = {s.get("state") for s in hosts_state.values()}
                if rec.get("state") == "running" and "running" not in states:
                    new = (
                        "finished"
                        if states == {"finished"}
                        else ("stopped" if "stopped" in states else "failed")
                    )
                    rec = runs.update(root, rec["run_id"], state=new)
            rows.append({**rec, "host_state": hosts_state})
    finally:
        c.close()
    if c.json_mode:
        c.emit({"runs": rows})
        return
    if not rows:
        c.console.print(f"No runs recorded in {root}.")
        return
    table = Table(title="training runs")
    table.add_column("run", no_wrap=True)
    for col in ("phase", "state", "hosts", "last event"):
        table.add_column(col)
    for r in rows:
        events = [s.get("last_event") for s in r["host_state"].values() if s.get("last_event")]
        if not events:
            events = [e for e in [_last_local_event(root / r["run_id"] / "metrics.jsonl")] if e]
        last = launch.format_event(events[0]) if events else ""
        per_host = ", ".join(f"{h}: {s.get('state')}" for h, s in r["host_state"].items()) or ", ".join(
            r["hosts"]
        )
        table.add_row(r["run_id"], str(r.get("phase")), r.get("state", "?"), per_host, last)
    c.console.print(table)


def _last_local_event(path: Path) -> dict[str, Any] | None:
    """Rank 0's newest step or done event as an attached run streamed it here."""
    from labctl.agent.train_host import newest_event

    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    return newest_event(lines, want=lambda e: e["event"] in ("step", "done") and e.get("loss") is not None)


@app.command("stop")
def stop(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run to stop (see `labctl train status`).")],
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Stop a run on every host: SIGTERM, SIGKILL after its grace period, then check nothing is left."""
    from labctl.train import launch, runs

    c = make_context(ctx, inventory, json_out, verbose)
    try:
        root = runs.runs_dir(c.inventory.path)
        rec = runs.load(root, run_id)
        hosts = launch.record_hosts(c, rec)
        remaining = launch.stop_everywhere(c, run_id, hosts, int(rec.get("grace", 10)), rec.get("log_dir"))
    finally:
        c.close()
    left = {h: p for h, p in remaining.items() if p}
    runs.update(root, run_id, state="stopped" if not left else "stopping", remaining=left)
    if c.json_mode:
        c.emit({"run_id": run_id, "remaining": left, "hosts": list(remaining)})
    elif left:
        c.console.print(f"[red]still running after SIGKILL: {left}[/]")
    else:
        c.console.print(f"stopped {run_id}: no process of it remains on {', '.join(remaining)}")
    raise typer.Exit(0 if not left else 1)
