"""Write a training run as a Slurm batch script or a Kubeflow PyTorchJob instead of launching it.

`labctl train` launches torchrun over SSH, which suits a handful of lab hosts. When the lab
outgrows that (a scheduler owns the GPUs, hosts come and go), `--backend slurm` and
`--backend k8s` hand the SAME run, the same `LaunchSpec` the SSH launcher and `--dry-run`
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
"""

from __future__ import annotations

import base64
import hashlib
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from labctl.errors import InputError
from labctl.fsutil import write_atomic
from labctl.train.spec import FRESH_STORE_ENV, LOG_PREFIX_TEMPLATE, RUN_ENV, LaunchSpec

BACKENDS = ("slurm", "k8s")
DEFAULT_IMAGE = "pytorch/pytorch:latest"  # a placeholder: the manifest's header says to pin it
LOG_PREFIX_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
DEVICE_ENV = "LABCTL_TRAIN_DEVICE"
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
        *FRESH_STORE_ENV,
    }
)
# A pod's network is its own eth0, not the lab host's bond: the lab's interface names would
# point NCCL and Gloo at interfaces that do not exist in the pod.
_NOT_IN_PODS = frozenset({"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"})
# Slurm confines the job to --cpus-per-task CPUs; with nothing else to go on, give each worker
# process room for its own threads and a DataLoader worker or two.
_CPUS_PER_WORKER = 4
_MOUNT_DIR = "/opt/labctl"  # where the agent ConfigMap appears inside the pod
_CONFIGMAP_MAX = 1024 * 1024  # Kubernetes refuses a ConfigMap whose data exceeds 1 MiB
# fullmatch, not `$`: `$` also matches before a final newline, which would end the #SBATCH line.
_SLURM_TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}|(?i:unlimited|infinite)")
_SLURM_PARTITION = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_TORCHRUN = "torch.distributed.run"
_K8S_PYTHON = "python3"  # on PATH in the pytorch/pytorch and NGC images alike


def write_job(
    spec: LaunchSpec,
    backend: str,
    out_dir: Path,
    *,
    image: str | None = None,
    partition: str | None = None,
    time_limit: str | None = None,
    min_nodes: int | None = None,
) -> list[Path]:
    """Write the job file for `backend` (and the agent zip Slurm needs) into `out_dir`; return the paths."""
    if backend not in BACKENDS:
        raise InputError(
            f"unknown backend {backend!r}.",
            f"Use one of: {', '.join(BACKENDS)} (or no --backend to launch over SSH).",
        )
    agent = _agent(spec)
    if backend == "slurm":
        _only_for("k8s", backend, image=image, min_nodes=min_nodes)
        script = render_sbatch(spec, agent[1] if agent else None, partition=partition, time_limit=time_limit)
        written = [out_dir / f"train-phase{spec.phase}.sbatch"]
        write_atomic(written[0], script, mode=0o755)
        if agent:
            written.append(out_dir / agent[1])
            write_atomic(written[1], agent[0])
        return written
    _only_for("slurm", backend, partition=partition, time_limit=time_limit)
    manifest = render_pytorchjob(
        spec,
        base64.b64encode(agent[0]).decode() if agent else None,
        agent[1] if agent else None,
        DEFAULT_IMAGE if image is None else image,
        min_nodes=min_nodes,
    )
    path = out_dir / f"train-phase{spec.phase}.yaml"
    write_atomic(path, manifest)
    return [path]


