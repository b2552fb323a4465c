"""What the Kaggle and SageMaker backends share: a run planned without the lab, written as files.

A cloud session runs on the platform's machine, not on the lab's hosts, so `labctl train`
plans it from the phase's settings alone (`offline_spec`): no preflight over SSH, no hosts.
The spec's `time_limit_s` is the session's length asked for; each platform turns it into its
own session and trainer limits (`platforms.Platform.limits`).
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

from labctl.output.errors import InputError
from labctl.train.backends import RunsOn, jobs, option_names
from labctl.train.request import JobOptions
from labctl.train.results import JobFiles
from labctl.train.spec import LaunchSpec

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.output.progress import Progress
    from labctl.train.backends import PlannedRun
    from labctl.train.phases import Settings


def offline_spec(
    settings: Settings,
    phase: int,
    run_id: str,
    script: Path | None,
    script_args: tuple[str, ...],
    time_limit_s: int | None = None,
) -> LaunchSpec:
    """The run as a cloud session sees it: the trainer's settings, the script, and no lab hosts.

    The settings carry no `time_limit`: the session's launcher gives the trainer what is left.
    """
    return LaunchSpec(
        run_id=run_id,
        phase=phase,
        dist_backend="nccl",
        nodes=(),
        head_address="",
        port=settings.port,
        max_restarts=settings.max_restarts,
        settings=settings.trainer_settings(phase, run_id, f"labctl-runs/{run_id}/metrics.jsonl"),
        script=str(script) if script else None,
        script_args=script_args,
        time_limit_s=time_limit_s,
    )


def checkpoint_subdir(phase: int) -> str:
    """Where a phase's checkpoints live inside the session's output: the same in every session."""
    return f"checkpoints/phase{phase}"


class CloudBackend(jobs.JobFileBackend):
    """A backend for a cloud platform's session: `write_session` writes it, the person pushes it."""

    runs_on = RunsOn.PLATFORM
    uses_lab_hosts = False  # train/run.py plans it with offline_spec, without preflight

    @abstractmethod
    def write_session(self, spec: LaunchSpec, folder: Path, job: JobOptions) -> list[Path]:
        """Write the session's files into `folder`; `spec.time_limit_s` None: the platform's longest session."""

    def write(self, spec: LaunchSpec, folder: Path, job: JobOptions) -> list[Path]:
        return self.write_session(spec, folder, job)

    def submit(self, ctx: Context, run: PlannedRun, progress: Progress) -> JobFiles:
        job = run.request.job
        if job.instance_type is None and run.settings.instance_type and "instance_type" in option_names(self):
            job = job.replace(instance_type=run.settings.instance_type)
        folder = run.request.output or run.runs_root / run.spec.run_id / self.name
        paths = self.write_session(run.spec, folder, job)
        return JobFiles(run.spec.run_id, self.name, paths, self.submit_command(paths))


def required(value: str | None, flag: str, backend: str, example: str, why: str) -> str:
    if value is None or not value.strip():
        raise InputError(f"--backend {backend} needs {flag}: {why}.", f"Add e.g. {flag} {example}.")
    return value.strip()
