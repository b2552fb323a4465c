"""The pod pieces every Kubernetes backend shares (`--backend k8s` PyTorchJob, `--backend trainjob`).

A pod's own filesystem goes when the pod goes: a restarted worker would start again at step 0
and workers would never see each other's checkpoints. So a run's checkpoints (and its metrics,
beside them) live on a ReadWriteMany claim mounted in every pod, and a job whose checkpoint
folder is not on that mount is refused rather than written.

What the flags say wins over the phase's `k8s:` section, which wins over the defaults.
"""

from __future__ import annotations

import base64
import dataclasses
import posixpath
import re
import shlex
from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labctl.output.errors import InputError
from labctl.output.files import write_output
from labctl.train.backends import Option, jobs
from labctl.train.request import JobOptions

if TYPE_CHECKING:
    from labctl.train.phases import Settings
    from labctl.train.request import TrainRequest
    from labctl.train.spec import LaunchSpec

DEFAULT_IMAGE = "pytorch/pytorch:latest"  # a placeholder: the manifest's header says to pin it
TORCH_NOTE = jobs.TORCH_NEEDED.format(where="in the image")
PYTHON = "python3"  # on PATH in the pytorch/pytorch and NGC images alike
# A pod's network is its own eth0, not the lab host's bond: the lab's interface names would
# point NCCL and Gloo at interfaces that do not exist in the pod.
NOT_IN_PODS = frozenset({"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"})
AGENT_DIR = "/opt/labctl"  # where the agent ConfigMap appears inside the pod
_OTHER_MOUNTS = ("/dev/shm", AGENT_DIR)
_CONFIGMAP_MAX = 1024 * 1024  # Kubernetes refuses a ConfigMap whose data exceeds 1 MiB
VOLUME_NAME = "checkpoints"
GPU_RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's resource name
# A PVC name is a DNS-1123 subdomain.
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# Kubernetes quantities: "8", "500m", "1.5", "32Gi", "1e3".
_QUANTITY = re.compile(r"[+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+|[numkMGTPE]|[KMGTPE]i)?", re.ASCII)
DEFAULT_MOUNT = "/checkpoints"
IMAGE_OPTION = Option(
    "image",
    str,
    "the container image every pod runs",
    DEFAULT_IMAGE,
    flag_help="Container image for --backend k8s, trainjob or sagemaker.",
)
# What every Kubernetes backend's pods read; the phase's `k8s:` section fills those not given.
POD_OPTIONS = (
    Option(
        "pvc",
        str,
        "the ReadWriteMany claim for checkpoints and metrics (default: k8s.checkpoint_pvc)",
        flag_help="k8s/trainjob: ReadWriteMany PersistentVolumeClaim for checkpoints and metrics "
        "(default: the phase's k8s.checkpoint_pvc; required).",
    ),
    Option(
        "mount_path",
        str,
        "where the claim is mounted in each pod",
        DEFAULT_MOUNT,
        flag_help="k8s/trainjob: where the claim is mounted (default /checkpoints).",
    ),
    Option(
        "cpu",
        str,
        "CPU request per pod, e.g. 8 or 500m",
        flag_help="k8s/trainjob: CPU request per pod, e.g. 8 or 500m.",
    ),
    Option(
        "memory",
        str,
        "memory request per pod, e.g. 32Gi",
        flag_help="k8s/trainjob: memory request per pod, e.g. 32Gi.",
    ),
)


@dataclass(frozen=True)
class CheckpointVolume:
    """The claim that holds a run's checkpoints and metrics, and where pods see it."""

    claim: str
    mount_path: str

    def volume(self) -> dict[str, Any]:
        return {"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": self.claim}}

    def mount(self) -> dict[str, Any]:
        return {"name": VOLUME_NAME, "mountPath": self.mount_path}