def render_sbatch(
    spec: LaunchSpec, agent_name: str | None, *, partition: str | None = None, time_limit: str | None = None
) -> str:
    """The Slurm batch script: one torchrun per allocated node, rendezvous at the first one.

    `agent_name` is the agent zip's file name next to the script (None for a user's script).
    """
    nproc, device = _uniform(spec)
    if partition is not None and not _SLURM_PARTITION.fullmatch(partition):
        raise InputError(
            f"partition {partition!r} is not a Slurm partition name.", "Use e.g. --partition gpu."
        )
    if time_limit is not None and not _SLURM_TIME.fullmatch(time_limit):
        raise InputError(
            f"time limit {time_limit!r} is not in a form Slurm reads.",
            "Use minutes, HH:MM:SS or D-HH:MM:SS, e.g. --time 2-00:00:00.",
        )
    name = "labctl-" + re.sub(r"[^A-Za-z0-9._-]", "-", spec.run_id)
    env, differing = _portable_env(spec, device)

    lines = [
        "#!/bin/bash",
        f"# labctl training run {_oneline(spec.run_id)}, phase {spec.phase}, as a Slurm batch job.",
        f"# Submit from this folder: sbatch train-phase{spec.phase}.sbatch",
    ]
    if agent_name:
        lines.append(f"# ({agent_name} must stay next to this script, on a filesystem every node sees.)")
    lines += ["# Options given to sbatch on its command line override the #SBATCH lines below."]
    lines += _heterogeneity_note(spec, nproc)
    lines += [
        f"# {key} is not set here: the lab's hosts differ ({_per_host(v)})." for key, v in differing.items()
    ]
    lines += [
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={spec.nnodes}",
        "#SBATCH --ntasks-per-node=1",  # one torchrun per node; it forks the workers itself
    ]
    if device == "cuda":
        lines.append(f"#SBATCH --gpus-per-node={nproc}")
    lines += [
        f"#SBATCH --cpus-per-task={nproc * _cpus_per_worker(env)}",
        f"#SBATCH --output={name}-%j.out",
    ]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if time_limit:
        lines.append(f"#SBATCH --time={time_limit}")
    lines += [
        "set -euo pipefail",
        ': "${SLURM_JOB_ID:?submit this script with sbatch}"',
        'PYTHON="${PYTHON:-python3}"  # the interpreter with torch on the nodes; override from the environment',
        "",
    ]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in sorted(env.items())]
    if agent_name:
        lines += [
            f'agent="$SLURM_SUBMIT_DIR"/{shlex.quote(agent_name)}',
            'if [ ! -f "$agent" ]; then',
            '    echo "labctl: $agent not found: submit from the folder that holds it and this script" >&2',
            "    exit 2",
            "fi",
            'export PYTHONPATH="$agent${PYTHONPATH:+:$PYTHONPATH}"',
        ]
    lines += [
        "",
        # Read the whole list rather than `| head -n1`: head exiting early can SIGPIPE scontrol on
        # a long node list, and pipefail would then end the job.
        'nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        "head_node=${nodes%%$'\\n'*}",
        "",
    ]
    command = [
        # --kill-on-bad-exit: once one node's torchrun gives up, the others would otherwise sit
        # in rendezvous until join_timeout.
        f'srun --kill-on-bad-exit=1 "$PYTHON" -m {_TORCHRUN}',
        '--nnodes="$SLURM_NNODES"',
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f'--rdzv-endpoint="$head_node":{spec.port}',
        # The job id, not the run id: a resubmitted job must not join the last one's rendezvous.
        '--rdzv-id="$SLURM_JOB_ID"',
        f"--rdzv-conf=join_timeout={spec.rdzv_timeout}",
        f"--max-restarts={spec.max_restarts}",
        "--tee=3",  # the rank prefix (LOG_PREFIX_ENV) is applied to tee'd output only
        shlex.join(spec.entry_argv()),
    ]
    lines.append(" \\\n    ".join(command))
    return "\n".join(lines) + "\n"


