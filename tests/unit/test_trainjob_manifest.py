"""`--backend trainjob` (train/backends/trainjob.py): every TrainJob labctl writes is one Kubeflow Trainer v2 takes.

Checked against what runs here: the Trainer v2.3.0 TrainJob CRD's openAPIV3Schema with unknown
fields rejected (tests/k8s_schema.py), the CRD's CEL rules and the torch plugin's admission
rules (pkg/runtime/framework/plugins/torch/torch.go at v2.3.0), restated below, and the upstream
`torch-distributed` ClusterTrainingRuntime the job names: its pod template merged with the job's
trainer fields and runtimePatches the way the controller does, then run on this machine.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.output.errors import InputError
from labctl.train.backends import PlannedRun
from labctl.train.backends.k8s_pod import TORCH_NOTE
from labctl.train.backends.trainjob import RESERVED_ENV, TrainJobBackend
from labctl.train.request import JobOptions
from tests import k8s_pod_run, k8s_schema
from tests.conftest import TRAIN_TINY
from tests.unit.test_backend_kaggle import labctl_train
from tests.unit.test_k8s_manifest import (
    PVC,
    configmap_errors,
    free_port,
    nodes_for,
    planned,
    tiny,  # noqa: F401 (a fixture)
    trainer_settings,
    unreachable_lab,  # noqa: F401 (a fixture)
)
from tests.unit.test_k8s_manifest import write as k8s_write
from tests.unit.test_train_backends import node

CRD = "trainer.kubeflow.org_trainjobs.trainer-v2.3.0.yaml"
RUNTIME = Path(__file__).parents[1] / "crds" / "torch_distributed.runtime.trainer-v2.3.0.yaml"
DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
# The CRD's CEL rule on spec.managedBy.
MANAGED_BY = {"trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue"}


def write(run: PlannedRun) -> tuple[list[dict[str, Any]], str, Any]:
    return k8s_write(run, TrainJobBackend())


def trainjob(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [job] = [d for d in docs if d["kind"] == "TrainJob"]
    return job


def runtime_pod(runtime: dict[str, Any], job_name: str) -> dict[str, Any] | None:
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        if rjob["name"] == job_name:
            pod: dict[str, Any] = rjob["template"]["spec"]["template"]["spec"]
            return pod
    return None


def pod_patches(job: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(replicated job name, pod spec patch) for every runtimePatch of the job."""
    out = []
    for patch in job["spec"].get("runtimePatches", []):
        template = patch.get("trainingRuntimeSpec", {}).get("template", {})
        for rjob in template.get("spec", {}).get("replicatedJobs", []):
            out.append((rjob["name"], rjob["template"]["spec"]["template"]["spec"]))
    return out


def rule_errors(job: dict[str, Any], runtime: dict[str, Any]) -> list[str]:
    """What the API server (the CRD's CEL rules) and the Trainer's webhook refuse that the schema lets by."""
    errs = []
    name = job["metadata"].get("name", "")
    # x-kubernetes-validations on the TrainJob root.
    if not DNS1035.fullmatch(name):
        errs.append("metadata.name must match RFC 1035 DNS label format")
    if len(name) > 63:
        errs.append("metadata.name must be no more than 63 characters")
    spec = job["spec"]
    if "managedBy" in spec and spec["managedBy"] not in MANAGED_BY:
        errs.append("ManagedBy must be trainer.kubeflow.org/trainjob-controller or kueue.x-k8s.io/multikueue")
    if spec.get("runtimeRef", {}).get("name") != runtime["metadata"]["name"]:
        errs.append(f"runtimeRef does not name the runtime {runtime['metadata']['name']}")
    # The torch plugin's Validate: no torchrun variable of its own in trainer.env.
    reserved = sorted(e["name"] for e in spec.get("trainer", {}).get("env", []) if e["name"] in RESERVED_ENV)
    if reserved:
        errs.append(f"spec.trainer.env must not have reserved envs: {reserved}")
    # The merge targets must exist in the runtime, or the patch changes nothing there.
    for job_name, pod in pod_patches(job):
        target = runtime_pod(runtime, job_name)
        if target is None:
            errs.append(f"runtimePatches: the runtime has no replicated job {job_name!r}")
            continue
        have = {c["name"] for c in target["containers"]}
        errs += [
            f"runtimePatches: the runtime's {job_name!r} has no container {c['name']!r}"
            for c in pod.get("containers", [])
            if c["name"] not in have
        ]
    # The torch plugin counts the trainer's pods from numNodes and its processes from numProcPerNode.
    trainer = spec.get("trainer", {})
    if trainer.get("numNodes", 1) < 1 or trainer.get("numProcPerNode", 1) < 1:
        errs.append("numNodes and numProcPerNode must be at least 1")
    return errs


