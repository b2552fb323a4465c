"""The training run layer under the CLI: `start`, `monitor.status` and `stop`, each a result out.

`start` turns a `TrainRequest` into a planned run (phase settings, hosts, preflight, the
`LaunchSpec`, which carries the run's time limit) and hands it to the chosen backend
(train/backends/), asking of it only what the `Backend` protocol declares. Nothing here prints:
live output of an attached run goes to the progress channel the caller passes, the rest comes back
as a result (train/results.py) for the CLI to render.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from labctl.documents.validation import path_component
from labctl.hosts.context import Context
from labctl.inventory.select import require_role_hosts, select_hosts
from labctl.output.errors import InputError
from labctl.output.progress import QUIET, Progress
from labctl.train import backends, launch, runs
from labctl.train.backends import PlannedRun, RunsOn
from labctl.train.phases import Settings, load_phases
from labctl.train.plan import plan_cluster_run
from labctl.train.request import ClusterShape, TrainRequest
from labctl.train.results import DryRun, JobFiles, JobPreview, RunsStatus, Stopped, TrainResult


def start(ctx: Context, request: TrainRequest, progress: Progress = QUIET) -> TrainResult:
    """Preflight and plan the run, then launch it or write it down as `request.backend` does."""
    backend = backends.get(request.backend)
    settings = load_phases(request.file, ctx.inventory_path).settings(
        request.phase, list(request.sets), request.profile
    )
    script = request.script
    if script is None and settings.script:
        script = Path(settings.script)
    if script is not None and not script.is_file():
        raise InputError(f"No script at {script}.", "Give the path of your training script on this machine.")
    if script is not None:
        # Its name becomes a file beside the run's logs on every host (and a job's file name).
        path_component(script.name, "The script's file name", "train.py (rename the file)")
    if backend.runs_on is RunsOn.LAB and request.job.cluster_flags():
        given = ", ".join(request.job.cluster_flags())
        takers = " or ".join(backends.running_on(RunsOn.CLUSTER))
        raise InputError(
            f"{given} describe{'s' if ',' not in given else ''} a cluster's nodes for --backend {takers}, "
            f"not {request.backend}: --backend {request.backend} trains on the inventory's hosts.",
            f"Drop {given}, or write a job for the cluster with --backend {takers}.",
        )
    # Input, not the lab's state: refused before any host is asked.
    backends.check_options(backend, request.job)
    backend.check_request(request, settings)
    if not backend.uses_lab_hosts:
        return _start_offline(ctx, backend, request, settings, script)
    if backend.runs_on is RunsOn.CLUSTER:
        cluster = request.job.cluster()
        if cluster is not None:
            return _start_cluster(ctx, backend, request, settings, script, cluster)
    if request.limit is not None:
        chosen = select_hosts(ctx.inventory, request.limit)
    else:
        chosen = require_role_hosts(
            ctx.inventory,
            settings.hosts,
            f"Phase {request.phase} trains",
            label=f"phase {request.phase}'s hosts",
            hint="Give the hosts that train `roles: [train]` in the inventory, or name them with "
            "--limit (or `hosts:` in the phases file).",
        )
    hosts = launch.linux_hosts(chosen)
    spec = launch.prepare(
        ctx,
        settings=settings,
        phase=request.phase,
        run_id=runs.new_run_id(request.phase),
        hosts=hosts,
        device=request.device,
        python=request.python,
        script=str(script) if script else None,
        script_args=request.script_args,
        time_limit_s=request.time_limit_s,
    )
    if request.dry_run:
        return DryRun(spec)
    planned = PlannedRun(request, settings, spec, hosts, script, runs.runs_dir(ctx.inventory_file()))
    return backend.submit(ctx, planned, progress)


def _start_offline(
    ctx: Context, backend: backends.Backend, request: TrainRequest, settings: Settings, script: Path | None
) -> TrainResult:
    """A run for a machine outside the lab (a cloud session): planned from the settings alone."""
    from labctl.train.backends.cloud.backend import offline_spec

    for flag, given in (
        ("--check", request.dry_run),
        ("--limit", request.limit),
        ("--device", request.device),
    ):
        if given:
            raise InputError(
                f"{flag} does not apply to --backend {request.backend}: its session runs on the platform's machine, not the lab's.",
                "Drop it; the backend writes files and launches nothing.",
            )
    spec = offline_spec(
        settings,
        request.phase,
        runs.new_run_id(request.phase),
        script,
        request.script_args,
        request.time_limit_s,
    )
    planned = PlannedRun(request, settings, spec, [], script, runs.runs_dir(ctx.inventory_file()))
    return backend.submit(ctx, planned, QUIET)


def _start_cluster(
    ctx: Context,
    backend: backends.Backend,
    request: TrainRequest,
    settings: Settings,
    script: Path | None,
    cluster: ClusterShape,
) -> TrainResult:
    """A job for a cluster the flags describe: no inventory read, no lab host asked."""
    for flag, given, hint in (
        ("--limit", request.limit, "the cluster's scheduler picks the nodes"),
        (
            "--python",
            request.python,
            "the job names the nodes' interpreter (Slurm: PYTHON when you submit; Kubernetes: the image's python3)",
        ),
    ):
        if given:
            raise InputError(
                f"{flag} is about the lab's hosts, and this job runs on the cluster --nodes describes.",
                f"Drop it: {hint}.",
            )
    spec = plan_cluster_run(
        settings=settings,
        phase=request.phase,
        run_id=runs.new_run_id(request.phase),
        cluster=cluster,
        device_override=request.device,
        script=str(script) if script else None,
        script_args=request.script_args,
        time_limit_s=request.time_limit_s,
    )
    # Run records live beside the inventory; without one, in the folder labctl runs in.
    inventory = ctx.inventory_path
    root = runs.runs_dir(inventory) if inventory.is_file() else Path.cwd() / ".labctl" / "runs"
    if not request.dry_run:
        return backend.submit(ctx, PlannedRun(request, settings, spec, [], script, root), QUIET)
    # The backend writes the job as it would, into a folder that goes away: every check it makes
    # is made, and nothing is left.
    with tempfile.TemporaryDirectory(prefix="labctl-dry-run-") as tmp:
        planned = PlannedRun(dataclasses.replace(request, output=Path(tmp)), settings, spec, [], script, root)
        written = backend.submit(ctx, planned, QUIET)
        if not isinstance(written, JobFiles):
            raise TypeError(f"--backend {request.backend} runs on a cluster but wrote no job files")
        return JobPreview.read(written, Path(tmp), cluster.gpus_per_node, spec)


def settled_state(recorded: str | None, host_state: dict[str, dict[str, Any]]) -> str | None:
    """The state a run recorded as running has ended in, from what its hosts say now.

    None while any host still runs it, and for a run not recorded as running.
    """
    states = {s.get("state") for s in host_state.values()}
    if recorded != "running" or "running" in states:
        return None
    if states == {"finished"}:
        return "finished"
    # Only rank 0's host sees the "paused" event; the others' trainers just exited 0.
    if "paused" in states and states <= {"finished", "paused"}:
        return "paused"
    return "stopped" if "stopped" in states else "failed"


def status(ctx: Context, run_id: str | None = None) -> RunsStatus:
    """`run_id`'s record, or the ten newest; the hosts are asked about the one named and those running."""
    root = runs.runs_dir(ctx.inventory_file())
    records = [runs.load(root, run_id)] if run_id else runs.list_runs(root)[:10]
    rows: list[dict[str, Any]] = []
    for rec in records:
        host_state: dict[str, dict[str, Any]] = {}
        if rec.get("state") == "running" or run_id:
            for res in launch.host_status(ctx, rec, launch.record_hosts(ctx, rec)):
                host_state[res.host] = res.data if res.ok else {"state": res.status, "error": res.error}
            new = settled_state(rec.get("state"), host_state)
            if new is not None:
                resume = [s["resume_step"] for s in host_state.values() if s.get("resume_step") is not None]
                extra = {"resume_step": resume[0]} if new == "paused" and resume else {}
                reason = next((s["fatal"] for s in host_state.values() if s.get("fatal")), None)
                if new == "failed" and reason:
                    extra["reason"] = reason  # the trainer's own words, not torchrun's exit code
                rec = runs.update(root, rec["run_id"], state=new, **extra)
        rows.append({**rec, "host_state": host_state})
    return RunsStatus(root, rows)


def stop(ctx: Context, run_id: str) -> Stopped:
    """Stop `run_id` on every host it ran on and record whether anything is left."""
    root = runs.runs_dir(ctx.inventory_file())
    rec = runs.load(root, run_id)
    checked = launch.stop_everywhere(
        ctx, run_id, launch.record_hosts(ctx, rec), int(rec.get("grace", 10)), rec.get("log_dir")
    )
    result = Stopped(run_id, checked)
    runs.update(
        root, run_id, state="stopped" if not result.remaining else "stopping", remaining=result.remaining
    )
    return result
