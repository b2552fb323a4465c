"""Backends that write a training run as a cluster's job file instead of launching it.

`labctl train` launches torchrun over SSH, which suits a handful of lab hosts. When the lab
outgrows that (a scheduler owns the GPUs, hosts come and go), `--backend slurm` and
`--backend k8s` hand the SAME run, the same `LaunchSpec` the SSH launcher and `--check`
use, to the cluster's own launcher as a job file.

The output is self-contained: with the reference trainer, the agent zipapp that holds it
travels with the job (a `.pyz` next to the batch script, or a ConfigMap inside the
manifest), so nothing has to be installed on the cluster beyond Python and torch.

What changes on the way, and why:
- Host-specific settings stay behind: CUDA_VISIBLE_DEVICES (the scheduler picks the GPUs),
  the lab's interpreter paths and log folders. Only settings that mean the same on any
  node are carried (`PORTABLE_ENV`).
- Every node of a Slurm or Kubeflow job runs the same number of processes, where a
  heterogeneous lab may not: the job uses the largest count and says so in its header.
- c10d's rendezvous wait is `join_timeout` (torch ignores a plain `timeout` for c10d).
- The trainer's paths are relative to where the job starts (`for_cluster`).
- The scheduler's own limit comes from `LaunchSpec.time_limit_s` (`job_limit_s`), a backstop
  behind the trainer's pause.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

from labctl.output.errors import InputError
from labctl.train import backends
from labctl.train.backends import BaseBackend, Option, RunsOn
from labctl.train.opts import Bound
from labctl.train.request import JobOptions, parse_memory
from labctl.train.results import JobFiles
from labctl.train.spec import FRESH_STORE_ENV, LOG_PREFIX_TEMPLATE, RUN_ENV, TIME_LIMIT_ENV, LaunchSpec

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.output.progress import Progress
    from labctl.train.backends import PlannedRun
    from labctl.train.phases import Settings

LOG_PREFIX_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
DEVICE_ENV = "LABCTL_TRAIN_DEVICE"
TORCHRUN = "torch.distributed.run"
# Settings that mean the same on any node of a cluster. Host-bound ones (CUDA_VISIBLE_DEVICES,
# PATH, PYTHONPATH, the lab's log folders) are the scheduler's or the image's business.
PORTABLE_ENV = frozenset(
    {
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "OMP_NUM_THREADS",
        "NCCL_DEBUG",
        RUN_ENV,
        LOG_PREFIX_ENV,
        DEVICE_ENV,
        TIME_LIMIT_ENV,
        *FRESH_STORE_ENV,
    }
)
# A time-boxed run's job lives this much longer than --time-limit: the trainer pauses by the
# limit, counted from torchrun's start; the scheduler's own limit is the backstop behind it, for
# the job's start-up (allocation, image pull, interpreter) and a last checkpoint slower than foreseen.
JOB_GRACE_S = 300
# What the cluster's interpreter needs for the reference trainer: it uses torch.amp.GradScaler("cuda"),
# which torch 2.3 introduced; labctl pins and tests 2.13.0 (pyproject), and only that was tried.
TORCH_NEEDED = "the reference trainer needs torch >= 2.3 {where} (tried with torch 2.13.0, labctl's pin)."
# --nodes, --gpus-per-node, --cpus-per-node, --memory-per-node: a cluster described by flags
# instead of the lab's hosts (request.CLUSTER_FIELDS), read alike by every cluster backend.
CLUSTER_OPTIONS = (
    Option(
        "nodes",
        int,
        "the cluster's nodes (with gpus_per_node; no lab host is asked)",
        flag_help="slurm/k8s/trainjob: the cluster's nodes (with --gpus-per-node; no lab host is asked, "
        "no inventory needed). sagemaker: the instance count (default 1).",
        bound=Bound(1, "a job runs on one node at least", "the number of nodes, e.g. --nodes 4"),
    ),
    Option(
        "gpus_per_node",
        int,
        "GPUs per cluster node (0: a CPU job)",
        flag_help="slurm/k8s/trainjob: GPUs per cluster node (0: a CPU job).",
        bound=Bound(
            0,
            "a node cannot have fewer than 0 GPUs",
            "the GPUs each node has, e.g. --gpus-per-node 8, or 0 for a CPU job",
        ),
    ),
    Option(
        "cpus_per_node",
        int,
        "CPUs each node gives the job",
        flag_help="slurm/k8s/trainjob: CPUs each node gives the job.",
        bound=Bound(
            1,
            "a node gives the job one CPU at least",
            "the CPUs each node gives the job, e.g. --cpus-per-node 32",
        ),
    ),
    Option(
        "memory_per_node",
        str,
        "memory each node gives the job, e.g. 64G",
        flag_help="slurm/k8s/trainjob: memory each node gives the job, e.g. 64G.",
        check=parse_memory,
    ),
)


class JobFileBackend(BaseBackend, ABC):
    """A backend whose `submit` writes files into a folder and says how to hand them to the cluster."""

    runs_on = RunsOn.CLUSTER

    @abstractmethod
    def write(self, spec: LaunchSpec, folder: Path, job: JobOptions) -> list[Path]:
        """Write the job's files for `spec` (already made cluster-relative) into `folder`."""

    @abstractmethod
    def submit_command(self, paths: list[Path]) -> str:
        """The shell command that submits what `write` wrote."""

    def notes(self, spec: LaunchSpec, job: JobOptions) -> list[str]:
        """Lines the CLI shows beside the files: what the cluster must provide, what it leaves idle."""
        nproc, device = uniform(spec)
        return idle_gpus_note(nproc, job.gpus_per_node) if device == "cuda" else []

    def with_phase(self, job: JobOptions, settings: Settings) -> JobOptions:
        """The job options with the phase file's defaults for those no flag gave (none by default)."""
        return job

    def submit(self, ctx: Context, run: PlannedRun, progress: Progress) -> JobFiles:
        spec = for_cluster(run.spec, run.default_checkpoint)
        folder = run.request.output or run.runs_root / spec.run_id / self.name
        job = self.with_phase(run.request.job, run.settings)
        paths = self.write(spec, folder, job)
        return JobFiles(
            spec.run_id, self.name, paths, self.submit_command(paths), tuple(self.notes(spec, job))
        )

    def write_checked(self, spec: LaunchSpec, folder: Path, job: JobOptions) -> list[Path]:
        backends.check_options(self, job)
        return self.write(spec, folder, job)