def merged_container(
    job: dict[str, Any], runtime: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The trainer container and pod volumes as the controller builds them: the runtime's template,
    the runtimePatches merged in by name (strategic merge), then the job's trainer fields."""
    pod = runtime_pod(runtime, "node")
    assert pod is not None
    [base] = [c for c in pod["containers"] if c["name"] == "node"]
    container = {**base, "env": list(base.get("env", [])), "volumeMounts": list(base.get("volumeMounts", []))}
    volumes = list(pod.get("volumes", []))
    for job_name, patch in pod_patches(job):
        if job_name != "node":
            continue
        volumes = [v for v in volumes if v["name"] not in {p["name"] for p in patch.get("volumes", [])}]
        volumes += patch.get("volumes", [])
        for c in patch.get("containers", []):
            if c["name"] == "node":
                container["volumeMounts"] += c.get("volumeMounts", [])
                container["env"] += c.get("env", [])
    trainer = job["spec"]["trainer"]
    container["image"] = trainer.get("image", container["image"])
    container["command"] = trainer["command"]
    container["env"] += trainer.get("env", [])
    container["resources"] = trainer.get("resourcesPerNode", {})
    return container, volumes


def volume_errors(container: dict[str, Any], volumes: list[dict[str, Any]], claim: str) -> list[str]:
    names = [v["name"] for v in volumes if v.get("persistentVolumeClaim", {}).get("claimName") == claim]
    if len(names) != 1:
        return [f"no single volume names the claim {claim}"]
    mounts = [m["mountPath"] for m in container.get("volumeMounts", []) if m["name"] == names[0]]
    if len(mounts) != 1:
        return ["the claim is not mounted in the trainer container"]
    settings = trainer_settings(container)
    return [
        f"{key} {settings[key]} is not under {mounts[0]}"
        for key in (("checkpoint_dir", "metrics_path") if settings else ())
        if settings and not str(settings[key]).startswith(mounts[0].rstrip("/") + "/")
    ]


@pytest.fixture(scope="module")
def runtime() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(RUNTIME.read_text())
    return doc


@pytest.mark.parametrize("phase", [1, 2, 3, 4])
@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("script", [None, "/workspace/train.py"])
@pytest.mark.parametrize("time_limit_s", [None, 3600])
def test_every_trainjob_passes_the_crd_and_the_trainers_rules(
    tmp_path: Path,
    runtime: dict[str, Any],
    phase: int,
    device: str,
    script: str | None,
    time_limit_s: int | None,
) -> None:
    options = JobOptions(pvc=PVC, image="registry.local/lab/train:2.13.0")
    run = planned(phase, nodes_for(device, 3, 2), options, tmp_path, script=script, time_limit_s=time_limit_s)
    docs, text, result = write(run)
    job = trainjob(docs)
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert k8s_schema.errors(job, CRD, "v1alpha1") == []
    assert rule_errors(job, runtime) == []
    container, volumes = merged_container(job, runtime)
    assert volume_errors(container, volumes, PVC) == []
    maps = [d for d in docs if d["kind"] == "ConfigMap"]
    assert len(maps) == (0 if script else 1)
    for cm in maps:
        assert configmap_errors(cm) == []
        # The agent's ConfigMap is a volume of the trainer's pod, mounted where PYTHONPATH points.
        [vol] = [v for v in volumes if v.get("configMap", {}).get("name") == cm["metadata"]["name"]]
        [mount] = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == vol["name"]]
        [pythonpath] = [e["value"] for e in container["env"] if e["name"] == "PYTHONPATH"]
        assert pythonpath.startswith(mount + "/") and pythonpath.rsplit("/", 1)[1] in cm["binaryData"]
    trainer = job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (3, 2)
    assert trainer["command"][:3] == ["python3", "-m", "torch.distributed.run"]
    # Static rendezvous from the plugin's PET_*: no c10d endpoint of labctl's own.
    assert not any(a.startswith("--rdzv") for a in trainer["command"])
    if device == "cuda":
        assert trainer["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": 2}
    else:
        assert trainer["resourcesPerNode"] == {"requests": {"cpu": "2"}}
    assert ("activeDeadlineSeconds" in job["spec"]) == (time_limit_s is not None)
    if time_limit_s:
        assert job["spec"]["activeDeadlineSeconds"] > time_limit_s
    settings = trainer_settings(container)
    if script is None:
        assert settings is not None
        assert settings["checkpoint_dir"] == f"/checkpoints/phase{phase}"
        assert TORCH_NOTE in result.notes
    header = text.split("\n---", 1)[0]
    assert f"claim {PVC}" in header and "torch-distributed" in header and "Not elastic" in header


