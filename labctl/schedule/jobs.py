"""The jobs `labctl cron install` knows: one line each, name -> labctl arguments + help."""

from __future__ import annotations

from dataclasses import dataclass

from labctl.agent import paths
from labctl.errors import InputError


@dataclass(frozen=True)
class Job:
    name: str
    args: tuple[str, ...]  # labctl's arguments after `-i INVENTORY`
    help: str
    output: str | None = None  # a file on the orchestrator that keeps the job's stdout


JOBS: dict[str, Job] = {
    j.name: j
    for j in (
        Job("rotate", ("rotate",), "swap models of the LLM orchestra's warm set (labctl rotate)"),
        Job(
            "facts",
            ("facts", "--no-torch", "--json"),
            "a facts snapshot of every host, kept in " + paths.CONTROLLER_DIR + "/facts.json",
            output=paths.CONTROLLER_DIR + "/facts.json",
        ),
    )
}


def get_job(name: str) -> Job:
    job = JOBS.get(name)
    if job is None:
        known = "; ".join(f"{j.name}: {j.help}" for j in JOBS.values())
        raise InputError(f"There is no job '{name}' to schedule.", f"Jobs: {known}.")
    return job
