"""Where a planned training run goes: launched over SSH, or written as a cluster's job file.

Every backend takes the same `PlannedRun` (the request, the phase's settings and the
`LaunchSpec` that preflight produced) and returns a result the CLI renders, the way
torchx's schedulers take one AppDef. A new backend is one module with a class that has a
`name`, what it `runs_on` and a `submit` method, and one line in `BUILTIN`; `--backend` offers
it from there.

Standard library only at import: the CLI reads `names()` to build `--backend`'s choices.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from labctl.errors import InputError

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.inventory.model import Host
    from labctl.train.phases import Settings
    from labctl.train.request import TrainRequest
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


class RunView(Protocol):
    """Where an attached run's live output goes while it runs (the CLI's console)."""

    def started(self, spec: LaunchSpec, log_dir: Path) -> None: ...

    def line(self, label: str, text: str, stream: str) -> None:
        """One line of a host's output; `label` is "host/rank" or "host/torchrun", `stream` stdout/stderr."""


class Backend(Protocol):
    name: str  # what follows --backend
    runs_on: RunsOn

    def submit(self, ctx: Context, run: PlannedRun, view: RunView | None) -> TrainResult:
        """Start the run, or write it down for another launcher; `view` is None in --json mode."""
        ...


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
    module, _, cls = BUILTIN[name].partition(":")
    backend: Backend = getattr(importlib.import_module(module), cls)()
    return backend