def render_pytorchjob(
    spec: LaunchSpec,
    agent_b64: str | None,
    agent_name: str | None,
    image: str,
    *,
    min_nodes: int | None = None,
) -> str:
    """The Kubeflow manifest: the agent's ConfigMap (reference trainer only) and an elastic PyTorchJob.

    `agent_b64` is the agent zip in base64 and `agent_name` its file name (both None for a
    user's script). `min_nodes` (default: all of them) is how far the job may shrink.
    """
    nproc, device = _uniform(spec)
    if (agent_b64 is None) != (agent_name is None) or (agent_b64 is None) != bool(spec.script):
        raise ValueError("agent_b64 and agent_name go with the reference trainer, and only with it")
    if not image.strip() or any(c.isspace() for c in image):
        raise InputError(
            f"image {image!r} is not a container image reference.", "Use e.g. --image repo/name:tag."
        )
    low = spec.nnodes if min_nodes is None else min_nodes
    if not 1 <= low <= spec.nnodes:
        raise InputError(
            f"min nodes {low} is outside 1..{spec.nnodes}.",
            f"Give a number of nodes the job may shrink to, at most the run's {spec.nnodes}.",
        )
    if agent_b64 is not None and len(agent_b64) > _CONFIGMAP_MAX:
        raise InputError(
            f"the agent zip ({len(agent_b64)} bytes in base64) is over a ConfigMap's 1 MiB.",
            "Bake the agent into the image and run a script instead.",
        )
    name = k8s_job_name(spec.run_id, spec.nnodes)
    annotations = {"labctl/run-id": spec.run_id, "labctl/phase": str(spec.phase)}
    env, differing = _portable_env(spec, device)
    env = {k: v for k, v in env.items() if k not in _NOT_IN_PODS}
    differing = {k: v for k, v in differing.items() if k not in _NOT_IN_PODS}
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    # A pod's /dev/shm is 64 MiB; NCCL's intra-node transport and DataLoader workers need more.
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    docs: list[dict[str, Any]] = []
    if agent_b64 is not None and agent_name is not None:
        configmap = f"{name}-agent"
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": configmap, "annotations": annotations},
                "binaryData": {agent_name: agent_b64},
            }
        )
        env["PYTHONPATH"] = f"{_MOUNT_DIR}/{agent_name}"
        mounts.append({"name": "labctl-agent", "mountPath": _MOUNT_DIR, "readOnly": True})
        volumes.append(
            {
                "name": "labctl-agent",
                "configMap": {"name": configmap, "items": [{"key": agent_name, "path": agent_name}]},
            }
        )
    # The operator puts the rendezvous in the environment (PET_NNODES=min:max, PET_RDZV_ENDPOINT=
    # <name>-worker-0:<pytorchjob-port>, PET_RDZV_BACKEND, PET_RDZV_ID, PET_RDZV_CONF,
    # PET_MAX_RESTARTS) and torchrun reads PET_<FLAG> for any flag not on its command line. It
    # exports spec.nprocPerNode only to jobs with a Master replica, so the count is given here too.
    command = [
        _K8S_PYTHON,
        "-m",
        _TORCHRUN,
        f"--nproc-per-node={nproc}",
        "--tee=3",  # the rank prefix (LOG_PREFIX_ENV) is applied to tee'd output only
        *spec.entry_argv(),
    ]
    container: dict[str, Any] = {
        "name": "pytorch",  # the training operator requires this name
        "image": image,
        "command": [_k8s_escape(arg) for arg in command],
        "env": [{"name": k, "value": _k8s_escape(v)} for k, v in sorted(env.items())],
        # The operator derives PET_RDZV_ENDPOINT's port from the port of this name.
        "ports": [{"name": "pytorchjob-port", "containerPort": spec.port}],
        "volumeMounts": mounts,
    }
    if device == "cuda":
        container["resources"] = {"limits": {"nvidia.com/gpu": nproc}}
    docs.append(
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                # Field names are the training-operator v1 API's (pytorch_types.go): rdzvConf, not
                # rdzvConfigs, which the API server would silently drop.
                "elasticPolicy": {
                    "rdzvBackend": "c10d",
                    "minReplicas": low,
                    "maxReplicas": spec.nnodes,
                    "maxRestarts": spec.max_restarts,
                    "rdzvId": spec.run_id,
                    "rdzvConf": [{"key": "join_timeout", "value": str(spec.rdzv_timeout)}],
                },
                "nprocPerNode": str(nproc),  # a string in the v1 API ("auto", "gpu" or a number)
                "pytorchReplicaSpecs": {
                    "Worker": {
                        "replicas": spec.nnodes,
                        "restartPolicy": "OnFailure",
                        "template": {"spec": {"containers": [container], "volumes": volumes}},
                    }
                },
            },
        }
    )
    header = [
        f"labctl training run {_oneline(spec.run_id)}, phase {spec.phase}, as a Kubeflow PyTorchJob.",
        f"Apply with: kubectl apply -f train-phase{spec.phase}.yaml",
    ]
    if image == DEFAULT_IMAGE:
        header.append(
            f"image: {image} is a placeholder: pin a tag whose torch matches the lab's, or pass --image."
        )
    if spec.script:
        header.append(f"{spec.script} runs from the image: bake it in, or mount it, at that path.")
    if low < spec.nnodes:
        header.append(f"Elastic: training goes on with as few as {low} of {spec.nnodes} workers.")
    header += [line.removeprefix("# ") for line in _heterogeneity_note(spec, nproc)]
    header += [
        f"{key} is not set here: the lab's hosts differ ({_per_host(v)})." for key, v in differing.items()
    ]
    body = yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True, width=4096)
    return "".join(f"# {line}\n" for line in header) + body


