"""What `labctl train`, `train status` and `train stop` come back with, before anyone renders it.

Each result's `to_json()` is exactly what `--json` prints, and `exit_code` what the command
exits with; the CLI only turns them into text.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labctl.agent.train.settings import EXIT_PAUSED
from labctl.output.errors import EXIT_HOST, EXIT_INPUT, EXIT_INTERRUPTED, EXIT_OK
from labctl.train.spec import LaunchSpec

if TYPE_CHECKING:
    from labctl.hosts.fanout import HostResult
    from labctl.train.launch import Outcome


@dataclass(frozen=True)
class DryRun:
    """Preflight passed; what each host would run."""

    spec: LaunchSpec
    exit_code = EXIT_OK

    def to_json(self) -> dict[str, Any]:
        spec = self.spec
        return {
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


@dataclass(frozen=True)
class JobFiles:
    """The run written as files for a cluster's own launcher; nothing was started."""

    run_id: str
    backend: str
    files: list[Path]
    submit: str  # the shell command that hands the files to the cluster
    notes: tuple[str, ...] = ()  # what the cluster must provide (e.g. the torch its image needs)
    exit_code = EXIT_OK

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "run_id": self.run_id,
            "backend": self.backend,
            "files": [str(p) for p in self.files],
        }
        if self.notes:
            out["notes"] = list(self.notes)
        return out


# A dry run shows a job's text files as written, but a line longer than this cut short: the agent
# zip's base64 is one line of a few hundred kB in a Kubernetes manifest.
PREVIEW_LINE_MAX = 2000


@dataclass(frozen=True)
class PreviewFile:
    name: str
    size: int  # bytes
    text: str | None  # None: not text (the agent zip)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.size, "text": self.text}


@dataclass(frozen=True)
class JobPreview:
    """A job for a cluster that --nodes describes, as it would be written (`--check`); nothing was."""

    spec: LaunchSpec
    backend: str
    gpus_per_node: int
    files: list[PreviewFile]
    notes: tuple[str, ...] = ()
    exit_code = EXIT_OK

    @classmethod
    def read(cls, written: JobFiles, folder: Path, gpus_per_node: int, spec: LaunchSpec) -> JobPreview:
        """The files `written` put into `folder`, read back before the folder goes."""
        files = []
        for path in written.files:
            data = path.read_bytes()
            try:
                text: str | None = None if b"\0" in data else data.decode()
            except UnicodeDecodeError:
                text = None
            if text is not None:
                text = "".join(_cut(line) for line in text.splitlines(keepends=True))
            files.append(PreviewFile(str(path.relative_to(folder)), len(data), text))
        return cls(spec, written.backend, gpus_per_node, files, written.notes)

    def to_json(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "run_id": spec.run_id,
            "phase": spec.phase,
            "backend": self.backend,
            "dry_run": True,
            "nodes": spec.nnodes,
            "gpus_per_node": self.gpus_per_node,
            "processes_per_node": spec.nodes[0].nproc,
            "device": spec.nodes[0].device,
            "world_size": spec.world_size,
            "files": [f.to_json() for f in self.files],
            "notes": list(self.notes),
        }


def _cut(line: str) -> str:
    if len(line) <= PREVIEW_LINE_MAX:
        return line
    end = "\n" if line.endswith("\n") else ""
    return f"{line[:120]}... ({len(line.rstrip()) - 120} more characters){end}"


@dataclass(frozen=True)
class Detached:
    """Every host was asked to start the run in the background."""

    run_id: str
    results: list[HostResult]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.ok else EXIT_HOST

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "detached": True, "results": [r.to_json() for r in self.results]}


