"""Where a planned training run goes: launched over SSH, or written as a cluster's job file.

Every backend takes the same `PlannedRun` (the request, the phase's settings and the
`LaunchSpec` that preflight produced) and returns a result the CLI renders, the way
torchx's schedulers take one AppDef. A backend implements the whole `Backend` protocol
(`BaseBackend` holds the defaults): its `name`, what it `runs_on`, whether the lab's hosts
answer a preflight for it (`uses_lab_hosts`), the request options it reads (`options`, as
torchx schedulers declare their run_opts), `check_request` and `submit`. A request option that
the chosen backend does not declare is refused by `check_options`, naming the backends that
take it. A new backend is one module with such a class and one line in `BUILTIN`; `--backend`
offers it from there.

The run's time limit is `LaunchSpec.time_limit_s` and nowhere else: each backend renders it
into its own form (sbatch --time, activeDeadlineSeconds, MaxRuntimeInSeconds, the session's
limit).

Standard library only at import: the CLI reads `names()` to build `--backend`'s choices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from labctl.agent.core.registry import load
from labctl.output.errors import InputError
from labctl.train.opts import Option as Option  # the declaration type, where backends import it

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.inventory.model import Host
    from labctl.output.progress import Progress
    from labctl.train.phases import Settings
    from labctl.train.request import JobOptions, TrainRequest
    from labctl.train.results import TrainResult
    from labctl.train.spec import LaunchSpec

# name -> "module:class"; imported only when chosen, so `--help` does not pay for yaml or paramiko.
BUILTIN: dict[str, str] = {
    "ssh": "labctl.train.backends.ssh:SshBackend",
    "slurm": "labctl.train.backends.slurm:SlurmBackend",
    "k8s": "labctl.train.backends.k8s:K8sBackend",
    "trainjob": "labctl.train.backends.trainjob:TrainJobBackend",
    "kaggle": "labctl.train.backends.kaggle:KaggleBackend",
    "sagemaker": "labctl.train.backends.sagemaker:SageMakerBackend",
}


class RunsOn(StrEnum):
    """Whose machines a backend's run goes to: what `labctl train` asks, and of whom, to plan it."""

    LAB = "lab"  # the inventory's hosts: each answers the preflight over SSH
    # A cluster's nodes: --nodes/--gpus-per-node describe them and no lab host is asked; without
    # those flags the lab's training hosts stand for them, preflight included.
    CLUSTER = "cluster"
    PLATFORM = "platform"  # a cloud platform's machine: planned from the phase alone


@dataclass(frozen=True)
class PlannedRun:
    """A run that passed preflight: everything a backend needs to start it or write it down."""

    request: TrainRequest
    settings: Settings
    spec: LaunchSpec
    hosts: list[Host]
    script: Path | None  # the user's script on this machine, if any
    runs_root: Path  # the controller's run records (train/runs.py)

    @property
    def default_checkpoint(self) -> bool:
        """The phase kept labctl's own checkpoint folder, which belongs to lab hosts, not a cluster."""
        return self.settings.checkpoint_dir == type(self.settings).model_fields["checkpoint_dir"].default


@runtime_checkable
class Backend(Protocol):
    """Everything `labctl train` asks of a backend; train/run.py probes for nothing else."""

    name: str  # what follows --backend
    runs_on: RunsOn
    # Whether the lab's hosts plan the run (preflight over SSH). False: planned from the phase
    # alone (a cloud session). A cluster backend's is True: with --nodes/--gpus-per-node the
    # flags describe the cluster instead, and no host is asked.
    uses_lab_hosts: bool
    options: tuple[Option, ...]  # the request options it reads; `check_options` refuses the others
    # Options it refuses with a reason of its own (name -> (message, hint)), before the generic refusal.
    refusals: Mapping[str, tuple[str, str]]

    def check_request(self, request: TrainRequest, settings: Settings) -> None:
        """Refuse what it cannot do with the request, before any host is asked."""
        ...

    def submit(self, ctx: Context, run: PlannedRun, progress: Progress) -> TrainResult:
        """Start the run, or write it down for another launcher. An attached run's live output
        goes to `progress` (QUIET in --json mode): "started" (spec, log_dir) once, then "line"
        (label: "host/rank" or "host/torchrun", text, stream: stdout/stderr) per line shown."""
        ...


class BaseBackend:
    """The protocol's defaults: a backend on the lab's hosts that reads no option and checks nothing."""

    name: str
    runs_on: RunsOn = RunsOn.LAB
    uses_lab_hosts: bool = True
    options: tuple[Option, ...] = ()
    refusals: Mapping[str, tuple[str, str]] = MappingProxyType({})

    def check_request(self, request: TrainRequest, settings: Settings) -> None:
        return None

    def submit(self, ctx: Context, run: PlannedRun, progress: Progress) -> TrainResult:
        raise NotImplementedError


_registered: dict[str, Backend] = {}


def names() -> tuple[str, ...]:
    return (*BUILTIN, *(n for n in _registered if n not in BUILTIN))


def register(backend: Backend) -> None:
    """Add (or replace) a backend at run time: a plugin, or a test's fake."""
    _registered[backend.name] = backend


def unregister(name: str) -> None:
    _registered.pop(name, None)


def running_on(where: RunsOn) -> list[str]:
    """The names of the backends whose runs go to `where`."""
    return [n for n in names() if get(n).runs_on is where]


def get(name: str) -> Backend:
    if name in _registered:
        return _registered[name]
    if name not in BUILTIN:
        raise InputError(f"unknown backend {name!r}.", f"Use one of: {', '.join(names())}.")
    backend: Backend = load(BUILTIN[name])()
    return backend


def declared_options() -> dict[str, Option]:
    """Every backend's options by name, each merged into the one flag it has (`opts.declared()`)."""
    from labctl.train.opts import merge

    seen: dict[str, list[Option]] = {}
    for name in names():
        for option in get(name).options:
            seen.setdefault(option.name, []).append(option)
    return {name: merge(found) for name, found in seen.items()}


def option_names(backend: Backend) -> set[str]:
    return {o.name for o in backend.options}


def check_options(backend: Backend, job: JobOptions) -> None:
    """Refuse the request options `backend` does not declare, naming the backends that take them."""
    from labctl.train.request import flag

    given = job.given()
    for name in given:
        if name in backend.refusals:
            raise InputError(*backend.refusals[name])
    foreign = [o for o in given if o not in option_names(backend)]
    if not foreign:
        return
    flags = ", ".join(flag(o) for o in foreign)
    others = [b for b in map(get, names()) if b.name != backend.name]
    # The backends that take all of them, else those that take any.
    takers = [b.name for b in others if set(foreign) <= option_names(b)] or [
        b.name for b in others if set(foreign) & option_names(b)
    ]
    taker = " or ".join(takers)
    raise InputError(
        f"{flags} applies to --backend {taker}, not {backend.name}."
        if taker
        else f"{flags} does not apply to --backend {backend.name}.",
        f"Drop it, or use --backend {taker}." if taker else "Drop it.",
    )