def test_the_checks_can_fail(tmp_path: Path, runtime: dict[str, Any]) -> None:
    docs, _, _ = write(planned(2, nodes_for("cuda", 2, 2), JobOptions(pvc=PVC), tmp_path))
    job = trainjob(docs)
    spec = job["spec"]
    # A PyTorchJob habit: the v2 API has no elasticPolicy, and numNodes is an integer.
    spec["elasticPolicy"] = {"minReplicas": 1}
    spec["trainer"]["numNodes"] = "2"
    assert len(k8s_schema.errors(job, CRD, "v1alpha1")) == 2
    del spec["elasticPolicy"]
    spec["trainer"]["numNodes"] = 2
    job["metadata"]["name"] = "Labctl_" + "x" * 60
    spec["trainer"]["env"].append({"name": "PET_NNODES", "value": "2"})
    patch = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    patch["template"]["spec"]["template"]["spec"]["containers"][0]["name"] = "trainer"
    assert rule_errors(job, runtime) == [
        "metadata.name must match RFC 1035 DNS label format",
        "metadata.name must be no more than 63 characters",
        "spec.trainer.env must not have reserved envs: ['PET_NNODES']",
        "runtimePatches: the runtime's 'node' has no container 'trainer'",
    ]
    container, volumes = merged_container(job, runtime)
    assert volume_errors(container, volumes, PVC) == ["the claim is not mounted in the trainer container"]


def test_runtime_and_resources_from_the_phase_and_flags(tmp_path: Path, tiny: Path) -> None:  # noqa: F811
    docs, _, _ = write(planned(1, nodes_for("cpu", 1, 1), JobOptions(), tmp_path / "a", phases=tiny))
    job = trainjob(docs)
    assert job["spec"]["runtimeRef"] == {"name": "torch-distributed"}
    assert job["spec"]["trainer"]["resourcesPerNode"] == {"requests": {"cpu": "4", "memory": "8Gi"}}
    [(_, patch)] = pod_patches(job)
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "from-phase"}} in patch["volumes"]
    flags = JobOptions(pvc="flag-claim", runtime="torch-distributed-cu13")
    docs, _, _ = write(planned(1, nodes_for("cpu", 1, 1), flags, tmp_path / "b", phases=tiny))
    assert trainjob(docs)["spec"]["runtimeRef"] == {"name": "torch-distributed-cu13"}