def with_phase(job: JobOptions, settings: Settings) -> JobOptions:
    """The job's k8s options: each flag given, else the phase's `k8s:` setting.

    A pod is a node's part of the job, so --cpus-per-node and --memory-per-node are its requests.
    """
    k8s = settings.k8s
    shape = job.cluster()
    cpu = per_pod("--cpu", job.cpu, "--cpus-per-node", shape.cpus_per_node if shape else None)
    memory = per_pod("--memory", job.memory, "--memory-per-node", shape.k8s_memory() if shape else None)
    return job.replace(
        pvc=job.pvc if job.pvc is not None else k8s.checkpoint_pvc,
        mount_path=job.mount_path if job.mount_path is not None else k8s.mount_path,
        cpu=cpu if cpu is not None else k8s.cpu,
        memory=memory if memory is not None else k8s.memory,
        runtime=job.runtime if job.runtime is not None else k8s.runtime,
    )


def per_pod(flag: str, value: str | None, node_flag: str, node_value: int | str | None) -> str | None:
    """A pod's request from the flag that names it or the per-node one; both given is refused."""
    if value is not None and node_value is not None:
        raise InputError(
            f"{flag} and {node_flag} both set each pod's request (a pod is one node's part of the job).",
            f"Give one of them: {node_flag} with the cluster's other flags, or {flag}.",
        )
    return str(node_value) if node_value is not None else value


def checkpoint_volume(job: JobOptions) -> CheckpointVolume:
    """The run's checkpoint claim; refused without one, since a pod's own folder dies with it."""
    if not job.pvc:
        raise InputError(
            "a Kubernetes job needs shared storage for its checkpoints: without it a restarted pod "
            "starts again at step 0 and workers never see each other's checkpoints.",
            "Name a ReadWriteMany PersistentVolumeClaim: --pvc NAME, or `k8s: {checkpoint_pvc: NAME}` "
            "in the phases file (mounted at --mount-path, default /checkpoints).",
        )
    if not is_dns_subdomain(job.pvc):
        raise InputError(
            f"--pvc {job.pvc!r} is not a PersistentVolumeClaim name.",
            "Use the claim's name as `kubectl get pvc` lists it (lower case letters, digits, '-', '.').",
        )
    mount = job.mount_path or DEFAULT_MOUNT
    if not mount.startswith("/") or posixpath.normpath(mount) != mount or mount == "/":
        raise InputError(
            f"--mount-path {mount!r} is not an absolute folder in the pod.",
            "Use e.g. --mount-path /checkpoints.",
        )
    return CheckpointVolume(job.pvc, mount)


def on_volume(spec: LaunchSpec, vol: CheckpointVolume) -> LaunchSpec:
    """The run's checkpoint folder and metrics on the claim; a checkpoint folder elsewhere is refused.

    `spec` comes from `jobs.for_cluster`, whose paths are relative. A phase's own checkpoint_dir is
    absolute (Settings refuses others), so a relative one is labctl's default: it becomes
    `{mount}/phase{N}`, and the metrics `{mount}/labctl-runs/{run}/metrics.jsonl`.
    """
    settings = dict(spec.settings)
    ckpt = str(settings.get("checkpoint_dir") or "")
    default = f"phase{spec.phase}"
    wanted = {
        "checkpoint_dir": ckpt if ckpt.startswith("/") else default,
        "metrics_path": str(settings.get("metrics_path") or f"labctl-runs/{spec.run_id}/metrics.jsonl"),
    }
    for key, path in wanted.items():
        settings[key] = placed_on(vol, key, path, spec.phase)
    return dataclasses.replace(spec, settings=settings)


def placed_on(vol: CheckpointVolume, key: str, path: str, phase: int) -> str:
    """`path` (relative: under the mount) as the pod sees it; refused when it is not on the claim."""
    placed = posixpath.normpath(posixpath.join(vol.mount_path, path))
    if not is_under(placed, vol.mount_path):
        raise InputError(
            f"{key} {path} is not on the checkpoint volume mounted at {vol.mount_path}: "
            "it would vanish with the pod.",
            f"Use a folder under {vol.mount_path} (--set {key}={vol.mount_path}/phase{phase}"
            f"{'/metrics.jsonl' if key == 'metrics_path' else ''}), or mount the claim there with --mount-path.",
        )
    return placed


