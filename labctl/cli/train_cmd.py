"""`labctl train --phase N`: torchrun across the lab's hosts, and `train status` / `train stop`."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from labctl.cli.common import DryRunAlias, InventoryOpt, JsonOpt, VerboseOpt, check_option
from labctl.cli.runner import Outcome, run_command
from labctl.train import backends, opts
from labctl.train.opts import Option

if TYPE_CHECKING:
    from labctl.hosts.context import Context

app = typer.Typer(no_args_is_help=False, invoke_without_command=True)

# From the registry, so a backend added there is offered here without touching this file.
Backend = StrEnum("Backend", {name: name for name in backends.names()})  # type: ignore[misc]


class Device(StrEnum):
    auto = "auto"
    cuda = "cuda"
    cpu = "cpu"


# The job-file flags are the backends' declared options (labctl.train.opts): a backend's new
# option appears here without touching this file. Their parameters are prefixed so that none
# can shadow the command's own (Slurm's --time is `time_limit`, like the run's --time-limit).
_JOB = "job_"


def _job_parameter(option: Option) -> inspect.Parameter:
    decl = f"{option.cli_flag}/--no-{option.cli_flag[2:]}" if option.type is bool else option.cli_flag
    flag = typer.Option(decl, help=option.flag_help or None, min=option.cli_min)
    return inspect.Parameter(
        _JOB + option.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[Optional[option.type], flag],
    )


def _with_job_flags(command: Callable[..., None]) -> Callable[..., None]:
    """`command` with a flag for every declared job option, before --detach, in place of its **job."""
    sig = inspect.signature(command, eval_str=True)
    own = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    at = next(i for i, p in enumerate(own) if p.name == "detach")
    # Typer reads parameters by name; keyword-only keeps Python from objecting to their order.
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]
    job = [_job_parameter(o) for o in opts.declared().values()]
    command.__signature__ = sig.replace(parameters=[*own[:at], *job, *own[at:]])  # type: ignore[attr-defined]
    return command


@app.callback()
@_with_job_flags
def train(
    ctx: typer.Context,
    phase: Annotated[
        Optional[int], typer.Option("--phase", "-p", min=1, help="The training phase (1-4 in the seed lab).")
    ] = None,
    file: Annotated[
        Optional[Path],
        typer.Option(
            "--file",
            "-f",
            help="Phases file. Default: playbooks/train.yaml beside the inventory, else in the current folder.",
        ),
    ] = None,
    set_: Annotated[
        Optional[list[str]],
        typer.Option(
            "--set",
            "-s",
            help="Override a setting: --set steps=40, --set model.d_model=64. Repeatable. "
            "`labctl train settings` lists every setting.",
        ),
    ] = None,
    profile: Annotated[
        Optional[str],
        typer.Option(
            "--profile",
            help="A named set of settings, above the phase's and below --set: cpu-demo (phase 3 sized "
            "for CPUs). `labctl train settings` shows what each sets.",
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
        bool, check_option("Preflight, then print each host's exact command and environment.")
    ] = False,
    _dry_run: DryRunAlias = False,
    backend: Annotated[
        Backend,
        typer.Option(
            "--backend",
            help="ssh launches now; slurm / k8s (PyTorchJob) / trainjob (Kubeflow Trainer v2) write a job file for the same run; kaggle / sagemaker a cloud session.",
        ),
    ] = Backend("ssh"),
    output: Annotated[
        Optional[Path],
        typer.Option(
            "--output", "-o", help="Folder for --backend slurm/k8s/trainjob/kaggle/sagemaker files."
        ),
    ] = None,
    time_limit: Annotated[
        Optional[str],
        typer.Option(
            "--time-limit",
            help="Stop before this much time (3h50m, 45m, 90s) at a step every rank agrees on, with a "
            "checkpoint there; exit 75, and the same command again resumes. For kaggle/sagemaker: the "
            "session's length (default and maximum: the platform's).",
        ),
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
    **job: Any,
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

    With --backend slurm, k8s or trainjob, --nodes N --gpus-per-node G describe the cluster
    instead of the lab: no lab host is asked and no inventory is needed; --check then shows
    the job as it would be written.

    --time-limit 3h50m time-boxes the run (a cloud session, a reservation): before the limit,
    leaving room for one checkpoint, every rank stops at the same step, writes a checkpoint and
    the run ends "time limit reached, resumable at step N". Run the same command again to resume.

    A phase's settings are labctl's defaults, then the phases file's `defaults:`, then the
    phase, then --profile, then --set; `labctl train settings` lists every setting, its default
    and meaning, and the profiles.

    Exit code: 0 the run finished; 75 the time limit paused it (resumable); 1 preflight refused
    or a host failed; 2 bad input; 130 Ctrl-C.

    Examples:

        labctl train --phase 1 --check

        labctl train --phase 1 --limit m5,irina --device cpu --set steps=50

        labctl train --phase 3 --limit m5 --device cpu --profile cpu-demo --set steps=3

        labctl train --phase 2 --detach && labctl train status

        labctl train --phase 2 --time-limit 3h50m

        labctl train --phase 2 --backend k8s --image registry.lab/cet:1 -o jobs/

        labctl train --backend slurm --phase 1 --nodes 4 --gpus-per-node 8 --check

        labctl train --phase 2 --backend kaggle --kaggle-id alice/cet-p2-s1 -o kaggle/s1
    """
    if ctx.invoked_subcommand is not None:
        return
    from labctl.output.errors import InputError
    from labctl.output.progress import shown
    from labctl.train import render, run
    from labctl.train.duration import parse_duration
    from labctl.train.request import JobOptions, TrainRequest, parse_ranks
    from labctl.transport.shell import split_words

    if phase is None:
        raise InputError("Which phase? --phase is required.", "Write e.g. labctl train --phase 1 --check")
    request = TrainRequest(
        phase=phase,
        file=file,
        sets=tuple(set_ or ()),
        profile=profile,
        limit=limit,
        device=device.value if device else None,
        python=python,
        script=script,
        script_args=tuple(split_words(script_args, "--script-args")),
        dry_run=dry_run,
        backend=backend.value,
        output=output,
        job=JobOptions(**{name.removeprefix(_JOB): value for name, value in job.items()}),
        detach=detach,
        ranks=parse_ranks(ranks),
        time_limit_s=parse_duration(time_limit) if time_limit is not None else None,
    )

    def work(c: Context) -> Outcome:
        result = run.start(c, request, shown(c, render.LiveView(c.console).shows()))
        from labctl.train import results

        if isinstance(result, results.Attached) and result.interrupted:
            from labctl.cli.interrupted import carry_on

            carry_on("train", result.carry_on())  # what the run really wrote, for the Ctrl-C message
        return Outcome(result.to_json(), lambda: render.render_result(c.console, result), result.exit_code)

    run_command(ctx, work, inventory, json_out, verbose)


