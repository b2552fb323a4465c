"""The jobs `labctl cron install` knows: one line each, name -> labctl arguments + help."""

from __future__ import annotations

from dataclasses import dataclass

from labctl.agent.core import paths
from labctl.output.errors import InputError

# The orchestra file `cron install rotate -f FILE` copies into the orchestrator's lab copy
# (plan.PLAYBOOKS), named in the job's command so the entry says which file it rotates by.
ORCHESTRA_COPY = paths.CONTROLLER_DIR + "/lab/playbooks/orchestra.yaml"


@dataclass(frozen=True)
class Job:
    name: str
    args: tuple[str, ...]  # labctl's arguments after `-i INVENTORY`
    help: str
    output: str | None = None  # a file on the orchestrator that keeps the job's stdout
    # Jobs installed (and removed) with this one, each on its own schedule: (job name, cron fields).
    companions: tuple[tuple[str, str], ...] = ()
    # A job whose run waits for this one's lock first: they never run at the same time.
    waits_for: str | None = None


JOBS: dict[str, Job] = {
    j.name: j
    for j in (
        Job(
            "rotate",
            ("rotate", "-f", ORCHESTRA_COPY),
            "swap models of the LLM orchestra's warm set (labctl rotate), by the orchestra file -f",
        ),
        Job(
            "facts",
            ("facts", "--no-torch", "--json"),
            "a facts snapshot of every host, kept in " + paths.CONTROLLER_DIR + "/facts.json",
            output=paths.CONTROLLER_DIR + "/facts.json",
        ),
        Job(
            "ckpt-backup",
            ("ckpt", "backup"),
            "copy the newest checkpoints of every run to the storage host's library, then prune "
            "by retention (labctl ckpt backup); brings the weekly ckpt-verify with it",
            # Seed 000 §5.3: the library re-hashed weekly, on Sunday once the night's backup is done.
            companions=(("ckpt-verify", "0 6 * * 0"),),
        ),
        Job(
            "ckpt-verify",
            ("ckpt", "verify"),
            "re-hash every copy in the checkpoint library and name any damaged one (labctl ckpt verify)",
            waits_for="ckpt-backup",
        ),
    )
}


def companions(job: Job) -> list[tuple[Job, str]]:
    """The jobs `job` brings with it, each with its own schedule."""
    return [(get_job(name), schedule) for name, schedule in job.companions]


def get_job(name: str) -> Job:
    job = JOBS.get(name)
    if job is None:
        known = "; ".join(f"{j.name}: {j.help}" for j in JOBS.values())
        raise InputError(f"There is no job '{name}' to schedule.", f"Jobs: {known}.")
    return job
