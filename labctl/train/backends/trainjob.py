"""`--backend trainjob`: the run as a Kubeflow Trainer v2 TrainJob (and the agent zip as a ConfigMap).

Kubeflow Trainer v2 (`trainer.kubeflow.org/v1alpha1`) replaces the training-operator's
PyTorchJob: a TrainJob names a ClusterTrainingRuntime (`torch-distributed` by default) that
holds the pod template, and fills in only what differs (image, command, env, nodes,
resources). The runtime's torch plugin sets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
PET_MASTER_ADDR and PET_MASTER_PORT, which torchrun reads: a static rendezvous at node 0. Volumes
reach the pods through `runtimePatches`, a strategic merge patch on the runtime's JobSet
template, aimed at its replicated job and container, both named `node` in the upstream runtimes.

Written against Trainer v2.3.0's API (tests/crds/). There is no elastic policy (v2.2 dropped
it), so --min-nodes is refused; a time-boxed run gets `spec.activeDeadlineSeconds`.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from labctl.output.errors import InputError
from labctl.train.backends import Option, jobs, k8s_pod
from labctl.train.backends.k8s import k8s_job_name
from labctl.train.request import JobOptions
from labctl.train.spec import LaunchSpec

API_VERSION = "trainer.kubeflow.org/v1alpha1"
# The replicated job and its container that the runtime's torch plugin treats as the trainer
# (constants.Node in Trainer v2.3.0); a runtime of one's own must use the same names.
NODE = "node"
PATCH_MANAGER = "labctl"  # runtimePatches are keyed by who wrote them
# The torch plugin refuses a TrainJob that sets these itself.
RESERVED_ENV = frozenset(
    {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
)
DEFAULT_RUNTIME = "torch-distributed"


class TrainJobBackend(k8s_pod.KubeJobBackend):
    name = "trainjob"
    kind = "TrainJob"
    options = (
        k8s_pod.IMAGE_OPTION,
        *k8s_pod.POD_OPTIONS,
        Option(
            "runtime",
            str,
            "the ClusterTrainingRuntime the TrainJob runs on",
            DEFAULT_RUNTIME,
            flag_help="trainjob: the ClusterTrainingRuntime to run on (default torch-distributed).",
        ),
        *jobs.CLUSTER_OPTIONS,
    )
    refusals = MappingProxyType(
        {
            "min_nodes": (
                "--min-nodes is an elastic policy, which Kubeflow Trainer v2 does not have (v2.2 dropped it).",
                "Drop --min-nodes, or use --backend k8s (the training-operator's elastic PyTorchJob).",
            )
        }
    )

    def render(self, spec: LaunchSpec, agent_b64: str | None, agent_name: str | None, job: JobOptions) -> str:
        return render_trainjob(spec, agent_b64, agent_name, job)


def render_trainjob(spec: LaunchSpec, agent_b64: str | None, agent_name: str | None, job: JobOptions) -> str:
    """The manifest: the agent's ConfigMap (reference trainer only) and a TrainJob on `job.runtime`."""
    nproc, device = jobs.uniform(spec)
    vol = k8s_pod.checked_volume(job)
    spec = k8s_pod.on_volume(spec, vol)
    image = k8s_pod.check_image(k8s_pod.DEFAULT_IMAGE if job.image is None else job.image)
    runtime = job.runtime or DEFAULT_RUNTIME
    if not k8s_pod.is_dns_subdomain(runtime):
        raise InputError(
            f"--runtime {runtime!r} is not a ClusterTrainingRuntime name.",
            "Use a name `kubectl get clustertrainingruntimes` lists, e.g. --runtime torch-distributed.",
        )
    if device == "cpu" and job.cpu is None:
        # Without a request the pod is BestEffort, the first evicted; a core per process is the least it uses.
        job = job.replace(cpu=str(nproc))
    resources = k8s_pod.resources(device, nproc, job)
    name = k8s_job_name(spec.run_id, spec.nnodes)
    annotations = {"labctl/run-id": spec.run_id, "labctl/phase": str(spec.phase)}
    pod = k8s_pod.pod_parts(spec, device, vol, agent_b64, agent_name, name, annotations)
    # No rendezvous flags: torchrun takes the plugin's PET_* (static rendezvous at node 0) and the
    # plugin's own port; restarts stay torchrun's, each resuming from the claim.
    command = [
        k8s_pod.PYTHON,
        "-m",
        jobs.TORCHRUN,
        f"--nproc-per-node={nproc}",
        f"--max-restarts={spec.max_restarts}",
        "--tee=3",  # the rank prefix (LOG_PREFIX_ENV) is applied to tee'd output only
        *spec.entry_argv(),
    ]
    trainer: dict[str, Any] = {
        "image": image,
        "command": [k8s_pod.escape(arg) for arg in command],
        "env": [e for e in pod.env_list() if e["name"] not in RESERVED_ENV],
        "numNodes": spec.nnodes,
        "numProcPerNode": nproc,
    }
    if resources:
        trainer["resourcesPerNode"] = resources
    pod_patch = {
        "volumes": pod.volumes,
        "containers": [{"name": NODE, "volumeMounts": pod.mounts}],
    }
    body: dict[str, Any] = {"runtimeRef": {"name": runtime}, "trainer": trainer}
    limit = jobs.job_limit_s(spec)
    if limit:
        body["activeDeadlineSeconds"] = limit
    body["runtimePatches"] = [
        {
            "manager": PATCH_MANAGER,
            "trainingRuntimeSpec": {
                "template": {
                    "spec": {
                        "replicatedJobs": [
                            {"name": NODE, "template": {"spec": {"template": {"spec": pod_patch}}}}
                        ]
                    }
                }
            },
        }
    ]
    docs: list[dict[str, Any]] = [pod.configmap] if pod.configmap else []
    docs.append(
        {
            "apiVersion": API_VERSION,
            "kind": "TrainJob",
            "metadata": {"name": name, "annotations": annotations},
            "spec": body,
        }
    )
    header = [
        f"labctl training run {jobs.oneline(spec.run_id)}, phase {spec.phase}, as a Kubeflow Trainer v2 TrainJob.",
        f"Apply with: kubectl apply -f train-phase{spec.phase}.yaml",
        f"Runs on the ClusterTrainingRuntime {runtime} (kubectl get clustertrainingruntimes): its replicated job "
        f"and container named {NODE!r} get the claim; Trainer v2.3's API.",
    ]
    header += k8s_pod.header_notes(spec, vol, resources, image)
    if limit:
        header.append(
            f"Time-boxed: spec.activeDeadlineSeconds {limit} stops the job after the trainer's own pause."
        )
    header.append(
        "Not elastic (Trainer v2 has no elastic policy): every node must be there; use --backend k8s to shrink."
    )
    header += [line.removeprefix("# ") for line in jobs.heterogeneity_note(spec, nproc)]
    header += jobs.differing_notes(pod.differing)
    if device == "cuda":
        header += [n[0].upper() + n[1:] for n in jobs.idle_gpus_note(nproc, job.gpus_per_node)]
    import yaml  # `labctl --help` reads this module's options and must not load yaml

    text = yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True, width=4096)
    return "".join(f"# {line}\n" for line in header) + text