@app.command("settings")
def settings(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Every setting a phase takes (in the phases file or with --set): its default, an example, what it means;
    then the profiles --profile takes and what each sets.

    Nested settings are dotted as --set takes them (model.d_model); in the file they nest
    (model: {d_model: 512}).
    """
    from labctl.output.console import emit_json, make_console
    from labctl.train.phases import PROFILES, describe_settings
    from labctl.train.render import render_settings

    rows = describe_settings()
    profiles: list[dict[str, Any]] = [
        {"profile": n, "meaning": m, "sets": list(sets)} for n, (m, sets) in PROFILES.items()
    ]
    root = ctx.find_root().obj or {}
    if json_out or root.get("json"):
        emit_json({"settings": rows, "profiles": profiles})
        return
    render_settings(make_console(), rows, profiles)


@app.command("backends")
def backends_cmd(
    ctx: typer.Context,
    name: Annotated[Optional[str], typer.Argument(help="One backend (default: every one).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """The backends --backend takes and the options each reads: name, type, default and meaning.

    Examples:

        labctl train backends slurm

        labctl --json train backends
    """
    from labctl.output.console import emit_json, make_console
    from labctl.output.errors import InputError
    from labctl.train.render import render_backends

    known = backends.names()
    if name is not None and name not in known:
        raise InputError(f"unknown backend {name!r}.", f"Use one of: {', '.join(known)}.")
    rows: list[dict[str, Any]] = [
        {"backend": n, "options": [opts.describe(o) for o in backends.get(n).options]}
        for n in ([name] if name is not None else known)
    ]
    root = ctx.find_root().obj or {}
    if json_out or root.get("json"):
        emit_json(rows)
        return
    render_backends(make_console(), rows)


@app.command("status")
def status(
    ctx: typer.Context,
    run_id: Annotated[Optional[str], typer.Argument(help="A run id (default: the recent runs).")] = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Runs recorded here and, for those still running, what their hosts say (step, loss, state)."""
    from labctl.train import run
    from labctl.train.render import render_status

    def work(c: Context) -> Outcome:
        result = run.status(c, run_id)
        return Outcome(result.to_json(), lambda: render_status(c.console, result))

    run_command(ctx, work, inventory, json_out, verbose)


@app.command("show")
def show(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="A run id (see `labctl train status`).")],
    samples: Annotated[
        bool,
        typer.Option(
            "--samples",
            help="Phase 3's samples: a model's program per step, the sandbox's exit, stderr and the "
            "first test's output (why a reward is 0).",
        ),
    ] = False,
    last: Annotated[int, typer.Option("--last", "-n", min=1, help="How many of the newest samples.")] = 3,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """One run as recorded here: its phase, state, hosts and newest event; with --samples, what the
    models wrote in its last steps and how the sandbox ran it (attached phase-3 runs).

    Examples:

        labctl train show p3-20250101-120000-ab12 --samples

        labctl --json train show p3-20250101-120000-ab12 --samples -n 10
    """
    from labctl.train import runs
    from labctl.train.render import render_show
    from labctl.train.results import _last_local_event

    def work(c: Context) -> Outcome:
        root = runs.runs_dir(c.inventory_file())
        record = runs.load(root, run_id)
        event = _last_local_event(root / run_id / "metrics.jsonl")
        doc: dict[str, Any] = {"run": record, "last_event": event}
        if samples:
            doc["samples"] = runs.samples(root, run_id, last)
        return Outcome(doc, lambda: render_show(c.console, doc))

    run_command(ctx, work, inventory, json_out, verbose)


@app.command("stop")
def stop(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run to stop (see `labctl train status`).")],
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Stop a run on every host: SIGTERM, SIGKILL after its grace period, then check nothing is left."""
    from labctl.train import run
    from labctl.train.render import render_stopped

    def work(c: Context) -> Outcome:
        result = run.stop(c, run_id)
        return Outcome(result.to_json(), lambda: render_stopped(c.console, result), result.exit_code)

    run_command(ctx, work, inventory, json_out, verbose)