def job_file_backends() -> list[JobFileBackend]:
    return [b for b in map(backends.get, backends.names()) if isinstance(b, JobFileBackend)]


def write_job(
    spec: LaunchSpec,
    backend: str,
    out_dir: Path,
    *,
    image: str | None = None,
    partition: str | None = None,
    time_limit: str | None = None,
    min_nodes: int | None = None,
    pvc: str | None = None,
    mount_path: str | None = None,
    cpu: str | None = None,
    memory: str | None = None,
) -> list[Path]:
    """Write the job file for `backend` (and the agent zip Slurm needs) into `out_dir`; return the paths."""
    chosen = {b.name: b for b in job_file_backends()}
    if backend not in chosen:
        raise InputError(
            f"unknown backend {backend!r}.",
            f"Use one of: {', '.join(chosen)} (or no --backend to launch over SSH).",
        )
    job = JobOptions(
        image=image,
        partition=partition,
        time_limit=time_limit,
        min_nodes=min_nodes,
        pvc=pvc,
        mount_path=mount_path,
        cpu=cpu,
        memory=memory,
    )
    return chosen[backend].write_checked(spec, out_dir, job)


def for_cluster(spec: LaunchSpec, default_checkpoint: bool) -> LaunchSpec:
    """The run's paths for a cluster job: relative to where the job starts, not in labctl's host folder.

    A checkpoint folder the user chose stays; labctl's default one is a lab host's path.
    """
    # A cluster's nodes see one checkpoint folder (a shared filesystem, a claim): one writer.
    settings = {
        **spec.settings,
        "metrics_path": f"labctl-runs/{spec.run_id}/metrics.jsonl",
        "shared_checkpoints": True,
    }
    if default_checkpoint:
        settings["checkpoint_dir"] = f"checkpoints/phase{spec.phase}"
    return dataclasses.replace(spec, settings=settings, log_dir="")


def agent_for(spec: LaunchSpec) -> tuple[bytes, str] | None:
    """The agent zip's bytes and file name when the run uses the reference trainer."""
    if spec.script:
        return None
    from labctl.hosts.agent_ship import agent_zip

    data, sha = agent_zip()
    return data, f"labctl-agent-{sha}.pyz"


