"""The pod pieces every Kubernetes backend shares (`--backend k8s` PyTorchJob, `--backend trainjob`).

A pod's own filesystem goes when the pod goes: a restarted worker would start again at step 0
and workers would never see each other's checkpoints. So a run's checkpoints (and its metrics,
beside them) live on a ReadWriteMany claim mounted in every pod, and a job whose checkpoint
folder is not on that mount is refused rather than written.

What the flags say wins over the phase's `k8s:` section, which wins over the defaults.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from labctl.errors import InputError
from labctl.train.request import JobOptions

if TYPE_CHECKING:
    from labctl.train.phases import Settings
    from labctl.train.spec import LaunchSpec

VOLUME_NAME = "checkpoints"
GPU_RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's resource name
# A PVC name is a DNS-1123 subdomain.
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# Kubernetes quantities: "8", "500m", "1.5", "32Gi", "1e3".
_QUANTITY = re.compile(r"[+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+|[numkMGTPE]|[KMGTPE]i)?")


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
    """The job's k8s options: each flag given, else the phase's `k8s:` setting."""
    k8s = settings.k8s
    return dataclasses.replace(
        job,
        pvc=job.pvc if job.pvc is not None else k8s.checkpoint_pvc,
        mount_path=job.mount_path if job.mount_path is not None else k8s.mount_path,
        cpu=job.cpu if job.cpu is not None else k8s.cpu,
        memory=job.memory if job.memory is not None else k8s.memory,
        runtime=job.runtime if job.runtime is not None else k8s.runtime,
    )


def checkpoint_volume(job: JobOptions) -> CheckpointVolume:
    """The run's checkpoint claim; refused without one, since a pod's own folder dies with it."""
    if not job.pvc:
        raise InputError(
            "a Kubernetes job needs shared storage for its checkpoints: without it a restarted pod "
            "starts again at step 0 and workers never see each other's checkpoints.",
            "Name a ReadWriteMany PersistentVolumeClaim: --pvc NAME, or `k8s: {checkpoint_pvc: NAME}` "
            "in the phases file (mounted at --mount-path, default /checkpoints).",
        )
    if len(job.pvc) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(job.pvc):
        raise InputError(
            f"--pvc {job.pvc!r} is not a PersistentVolumeClaim name.",
            "Use the claim's name as `kubectl get pvc` lists it (lower case letters, digits, '-', '.').",
        )
    mount = job.mount_path or "/checkpoints"
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
        out["limits"] = {GPU_RESOURCE: nproc}
    return out


def is_under(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or inside it (both normalised absolute paths)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")
