"""What `labctl train` was asked to do, as one value.

Standard library only: the CLI builds a `TrainRequest` from its options, and `labctl --help`
must not pay for pydantic, paramiko or yaml.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from labctl.errors import InputError


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
    nodes: int | None = None  # SageMaker InstanceCount
    pvc: str | None = None  # k8s/trainjob: ReadWriteMany claim mounted at the checkpoint folder
    mount_path: str | None = None  # k8s/trainjob: where that claim appears in the pod
    cpu: str | None = None  # k8s/trainjob: CPU request per pod ("8", "500m")
    memory: str | None = None  # k8s/trainjob: memory request per pod ("32Gi")
    runtime: str | None = None  # trainjob: the ClusterTrainingRuntime it names
    requeue: bool | None = None  # slurm: requeue a preempted job, which resumes from its checkpoint
    # slurm: the interface the phase's own `env:` names for NCCL/Gloo (from the phases file, not a
    # flag); None: each node decides at job start
    named_iface: str | None = None

    def given(self) -> list[str]:
        """The options set, by field name, in field order."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]


@dataclass(frozen=True)
class TrainRequest:
    phase: int
    file: Path | None = None  # phases file; None: playbooks/train.yaml
    sets: tuple[str, ...] = ()  # --set key=value overrides, in order
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
    time_limit_s: int | None = None  # --time-limit: the trainer pauses before it; None: no limit


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
