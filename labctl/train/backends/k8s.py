"""`--backend k8s`: the run as a Kubeflow elastic PyTorchJob (and the agent zip as a ConfigMap)."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from labctl.errors import InputError
from labctl.fsutil import write_atomic
from labctl.train.backends import jobs, k8s_pod
from labctl.train.request import JobOptions
from labctl.train.spec import LaunchSpec

if TYPE_CHECKING:
    from labctl.train.phases import Settings
    from labctl.train.request import TrainRequest

DEFAULT_IMAGE = "pytorch/pytorch:latest"  # a placeholder: the manifest's header says to pin it
# A pod's network is its own eth0, not the lab host's bond: the lab's interface names would
# point NCCL and Gloo at interfaces that do not exist in the pod.
_NOT_IN_PODS = frozenset({"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"})
_MOUNT_DIR = "/opt/labctl"  # where the agent ConfigMap appears inside the pod
_OTHER_MOUNTS = ("/dev/shm", _MOUNT_DIR)
_CONFIGMAP_MAX = 1024 * 1024  # Kubernetes refuses a ConfigMap whose data exceeds 1 MiB
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_K8S_PYTHON = "python3"  # on PATH in the pytorch/pytorch and NGC images alike
# What the image's torch must be: the reference trainer uses torch.amp.GradScaler("cuda"), which
# torch 2.3 introduced; labctl pins and tests 2.13.0 (pyproject), and only that was tried.
TORCH_NOTE = "the reference trainer needs torch >= 2.3 in the image (tried with torch 2.13.0, labctl's pin)."
# Run policy. cleanPodPolicy Running: when the job ends (done, failed, past its deadline) a worker
# still running is deleted so it frees its node, while finished pods stay for `kubectl logs`; the
# checkpoints and metrics are on the claim either way. backoffLimit: pod restarts (the kubelet's,
# OnFailure) get the same budget as torchrun's worker restarts, each resuming from the claim.
CLEAN_POD_POLICY = "Running"
TTL_AFTER_FINISHED_S = 7 * 24 * 3600  # a finished job (and its pods' logs) stays a week


class K8sBackend(jobs.JobFileBackend):
    name = "k8s"
    options = ("image", "min_nodes", "pvc", "mount_path", "cpu", "memory")

    def with_phase(self, job: JobOptions, settings: Settings) -> JobOptions:
        return k8s_pod.with_phase(job, settings)

    def check_request(self, request: TrainRequest, settings: Settings) -> None:
        super().check_request(request, settings)
        job = self.with_phase(request.job, settings)
        vol = _checkpoint_volume(job)
        k8s_pod.resources("cpu", 1, job)  # refuses a --cpu or --memory that is no quantity
        if settings.checkpoint_dir != type(settings).model_fields["checkpoint_dir"].default:
            # labctl's default folder moves onto the claim; a folder the phase chose must be on it.
            path = settings.checkpoint_path(request.phase)
            k8s_pod.placed_on(vol, "checkpoint_dir", path, request.phase)

    def write(self, spec: LaunchSpec, folder: Path, job: JobOptions) -> list[Path]:
        agent = jobs.agent_for(spec)
        manifest = render_pytorchjob(
            spec,
            base64.b64encode(agent[0]).decode() if agent else None,
            agent[1] if agent else None,
            job,
        )
        path = folder / f"train-phase{spec.phase}.yaml"
        write_atomic(path, manifest)
        return [path]

    def submit_command(self, paths: list[Path]) -> str:
        return f"kubectl apply -f {shlex.quote(str(paths[0]))}"

    def notes(self, spec: LaunchSpec, job: JobOptions) -> list[str]:
        return [] if spec.script else [TORCH_NOTE]


def render_pytorchjob(
    spec: LaunchSpec,
    agent_b64: str | None,
    agent_name: str | None,
    job: JobOptions,
) -> str:
    """The Kubeflow manifest: the agent's ConfigMap (reference trainer only) and an elastic PyTorchJob.

    `agent_b64` is the agent zip in base64 and `agent_name` its file name (both None for a
    user's script). `job` gives the image, the checkpoint claim (required), the CPU and memory
    requests and `min_nodes` (default: all of them), how far the job may shrink.
    """
    nproc, device = jobs.uniform(spec)
    vol = _checkpoint_volume(job)
    spec = k8s_pod.on_volume(spec, vol)
    image = DEFAULT_IMAGE if job.image is None else job.image
    min_nodes = job.min_nodes
    if device == "cpu" and job.cpu is None:
        # Without a request the pod is BestEffort, the first evicted; a core per process is the least it uses.
        job = dataclasses.replace(job, cpu=str(nproc))
    resources = k8s_pod.resources(device, nproc, job)
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
    env, differing = jobs.portable_env(spec, device)
    env = {k: v for k, v in env.items() if k not in _NOT_IN_PODS}
    differing = {k: v for k, v in differing.items() if k not in _NOT_IN_PODS}
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}, vol.mount()]
    # A pod's /dev/shm is 64 MiB; NCCL's intra-node transport and DataLoader workers need more.
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, vol.volume()]
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
        jobs.TORCHRUN,
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
    if resources:
        container["resources"] = resources
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
                "runPolicy": _run_policy(spec),
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
        f"labctl training run {jobs.oneline(spec.run_id)}, phase {spec.phase}, as a Kubeflow PyTorchJob.",
        f"Apply with: kubectl apply -f train-phase{spec.phase}.yaml",
    ]
    if image == DEFAULT_IMAGE:
        header.append(
            f"image: {image} is a placeholder: pin a tag whose torch matches the lab's, or pass --image."
        )
    header.append(
        f"Checkpoints and metrics: claim {vol.claim} (ReadWriteMany) at {vol.mount_path} in every worker; "
        + (
            f"your script's checkpoints belong under {vol.mount_path} to survive a pod."
            if spec.script
            else f"checkpoint_dir {spec.settings['checkpoint_dir']}, metrics {spec.settings['metrics_path']}."
        )
    )
    requests = resources.get("requests", {})
    header.append(
        "Resources per worker: "
        + ", ".join(
            [f"{k} {v}" for k, v in requests.items()]
            + [f"{v} {k}" for k, v in resources.get("limits", {}).items()]
        )
        + ("" if "memory" in requests else "; no memory request (give --memory or k8s: {memory: 32Gi})")
        + "."
    )
    if spec.script:
        header.append(f"{spec.script} runs from the image: bake it in, or mount it, at that path.")
    else:
        header.append(TORCH_NOTE[0].upper() + TORCH_NOTE[1:])
    if low < spec.nnodes:
        header.append(f"Elastic: training goes on with as few as {low} of {spec.nnodes} workers.")
    header += [line.removeprefix("# ") for line in jobs.heterogeneity_note(spec, nproc)]
    header += jobs.differing_notes(differing)
    body = yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True, width=4096)
    return "".join(f"# {line}\n" for line in header) + body


def _checkpoint_volume(job: JobOptions) -> k8s_pod.CheckpointVolume:
    """The claim, refused where it would meet the pod's other mounts: the API server refuses two
    mounts at one path, and a claim around or inside them would hide them or be hidden."""
    vol = k8s_pod.checkpoint_volume(job)
    for other in _OTHER_MOUNTS:
        if k8s_pod.is_under(vol.mount_path, other) or k8s_pod.is_under(other, vol.mount_path):
            raise InputError(
                f"--mount-path {vol.mount_path} meets the pod's own mount at {other}.",
                "Mount the claim elsewhere, e.g. --mount-path /checkpoints.",
            )
    return vol


def _run_policy(spec: LaunchSpec) -> dict[str, Any]:
    """The v1 API's runPolicy; a time-boxed run's deadline (activeDeadlineSeconds) is a backstop
    behind the trainer's own pause, and absent without --time-limit."""
    policy: dict[str, Any] = {
        "cleanPodPolicy": CLEAN_POD_POLICY,
        "backoffLimit": spec.max_restarts,
        "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
    }
    limit = jobs.job_limit_s(spec)
    if limit:
        policy["activeDeadlineSeconds"] = limit
    return policy


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


def _k8s_escape(text: str) -> str:
    """Keep Kubernetes from expanding `$(VAR)` in a command or env value: it reads `$$` as `$`."""
    return text.replace("$", "$$")