def uniform(spec: LaunchSpec) -> tuple[int, str]:
    """The per-node process count and device every node of the job gets."""
    if not spec.nodes:
        raise InputError("the run has no nodes.", "Check the phase's hosts in the inventory.")
    bad = [f"{n.host}: {n.nproc}" for n in spec.nodes if n.nproc < 1]
    if bad:
        raise InputError(
            f"nodes without worker processes ({', '.join(bad)}).", "Give every node at least one."
        )
    devices = sorted({n.device for n in spec.nodes})
    if len(devices) > 1:
        listing = ", ".join(f"{n.host}: {n.device}" for n in spec.nodes)
        raise InputError(
            f"the run mixes devices ({listing}); a cluster job runs one kind on every node.",
            "Limit the phase to GPU hosts (or to CPU hosts) before writing a job file.",
        )
    if devices[0] not in ("cuda", "cpu"):
        raise InputError(f"unknown device {devices[0]!r}.", "Use cuda or cpu.")
    if not 0 < spec.port < 65536:
        raise InputError(f"rendezvous port {spec.port} is out of range.", "Use a port in 1..65535.")
    return max(n.nproc for n in spec.nodes), devices[0]


def gpus_per_node(nproc: int, job: JobOptions) -> int:
    """The GPUs each node asks for: --gpus-per-node when the flags describe the cluster, else one per process."""
    return job.gpus_per_node if job.gpus_per_node else nproc


def idle_gpus_note(nproc: int, gpus: int | None) -> list[str]:
    """Said when the phase runs fewer processes per node than the GPUs --gpus-per-node asks for."""
    if not gpus or gpus <= nproc:
        return []
    return [
        f"the phase runs {nproc} process{'es' if nproc != 1 else ''} per node (its strategy), so {gpus - nproc} "
        f"of the {gpus} GPUs each node asks for stay idle; --gpus-per-node {nproc} asks for no more."
    ]


def job_limit_s(spec: LaunchSpec) -> int | None:
    """The scheduler's limit for a time-boxed run (seconds), or None without --time-limit."""
    return spec.time_limit_s + JOB_GRACE_S if spec.time_limit_s else None


def heterogeneity_note(spec: LaunchSpec, nproc: int) -> list[str]:
    counts = {n.nproc for n in spec.nodes}
    if len(counts) == 1:
        return []
    per_host = ", ".join(f"{n.host}: {n.nproc}" for n in spec.nodes)
    return [
        f"# The lab's hosts run different process counts ({per_host}); every node of this job runs {nproc},",
        f"# so the world size is {nproc * spec.nnodes}, not the lab's {spec.world_size}.",
    ]


def portable_env(spec: LaunchSpec, device: str) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """(the portable settings every node agrees on, {key: {host: value}} for those they do not)."""
    keys = sorted({k for n in spec.nodes for k in n.env if k in PORTABLE_ENV})
    env: dict[str, str] = {}
    differing: dict[str, dict[str, str]] = {}
    for key in keys:
        values = {n.host: n.env.get(key, "(unset)") for n in spec.nodes}
        if len(set(values.values())) == 1 and key in spec.nodes[0].env:
            env[key] = spec.nodes[0].env[key]
        else:
            differing[key] = values
    # These come from the run itself, whatever the hosts' environments say.
    env[RUN_ENV] = spec.run_id
    env[LOG_PREFIX_ENV] = LOG_PREFIX_TEMPLATE
    env[DEVICE_ENV] = device
    for key in (RUN_ENV, LOG_PREFIX_ENV, DEVICE_ENV):
        differing.pop(key, None)
    return env, differing


def differing_notes(differing: dict[str, dict[str, str]]) -> list[str]:
    """A header line for each setting left out because the lab's hosts disagree on it."""
    return [f"{key} is not set here: the lab's hosts differ ({per_host(v)})." for key, v in differing.items()]


def per_host(values: dict[str, str]) -> str:
    return ", ".join(f"{host}: {oneline(v)}" for host, v in values.items())


def oneline(text: str) -> str:
    """Text safe inside a one-line comment (a newline would end the comment)."""
    return text.replace("\r", " ").replace("\n", " ")