def resources(device: str, nproc: int, job: JobOptions) -> dict[str, Any]:
    """A pod's resources: GPUs as limits (the device plugin's rule), CPU and memory as asked."""
    requests: dict[str, Any] = {}
    for flag, value in (("cpu", job.cpu), ("memory", job.memory)):
        if value is None:
            continue
        if not _QUANTITY.fullmatch(str(value)):
            raise InputError(
                f"--{flag} {value!r} is not a Kubernetes quantity.",
                "Use e.g. --cpu 8 or --cpu 500m, --memory 32Gi.",
            )
        requests[flag] = str(value)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if device == "cuda":
        out["limits"] = {GPU_RESOURCE: jobs.gpus_per_node(nproc, job)}
    return out


def is_dns_subdomain(name: str) -> bool:
    """Whether `name` can name a Kubernetes object (a claim, a runtime): a DNS-1123 subdomain."""
    return len(name) <= 253 and bool(_DNS1123_SUBDOMAIN.fullmatch(name))


def is_under(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or inside it (both normalised absolute paths)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def checked_volume(job: JobOptions) -> CheckpointVolume:
    """The claim, refused where it would meet the pod's other mounts: the API server refuses two
    mounts at one path, and a claim around or inside them would hide them or be hidden."""
    vol = checkpoint_volume(job)
    for other in _OTHER_MOUNTS:
        if is_under(vol.mount_path, other) or is_under(other, vol.mount_path):
            raise InputError(
                f"--mount-path {vol.mount_path} meets the pod's own mount at {other}.",
                "Mount the claim elsewhere, e.g. --mount-path /checkpoints.",
            )
    return vol


def escape(text: str) -> str:
    """Keep Kubernetes from expanding `$(VAR)` in a command or env value: it reads `$$` as `$`."""
    return text.replace("$", "$$")


@dataclass
class PodParts:
    """What every pod of a run carries, whichever API wraps it."""

    env: dict[str, str]
    differing: dict[str, dict[str, str]]  # settings left out: the lab's hosts disagree on them
    mounts: list[dict[str, Any]]
    volumes: list[dict[str, Any]]
    configmap: dict[str, Any] | None  # the agent zip (reference trainer only)

    def env_list(self) -> list[dict[str, str]]:
        return [{"name": k, "value": escape(v)} for k, v in sorted(self.env.items())]


def pod_parts(
    spec: LaunchSpec,
    device: str,
    vol: CheckpointVolume,
    agent_b64: str | None,
    agent_name: str | None,
    name: str,
    annotations: dict[str, str],
) -> PodParts:
    """The env, mounts and volumes of a run's pods: /dev/shm, the claim, and the agent's ConfigMap."""
    if (agent_b64 is None) != (agent_name is None) or (agent_b64 is None) != bool(spec.script):
        raise ValueError("agent_b64 and agent_name go with the reference trainer, and only with it")
    if agent_b64 is not None and len(agent_b64) > _CONFIGMAP_MAX:
        raise InputError(
            f"the agent zip ({len(agent_b64)} bytes in base64) is over a ConfigMap's 1 MiB.",
            "Bake the agent into the image and run a script instead.",
        )
    env, differing = jobs.portable_env(spec, device)
    env = {k: v for k, v in env.items() if k not in NOT_IN_PODS}
    differing = {k: v for k, v in differing.items() if k not in NOT_IN_PODS}
    # A pod's /dev/shm is 64 MiB; NCCL's intra-node transport and DataLoader workers need more.
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}, vol.mount()]
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, vol.volume()]
    configmap = None
    if agent_b64 is not None and agent_name is not None:
        configmap = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{name}-agent", "annotations": annotations},
            "binaryData": {agent_name: agent_b64},
        }
        env["PYTHONPATH"] = f"{AGENT_DIR}/{agent_name}"
        mounts.append({"name": "labctl-agent", "mountPath": AGENT_DIR, "readOnly": True})
        volumes.append(
            {
                "name": "labctl-agent",
                "configMap": {"name": f"{name}-agent", "items": [{"key": agent_name, "path": agent_name}]},
            }
        )
    return PodParts(env, differing, mounts, volumes, configmap)