def k8s_job_name(run_id: str, nnodes: int) -> str:
    """A PyTorchJob name from the run id: a DNS-1035 label short enough for its pods' services.

    The operator names each worker's Service `<name>-worker-<i>`, and a Service name must be a
    DNS-1035 label of at most 63 characters; the job name itself must be one as well.
    """
    lowered = run_id.lower()
    base = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", lowered)).strip("-")
    name = f"labctl-{base}" if base else "labctl"
    budget = 63 - len(f"-worker-{max(nnodes - 1, 0)}")
    if base != lowered or len(name) > budget:
        # Sanitising or cutting could make two runs' names meet; the hash keeps them apart.
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
        name = f"{name[: budget - len(digest) - 1].rstrip('-')}-{digest}"
    assert _DNS1035_LABEL.fullmatch(name), name
    return name


def _agent(spec: LaunchSpec) -> tuple[bytes, str] | None:
    """The agent zip's bytes and file name when the run uses the reference trainer."""
    if spec.script:
        return None
    from labctl.agent_ship import agent_zip

    data, sha = agent_zip()
    return data, f"labctl-agent-{sha}.pyz"


def _only_for(other: str, backend: str, **options: object) -> None:
    given = [k.replace("_", "-") for k, v in options.items() if v is not None]
    if given:
        raise InputError(
            f"--{', --'.join(given)} applies to --backend {other}, not {backend}.",
            f"Drop it, or use --backend {other}.",
        )


def _uniform(spec: LaunchSpec) -> tuple[int, str]:
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


def _heterogeneity_note(spec: LaunchSpec, nproc: int) -> list[str]:
    counts = {n.nproc for n in spec.nodes}
    if len(counts) == 1:
        return []
    per_host = ", ".join(f"{n.host}: {n.nproc}" for n in spec.nodes)
    return [
        f"# The lab's hosts run different process counts ({per_host}); every node of this job runs {nproc},",
        f"# so the world size is {nproc * spec.nnodes}, not the lab's {spec.world_size}.",
    ]


def _portable_env(spec: LaunchSpec, device: str) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
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


def _cpus_per_worker(env: dict[str, str]) -> int:
    threads = env.get("OMP_NUM_THREADS", "")
    return int(threads) if threads.isdigit() and int(threads) > 0 else _CPUS_PER_WORKER


def _per_host(values: dict[str, str]) -> str:
    return ", ".join(f"{host}: {_oneline(v)}" for host, v in values.items())


def _oneline(text: str) -> str:
    """Text safe inside a one-line comment (a newline would end the comment)."""
    return text.replace("\r", " ").replace("\n", " ")


def _k8s_escape(text: str) -> str:
    """Keep Kubernetes from expanding `$(VAR)` in a command or env value: it reads `$$` as `$`."""
    return text.replace("$", "$$")
