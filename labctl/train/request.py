"""What `labctl train` was asked to do, as one value.

Standard library only: the CLI builds a `TrainRequest` from its options, and `labctl --help`
must not pay for pydantic, paramiko or yaml.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from pathlib import Path

from labctl.output.errors import InputError

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


@dataclass(frozen=True)
class JobOptions:
    """Settings only a cluster job file reads; a backend refuses those it has no use for."""

    image: str | None = None  # container image (k8s)
    partition: str | None = None  # Slurm partition
    time_limit: str | None = None  # Slurm --time
    min_nodes: int | None = None  # k8s elastic minReplicas
    kaggle_id: str | None = None  # USER/SLUG the Kaggle kernel is pushed as
    resume_from: str | None = None  # USER/SLUG of the Kaggle session whose checkpoints this one resumes
    role_arn: str | None = None  # SageMaker execution role
    s3: str | None = None  # s3://bucket/prefix for SageMaker's source, checkpoints and output
    instance_type: str | None = None  # SageMaker instance type (default: the phase's, else seed 001's)
    nodes: int | None = None  # SageMaker InstanceCount; slurm/k8s/trainjob: the cluster's nodes
    pvc: str | None = None  # k8s/trainjob: ReadWriteMany claim mounted at the checkpoint folder
    mount_path: str | None = None  # k8s/trainjob: where that claim appears in the pod
    cpu: str | None = None  # k8s/trainjob: CPU request per pod ("8", "500m")
    memory: str | None = None  # k8s/trainjob: memory request per pod ("32Gi")
    runtime: str | None = None  # trainjob: the ClusterTrainingRuntime it names
    requeue: bool | None = None  # slurm: requeue a preempted job, which resumes from its checkpoint
    # slurm: the interface the phase's own `env:` names for NCCL/Gloo (from the phases file, not a
    # flag); None: each node decides at job start
    named_iface: str | None = None
    # slurm/k8s/trainjob: the cluster's nodes, described by flags instead of the lab's hosts
    gpus_per_node: int | None = None
    cpus_per_node: int | None = None
    memory_per_node: str | None = None  # as given: 64G, 64Gi, 512M

    def __post_init__(self) -> None:
        # Checked here, whichever backend takes them: a bad count is bad input for any of them.
        for flag, value, least, why, hint in (
            (
                "--nodes",
                self.nodes,
                1,
                "a job runs on one node at least",
                "the number of nodes, e.g. --nodes 4",
            ),
            (
                "--gpus-per-node",
                self.gpus_per_node,
                0,
                "a node cannot have fewer than 0 GPUs",
                "the GPUs each node has, e.g. --gpus-per-node 8, or 0 for a CPU job",
            ),
            (
                "--cpus-per-node",
                self.cpus_per_node,
                1,
                "a node gives the job one CPU at least",
                "the CPUs each node gives the job, e.g. --cpus-per-node 32",
            ),
        ):
            if value is not None and value < least:
                raise InputError(f"{flag} {value} is out of range: {why}.", f"Give {hint}.")
        if self.memory_per_node is not None:
            parse_memory(self.memory_per_node, "--memory-per-node")

    def given(self) -> list[str]:
        """The options set, by field name, in field order."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]

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


# JobOptions fields whose flag is not their name with dashes (--time-limit is the run's own limit).
_FLAGS = {"time_limit": "--time"}


def flag(field_name: str) -> str:
    """The command-line flag of a JobOptions field."""
    return _FLAGS.get(field_name) or "--" + field_name.replace("_", "-")


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
    job: JobOptions = JobOptions()
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