def left_over(checked: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """The hosts where a process of the run outlived the stop, with those processes."""
    return {h: p for h, p in checked.items() if p}


def count_restarts(events: Iterable[dict[str, Any]]) -> int:
    """How often the workers restarted, from rank 0's events.

    Rank 0 says "start" each time its workers (re)start. Its TORCHELASTIC_RESTART_COUNT stays 0
    when another host failed and this one only re-joined, so the starts are what count.
    """
    events = list(events)
    return max(
        sum(1 for e in events if e.get("event") == "start") - 1,
        max((int(e.get("restart") or 0) for e in events), default=0),
        0,
    )


@dataclass(frozen=True)
class Attached:
    """An attached run that has ended: how each host fared, what rank 0 reported, what is left."""

    spec: LaunchSpec
    results: list[HostResult]
    events: list[dict[str, Any]]  # rank 0's, in order
    interrupted: bool
    failed_host: str | None
    first_step_seconds: float | None
    checked: dict[str, list[dict[str, Any]]]  # every host asked afterwards: its processes of the run
    log_dir: Path
    fatal: str | None = None  # the trainer's own reason when a fatal error ended the run (no restart)

    @classmethod
    def from_outcome(cls, spec: LaunchSpec, outcome: Outcome, log_dir: Path) -> Attached:
        return cls(
            spec,
            outcome.results,
            outcome.events,
            outcome.interrupted,
            outcome.failed_host,
            outcome.first_step_seconds,
            outcome.remaining,
            log_dir,
            outcome.fatal,
        )

    @property
    def run_id(self) -> str:
        return self.spec.run_id

    @property
    def steps(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == "step"]

    @property
    def remaining(self) -> dict[str, list[dict[str, Any]]]:
        return left_over(self.checked)

    @property
    def paused(self) -> dict[str, Any] | None:
        """Rank 0's "paused" event when the time limit ended the run (its last start's, after restarts)."""
        return paused_event(self.events)

    @property
    def resume_step(self) -> int | None:
        paused = self.paused
        return int(paused["resume_step"]) if paused and self.state == "paused" else None

    @property
    def state(self) -> str:
        if self.interrupted:
            return "interrupted"
        ok = bool(self.results) and all(r.ok for r in self.results)
        if not ok:
            return "failed"
        return "paused" if self.paused is not None else "finished"

    @property
    def restarts(self) -> int:
        return count_restarts(self.events)

    @property
    def last_checkpoint(self) -> int | None:
        """The newest step a checkpoint holds, as rank 0 logged it: one written by this run, or the
        one it resumed from; None when the run had none to resume from and wrote none."""
        return newest_checkpoint_step(self.events)

    def carry_on(self) -> str:
        """What running the same command again does after Ctrl-C, from what the run really wrote."""
        step = self.last_checkpoint
        where = self.spec.settings.get("checkpoint_dir")
        if step is None:
            return (
                "The run's processes were stopped on every host. No checkpoint was written: the same "
                "`labctl train` command starts again from step 1."
            )
        return (
            "The run's processes were stopped on every host. Run the same `labctl train` command again: "
            f"it resumes from the checkpoint of step {step}" + (f" in {where}." if where else ".")
        )

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        if self.remaining:
            return EXIT_HOST
        if self.state == "failed" and self.fatal is not None:
            # The trainer refused what it was given (settings, a token, the lab's set-up): the
            # same command fails the same way until the input is fixed, as labctl's own refusals.
            return EXIT_INPUT
        return {"finished": EXIT_OK, "paused": EXIT_PAUSED}.get(self.state, EXIT_HOST)

    def to_json(self) -> dict[str, Any]:
        steps = self.steps
        return {
            "run_id": self.run_id,
            "phase": self.spec.phase,
            "state": self.state,
            "world_size": self.spec.world_size,
            "hosts": [r.to_json() for r in self.results],
            "failed_host": self.failed_host,
            "steps_logged": len(steps),
            "first_step": steps[0]["step"] if steps else None,
            "last_step": steps[-1]["step"] if steps else None,
            "first_loss": steps[0]["loss"] if steps else None,
            "last_loss": steps[-1]["loss"] if steps else None,
            "restarts": self.restarts,
            "resumed_from": [e.get("resumed_from") for e in self.events if e.get("event") == "start"],
            "done": any(e.get("event") == "done" for e in self.events),
            "resume_step": self.resume_step,
            "first_step_seconds": self.first_step_seconds,
            "remaining_processes": self.remaining,
            "log_dir": str(self.log_dir),
            "reason": self.fatal,
            "last_checkpoint": self.last_checkpoint,
        }


def newest_checkpoint_step(events: Iterable[dict[str, Any]]) -> int | None:
    """The newest checkpoint step among rank 0's events: "checkpoint" events and what a "start"
    resumed from (a restart that found none says None, and an older one still counts)."""
    steps = [
        int(e["step"] if e.get("event") == "checkpoint" else e["resumed_from"])
        for e in events
        if (e.get("event") == "checkpoint" and e.get("step") is not None)
        or (e.get("event") == "start" and e.get("resumed_from") is not None)
    ]
    return max(steps, default=None)


def paused_event(events: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The "paused" event that ends `events` (rank 0's, oldest first), if the time limit ended them.

    Only after the newest "start": a restarted worker group that then finished is not paused.
    """
    found = None
    for e in events:
        kind = e.get("event")
        if kind == "start":
            found = None
        elif kind == "paused" and e.get("resume_step") is not None:
            found = e
    return found


TrainResult = DryRun | JobFiles | JobPreview | Detached | Attached


@dataclass(frozen=True)
class RunsStatus:
    """Recorded runs, newest first, each with what its hosts said (`host_state`) where they were asked."""

    root: Path  # where the records are
    rows: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.rows}

    def last_event(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """The newest event a host reported, else rank 0's newest step as an attached run streamed it here."""
        events = [s.get("last_event") for s in row["host_state"].values() if s.get("last_event")]
        return events[0] if events else _last_local_event(self.root / row["run_id"] / "metrics.jsonl")


def _last_local_event(path: Path) -> dict[str, Any] | None:
    from labctl.agent.train.host import newest_event

    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    return newest_event(
        lines,
        want=lambda e: (
            e["event"] == "paused" or (e["event"] in ("step", "done") and e.get("loss") is not None)
        ),
    )


@dataclass(frozen=True)
class Stopped:
    run_id: str
    checked: dict[str, list[dict[str, Any]]]  # every host asked: its processes of the run left after SIGKILL

    @property
    def remaining(self) -> dict[str, list[dict[str, Any]]]:
        return left_over(self.checked)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if not self.remaining else EXIT_HOST

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "remaining": self.remaining, "hosts": list(self.checked)}