@pytest.mark.parametrize(
    ("options", "said", "hint"),
    [
        (JobOptions(pvc=PVC, min_nodes=1), "elastic policy", "--backend k8s"),
        (JobOptions(), "shared storage", "--pvc NAME"),
        (
            JobOptions(pvc=PVC, runtime="Torch_Distributed"),
            "is not a ClusterTrainingRuntime name",
            "--runtime",
        ),
        (JobOptions(pvc=PVC, partition="gpu"), "--partition", "--backend slurm"),
    ],
)
def test_what_a_trainjob_cannot_hold_is_refused(
    tmp_path: Path, options: JobOptions, said: str, hint: str
) -> None:
    with pytest.raises(InputError) as e:
        write(planned(2, nodes_for("cpu", 1, 1), options, tmp_path / "out"))
    assert said in e.value.message and hint in e.value.hint
    assert not (tmp_path / "out").exists()


def test_the_cli_refuses_a_trainjob_without_a_claim_before_any_host_is_asked(unreachable_lab: Path) -> None:  # noqa: F811
    import os
    import sys

    argv = ["-i", str(unreachable_lab), "train", "-f", str(unreachable_lab.parent / "phases.yaml"),
            "--phase", "2", "--backend", "trainjob", "-o", str(unreachable_lab.parent / "out")]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", *argv], capture_output=True, text=True, timeout=120,
        cwd=unreachable_lab.parent, env={**os.environ, "COLUMNS": "1000"},
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "--pvc NAME" in output and "Traceback" not in output
    assert not (unreachable_lab.parent / "out").exists()


def test_labctl_train_writes_a_trainjob(tmp_path: Path, tiny: Path, runtime: dict[str, Any]) -> None:  # noqa: F811
    import sys

    inv = tmp_path / "inv.yaml"
    inv.write_text(
        f"lab: t\nhosts:\n  here: {{address: 127.0.0.1, connection: local, python: {sys.executable}, roles: [train]}}\n"
    )
    rc, output = labctl_train(
        inv, "--device", "cpu", "--backend", "trainjob", "--pvc", PVC, "-o", str(tmp_path / "out")
    )
    assert rc == 0, output
    assert "kubectl apply -f" in output and f"Note: {TORCH_NOTE}" in output
    [path] = (tmp_path / "out").glob("*.yaml")
    job = trainjob(list(yaml.safe_load_all(path.read_text())))
    assert k8s_schema.errors(job, CRD, "v1alpha1") == [] and rule_errors(job, runtime) == []


def test_the_pod_command_trains_is_killed_and_resumes_from_the_claim(
    tmp_path: Path,
    tiny: Path,  # noqa: F811
    runtime: dict[str, Any],
) -> None:
    pytest.importorskip("torch")
    volume = tmp_path / "claim"  # the ReadWriteMany claim, as the pod's mount path
    volume.mkdir()
    one_node = (node("n0", 2, "cpu", OMP_NUM_THREADS="1"),)
    run = planned(2, one_node, JobOptions(pvc=PVC, mount_path=str(volume)), tmp_path / "out",
                  phases=tiny, sets=(*TRAIN_TINY[1::2], "steps=40", "checkpoint_every=5"))  # fmt: skip
    docs, _, _ = write(run)
    job = trainjob(docs)
    container, _ = merged_container(job, runtime)
    [cm] = [d for d in docs if d["kind"] == "ConfigMap"]
    [agent_mount] = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == "labctl-agent"]
    config_folder = k8s_pod_run.configmap_folder(cm, tmp_path / "configmap")
    # What the torch plugin sets for a one-node job (torch.go EnforceMLPolicy); the master's
    # headless-service name resolves to the pod itself, here localhost.
    trainer = job["spec"]["trainer"]
    injected = {
        "PET_NNODES": str(trainer["numNodes"]),
        "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
        "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(free_port()),
    }
    metrics = volume / "labctl-runs" / run.spec.run_id / "metrics.jsonl"

    k8s_pod_run.train_kill_resume(container, injected, tmp_path, {agent_mount: config_folder}, metrics, 40)
