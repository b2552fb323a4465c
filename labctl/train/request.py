"""What `labctl train` was asked to do, as one value.

Standard library only: the CLI builds a `TrainRequest` from its options, and `labctl --help`
must not pay for pydantic, paramiko or yaml.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labctl.output.errors import InputError
from labctl.train import opts

# Binary units, as Slurm's --mem (64G) and Kubernetes' quantities (64Gi) both read them.
_MEMORY = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT])(?:i?B|i)?", re.IGNORECASE | re.ASCII)
_MIB_PER_UNIT = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
# The flags that describe a cluster's nodes when the lab's hosts do not (JobOptions field names).
CLUSTER_FIELDS = ("nodes", "gpus_per_node", "cpus_per_node", "memory_per_node")


@dataclass(frozen=True)
class ClusterShape:
    """A cluster's nodes as --nodes, --gpus-per-node, --cpus-per-node and --memory-per-node say."""

    nodes: int
    gpus_per_node: int  # 0: a CPU job
    cpus_per_node: int | None = None
    memory_mib: int | None = None

    def slurm_memory(self) -> str | None:
        """--memory-per-node as sbatch's --mem reads it."""
        if self.memory_mib is None:
            return None
        return f"{self.memory_mib // 1024}G" if self.memory_mib % 1024 == 0 else f"{self.memory_mib}M"

    def k8s_memory(self) -> str | None:
        """--memory-per-node as a Kubernetes quantity."""
        if self.memory_mib is None:
            return None
        return f"{self.memory_mib // 1024}Gi" if self.memory_mib % 1024 == 0 else f"{self.memory_mib}Mi"


def parse_memory(text: str, flag: str) -> int:
    """An amount of memory with its unit (64G, 64Gi, 512M) in MiB, rounded up."""
    m = _MEMORY.fullmatch(text.strip())
    if m is None or float(m.group(1)) <= 0:
        raise InputError(
            f"{flag} {text!r} is not an amount of memory.",
            f"Write a number and a unit, e.g. {flag} 64G (or 64Gi, 512M; binary units, as Slurm and "
            "Kubernetes read them).",
        )
    return max(1, math.ceil(float(m.group(1)) * _MIB_PER_UNIT[m.group(2).upper()]))


class JobOptions:
    """Settings only a cluster job file reads; a backend refuses those it has no use for.

    Its names are the options the backends declare (`opts.declared()`), each None when not
    given, plus those the phases file fills in (FROM_PHASE). Immutable, compared by value.
    """

    # slurm: the interface the phase's own `env:` names for NCCL/Gloo (from the phases file, not
    # a flag); None: each node decides at job start
    FROM_PHASE = ("named_iface",)

    __slots__ = ("_values",)
    _values: dict[str, Any]

    def __init__(self, **values: Any) -> None:
        given = {name: value for name, value in values.items() if value is not None}
        # Only given names are looked up: JobOptions() asks no backend, and a backend that replaces
        # a built-in (register) may declare fewer options than the command line offers.
        if given:
            known = self.names()
            unknown = [name for name in given if name not in known]
            if unknown:
                raise TypeError(f"JobOptions got unknown options: {', '.join(unknown)}")
            order = list(known)
            given = dict(sorted(given.items(), key=lambda item: order.index(item[0])))
            # Checked here, whichever backend takes them: a bad count is bad input for any of them.
            declared = opts.declared()
            for name, value in given.items():
                option = declared.get(name)
                if option is None:
                    continue
                if option.bound is not None and value < option.bound.least:
                    raise InputError(
                        f"{option.cli_flag} {value} is out of range: {option.bound.why}.",
                        f"Give {option.bound.hint}.",
                    )
                if option.check is not None:
                    option.check(value, option.cli_flag)
        object.__setattr__(self, "_values", given)

    @staticmethod
    def names() -> tuple[str, ...]:
        """Every option it takes: the backends' declarations, then those from the phases file."""
        return (*opts.declared(), *JobOptions.FROM_PHASE)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._values:
            return self._values[name]
        if name in self.names():
            return None
        raise AttributeError(f"JobOptions has no option {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"JobOptions is immutable: use replace({name}=...)")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobOptions) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._values.items())))

    def __repr__(self) -> str:
        return f"JobOptions({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"

    def replace(self, **changes: Any) -> JobOptions:
        """A copy with `changes` (None: not given)."""
        return JobOptions(**{**self._values, **changes})

    def given(self) -> list[str]:
        """The options set, by name, in declaration order."""
        return list(self._values)

    def cluster_flags(self) -> list[str]:
        """The cluster-describing options given, as flags."""
        return [flag(f) for f in CLUSTER_FIELDS if getattr(self, f) is not None]

    def cluster(self) -> ClusterShape | None:
        """The cluster the flags describe; None when none is given (the lab's hosts describe it)."""
        if not self.cluster_flags():
            return None
        if self.nodes is None or self.gpus_per_node is None:
            given = ", ".join(self.cluster_flags())
            needed = {"--nodes 4": self.nodes, "--gpus-per-node 8": self.gpus_per_node}
            missing = [example for example, value in needed.items() if value is None]
            raise InputError(
                f"{given} also needs {' and '.join(m.split()[0] for m in missing)}: together they "
                "describe the cluster's nodes.",
                f"Add e.g. {' '.join(missing)} (--gpus-per-node 0 for a CPU job), or drop {given} to let "
                "the lab's training hosts describe the cluster.",
            )
        memory = self.memory_per_node
        return ClusterShape(
            self.nodes,
            self.gpus_per_node,
            self.cpus_per_node,
            parse_memory(memory, "--memory-per-node") if memory is not None else None,
        )


def flag(name: str) -> str:
    """The command-line flag of a JobOptions option."""
    option = opts.declared().get(name)
    return option.cli_flag if option is not None else "--" + name.replace("_", "-")


@dataclass(frozen=True)
class TrainRequest:
    phase: int
    file: Path | None = None  # phases file; None: playbooks/train.yaml
    sets: tuple[str, ...] = ()  # --set key=value overrides, in order
    profile: str | None = None  # --profile: a named set of settings below --set (phases.PROFILES)
    limit: str | None = None  # hosts instead of the phase's `hosts`
    device: str | None = None  # "cuda", "cpu", "auto"; None: the phase's
    python: str | None = None
    script: Path | None = None  # a script on this machine; None: the phase's, else the reference trainer
    script_args: tuple[str, ...] = ()
    dry_run: bool = False
    backend: str = "ssh"  # a name in labctl.train.backends
    output: Path | None = None  # folder for job files; None: the run's folder
    job: JobOptions = field(default_factory=JobOptions)
    detach: bool = False
    ranks: frozenset[int] | None = frozenset({0})  # ranks whose lines are shown; None: all
    # --time-limit as asked; the planner puts it on the LaunchSpec, where backends read it.
    time_limit_s: int | None = None


def parse_ranks(text: str) -> frozenset[int] | None:
    """`--ranks`: "all", or a comma list of ranks."""
    if text.strip() == "all":
        return None
    try:
        return frozenset(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError(
            f"--ranks {text!r} is not a list of ranks.", "Write e.g. --ranks 0,1 or --ranks all."
        ) from None
