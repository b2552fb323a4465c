"""`--backend k8s`: the run as a Kubeflow elastic PyTorchJob (and the agent zip as a ConfigMap)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from labctl.output.errors import InputError
from labctl.train.backends import Option, jobs, k8s_pod
from labctl.train.request import JobOptions
from labctl.train.spec import LaunchSpec

DEFAULT_IMAGE = k8s_pod.DEFAULT_IMAGE
TORCH_NOTE = k8s_pod.TORCH_NOTE
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
# Run policy. cleanPodPolicy Running: when the job ends (done, failed, past its deadline) a worker
# still running is deleted so it frees its node, while finished pods stay for `kubectl logs`; the
# checkpoints and metrics are on the claim either way. backoffLimit: pod restarts (the kubelet's,
# OnFailure) get the same budget as torchrun's worker restarts, each resuming from the claim.
CLEAN_POD_POLICY = "Running"
TTL_AFTER_FINISHED_S = 7 * 24 * 3600  # a finished job (and its pods' logs) stays a week


class K8sBackend(k8s_pod.KubeJobBackend):
    name = "k8s"
    kind = "PyTorchJob"
    options = (
        k8s_pod.IMAGE_OPTION,
        Option(
            "min_nodes",
            int,
            "elastic minReplicas: how few workers training goes on with (default: all)",
            flag_help="k8s elastic minReplicas (default: every node).",
            cli_min=1,
        ),
        *k8s_pod.POD_OPTIONS,
        *jobs.CLUSTER_OPTIONS,
    )

    def render(self, spec: LaunchSpec, agent_b64: str | None, agent_name: str | None, job: JobOptions) -> str:
        return render_pytorchjob(spec, agent_b64, agent_name, job)


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
    vol = k8s_pod.checked_volume(job)
    spec = k8s_pod.on_volume(spec, vol)
    image = k8s_pod.check_image(DEFAULT_IMAGE if job.image is None else job.image)
    if device == "cpu" and job.cpu is None:
        # Without a request the pod is BestEffort, the first evicted; a core per process is the least it uses.
        job = job.replace(cpu=str(nproc))
    resources = k8s_pod.resources(device, nproc, job)
    low = spec.nnodes if job.min_nodes is None else job.min_nodes
    if not 1 <= low <= spec.nnodes:
        raise InputError(
            f"min nodes {low} is outside 1..{spec.nnodes}.",
            f"Give a number of nodes the job may shrink to, at most the run's {spec.nnodes}.",
        )
    name = k8s_job_name(spec.run_id, spec.nnodes)
    annotations = {"labctl/run-id": spec.run_id, "labctl/phase": str(spec.phase)}
    pod = k8s_pod.pod_parts(spec, device, vol, agent_b64, agent_name, name, annotations)
    docs: list[dict[str, Any]] = [pod.configmap] if pod.configmap else []
    # The operator puts the rendezvous in the environment (PET_NNODES=min:max, PET_RDZV_ENDPOINT=
    # <name>-worker-0:<pytorchjob-port>, PET_RDZV_BACKEND, PET_RDZV_ID, PET_RDZV_CONF,
    # PET_MAX_RESTARTS) and torchrun reads PET_<FLAG> for any flag not on its command line. It
    # exports spec.nprocPerNode only to jobs with a Master replica, so the count is given here too.
    command = [
        k8s_pod.PYTHON,
        "-m",
        jobs.TORCHRUN,
        f"--nproc-per-node={nproc}",
        "--tee=3",  # the rank prefix (LOG_PREFIX_ENV) is applied to tee'd output only
        *spec.entry_argv(),
    ]
    container: dict[str, Any] = {
        "name": "pytorch",  # the training operator requires this name
        "image": image,
        "command": [k8s_pod.escape(arg) for arg in command],
        "env": pod.env_list(),
        # The operator derives PET_RDZV_ENDPOINT's port from the port of this name.
        "ports": [{"name": "pytorchjob-port", "containerPort": spec.port}],
        "volumeMounts": pod.mounts,
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
                        "template": {"spec": {"containers": [container], "volumes": pod.volumes}},
                    }
                },
            },
        }
    )
    header = [
        f"labctl training run {jobs.oneline(spec.run_id)}, phase {spec.phase}, as a Kubeflow PyTorchJob.",
        f"Apply with: kubectl apply -f train-phase{spec.phase}.yaml",
    ]
    header += k8s_pod.header_notes(spec, vol, resources, image)
    if low < spec.nnodes:
        header.append(f"Elastic: training goes on with as few as {low} of {spec.nnodes} workers.")
    header += [line.removeprefix("# ") for line in jobs.heterogeneity_note(spec, nproc)]
    header += jobs.differing_notes(pod.differing)
    if device == "cuda":
        header += [n[0].upper() + n[1:] for n in jobs.idle_gpus_note(nproc, job.gpus_per_node)]
    import yaml  # `labctl --help` reads this module's options and must not load yaml

    body = yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True, width=4096)
    return "".join(f"# {line}\n" for line in header) + body


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