def check_image(image: str) -> str:
    if not image.strip() or any(c.isspace() for c in image):
        raise InputError(
            f"image {image!r} is not a container image reference.", "Use e.g. --image repo/name:tag."
        )
    return image


def header_notes(spec: LaunchSpec, vol: CheckpointVolume, resources: dict[str, Any], image: str) -> list[str]:
    """The manifest header's lines on the image, the claim and the resources each pod asks for."""
    lines = []
    if image == DEFAULT_IMAGE:
        lines.append(
            f"image: {image} is a placeholder: pin a tag whose torch matches the lab's, or pass --image."
        )
    lines.append(
        f"Checkpoints and metrics: claim {vol.claim} (ReadWriteMany) at {vol.mount_path} in every pod; "
        + (
            f"your script's checkpoints belong under {vol.mount_path} to survive a pod."
            if spec.script
            else f"checkpoint_dir {spec.settings['checkpoint_dir']}, metrics {spec.settings['metrics_path']}."
        )
    )
    requests = resources.get("requests", {})
    lines.append(
        "Resources per pod: "
        + ", ".join(
            [f"{k} {v}" for k, v in requests.items()]
            + [f"{v} {k}" for k, v in resources.get("limits", {}).items()]
        )
        + ("" if "memory" in requests else "; no memory request (give --memory or k8s: {memory: 32Gi})")
        + "."
    )
    if spec.script:
        lines.append(f"{spec.script} runs from the image: bake it in, or mount it, at that path.")
    else:
        lines.append(TORCH_NOTE[0].upper() + TORCH_NOTE[1:])
    return lines


class KubeJobBackend(jobs.JobFileBackend):
    """A Kubernetes backend: one manifest whose pods keep the run's checkpoints on a claim."""

    kind: str  # what the manifest holds, for the CLI

    def with_phase(self, job: JobOptions, settings: Settings) -> JobOptions:
        return with_phase(job, settings)

    def check_request(self, request: TrainRequest, settings: Settings) -> None:
        super().check_request(request, settings)
        job = self.with_phase(request.job, settings)
        vol = checked_volume(job)
        resources("cpu", 1, job)  # refuses a --cpu or --memory that is no quantity
        if settings.checkpoint_dir != type(settings).model_fields["checkpoint_dir"].default:
            # labctl's default folder moves onto the claim; a folder the phase chose must be on it.
            placed_on(vol, "checkpoint_dir", settings.checkpoint_path(request.phase), request.phase)

    @abstractmethod
    def render(self, spec: LaunchSpec, agent_b64: str | None, agent_name: str | None, job: JobOptions) -> str:
        """The manifest (YAML, one or more documents) for `spec`."""

    def write(self, spec: LaunchSpec, folder: Path, job: JobOptions) -> list[Path]:
        agent = jobs.agent_for(spec)
        manifest = self.render(
            spec, base64.b64encode(agent[0]).decode() if agent else None, agent[1] if agent else None, job
        )
        path = folder / f"train-phase{spec.phase}.yaml"
        write_output(path, manifest)
        return [path]

    def submit_command(self, paths: list[Path]) -> str:
        return f"kubectl apply -f {shlex.quote(str(paths[0]))}"

    def notes(self, spec: LaunchSpec, job: JobOptions) -> list[str]:
        return super().notes(spec, job) + ([] if spec.script else [TORCH_NOTE])
