"""`--backend k8s` (train/backends/k8s.py): every PyTorchJob labctl writes is one the cluster takes.

Checked against the real consumers that run here: the training-operator v1.9.0 CRD's
openAPIV3Schema with unknown fields rejected (tests/k8s_schema.py), the operator's own
admission rules (pkg/webhooks/pytorch/pytorchjob_webhook.go and pkg/common/util/webhooks.go at
v1.9.0, restated below), and the checkpoint claim mounted where the trainer writes. The pod's
own command then trains on this machine, is killed, and resumes from the shared folder.
"""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from labctl.output.progress import QUIET
from labctl.train import backends
from labctl.train.backends import PlannedRun
from labctl.train.backends.k8s import CLEAN_POD_POLICY, TORCH_NOTE, K8sBackend
from labctl.train.phases import load_phases
from labctl.train.request import JobOptions, TrainRequest
from labctl.train.spec import LaunchSpec, NodeSpec
from tests import k8s_pod_run, k8s_schema
from tests.conftest import TRAIN_TINY
from tests.unit.test_backend_kaggle import INVENTORY, labctl_train
from tests.unit.test_train_backends import node, operator_env

CRD = "kubeflow.org_pytorchjobs.training-operator-v1.9.0.yaml"
PACKAGED = Path(__file__).parents[2] / "playbooks" / "train.yaml"
PVC = "cet-ckpt"
DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
CONFIGMAP_KEY = re.compile(r"[-._a-zA-Z0-9]+")
# pkg/common/util/webhooks.go: the controllers runPolicy.managedBy may name.
MANAGED_BY = {"kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue"}


def planned(
    phase: int,
    nodes: tuple[NodeSpec, ...],
    job: JobOptions,
    out: Path,
    *,
    phases: Path = PACKAGED,
    script: str | None = None,
    time_limit_s: int | None = None,
    sets: tuple[str, ...] = (),
) -> PlannedRun:
    """The run `labctl train --backend k8s` hands the backend after preflight, from a phases file."""
    settings = load_phases(phases).settings(phase, list(sets))
    run_id = f"p{phase}-20260101-000000-ab12"
    spec = LaunchSpec(
        run_id=run_id,
        phase=phase,
        dist_backend="nccl" if nodes[0].device == "cuda" else "gloo",
        nodes=nodes,
        head_address=nodes[0].address,
        port=settings.port,
        max_restarts=settings.max_restarts,
        settings=settings.trainer_settings(phase, run_id, "/var/lib/labctl/runs/metrics.jsonl", time_limit_s),
        script=script,
        log_dir="/var/log/labctl/run",
        time_limit_s=time_limit_s,
    )
    # The limit travels in the spec only: a backend reading the request's would find none.
    request = TrainRequest(phase=phase, backend="k8s", output=out, job=job)
    return PlannedRun(request, settings, spec, [], None, out / "runs")


def write(run: PlannedRun, backend: Any = None) -> tuple[list[dict[str, Any]], str, Any]:
    """The documents of the manifest the backend (default: k8s) writes for `run`, its text and the result."""
    backend = backend or K8sBackend()
    # What train/run.py does before preflight.
    backends.check_options(backend, run.request.job)
    backend.check_request(run.request, run.settings)
    result = backend.submit(cast(Any, None), run, QUIET)
    [path] = result.files
    text = path.read_text()
    return list(yaml.safe_load_all(text)), text, result


def pytorchjob(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [job] = [d for d in docs if d["kind"] == "PyTorchJob"]
    return job


def webhook_errors(job: dict[str, Any]) -> list[str]:
    """The training operator v1.9.0's admission rules for a PyTorchJob (validatePyTorchJob)."""
    errs = []
    name = job["metadata"].get("name", "")
    if len(name) > 63 or not DNS1035.fullmatch(name):
        errs.append(f"metadata.name {name!r} is not a DNS-1035 label")
    spec = job["spec"]
    managed = spec.get("runPolicy", {}).get("managedBy")
    if managed is not None and managed not in MANAGED_BY:
        errs.append(f"runPolicy.managedBy {managed!r} is not supported")
    replicas = spec.get("pytorchReplicaSpecs")
    if not replicas:
        return [*errs, "pytorchReplicaSpecs must be given"]
    policy = spec.get("elasticPolicy")
    if policy is not None:
        if "Worker" not in replicas:
            errs.append("Worker must be configured if elastic policy is used")
        if "nProcPerNode" in policy and "nprocPerNode" in spec:
            errs.append("elasticPolicy.nProcPerNode must not be used with nprocPerNode")
        # The operator passes PET_NNODES=min:max to torchrun, which refuses min > max.
        low, high = policy.get("minReplicas"), policy.get("maxReplicas")
        if low is not None and high is not None and not 1 <= low <= high:
            errs.append(f"elasticPolicy minReplicas {low} > maxReplicas {high}")
    for role, rspec in replicas.items():
        if role not in ("Master", "Worker"):
            errs.append(f"replica type {role} is not supported")
        containers = rspec.get("template", {}).get("spec", {}).get("containers", [])
        if not containers:
            errs.append(f"{role}: containers must be specified")
        errs += [
            f"{role}: container {i} has no image" for i, c in enumerate(containers) if not c.get("image")
        ]
        if not any(c.get("name") == "pytorch" for c in containers):
            errs.append(f"{role}: must have at least one container with name pytorch")
        count = rspec.get("replicas")
        if role == "Master" and count != 1:
            errs.append("Master replicas must be 1")
        elif count is not None and count < 1:
            errs.append(f"{role} replicas must be at least 1")
    return errs


def trainer_settings(c: dict[str, Any]) -> dict[str, Any] | None:
    command = c["command"]
    if "--settings" not in command:
        return None
    settings: dict[str, Any] = json.loads(
        k8s_pod_run.k8s_expand(command[command.index("--settings") + 1], {})
    )
    return settings


def volume_errors(job: dict[str, Any], claim: str) -> list[str]:
    """The checkpoint claim is a volume of every pod, mounted in every container, and the trainer's
    checkpoint_dir and metrics_path are on that mount."""
    errs = []
    for role, rspec in job["spec"]["pytorchReplicaSpecs"].items():
        pod = rspec["template"]["spec"]
        names = [
            v["name"]
            for v in pod.get("volumes", [])
            if v.get("persistentVolumeClaim", {}).get("claimName") == claim
        ]
        if len(names) != 1:
            errs.append(f"{role}: no single volume names the claim {claim}")
            continue
        for c in pod["containers"]:
            mounts = [m["mountPath"] for m in c.get("volumeMounts", []) if m["name"] == names[0]]
            if len(mounts) != 1:
                errs.append(f"{role}/{c['name']}: the claim is not mounted")
                continue
            settings = trainer_settings(c)
            for key in ("checkpoint_dir", "metrics_path") if settings else ():
                path = str(settings[key]) if settings else ""
                if not path.startswith(mounts[0].rstrip("/") + "/"):
                    errs.append(f"{role}/{c['name']}: {key} {path} is not under {mounts[0]}")
    return errs


def configmap_errors(cm: dict[str, Any]) -> list[str]:
    """A v1 ConfigMap as the API server takes it (core/v1 types, ValidateConfigMap)."""
    errs = []
    allowed = {"apiVersion", "kind", "metadata", "data", "binaryData", "immutable"}
    errs += [f"unknown field {k}" for k in cm if k not in allowed]
    if (cm.get("apiVersion"), cm.get("kind")) != ("v1", "ConfigMap"):
        errs.append("not a v1 ConfigMap")
    name = cm.get("metadata", {}).get("name", "")
    if len(name) > 253 or not DNS1123_SUBDOMAIN.fullmatch(name):
        errs.append(f"name {name!r} is not a DNS-1123 subdomain")
    size = 0
    for field in ("data", "binaryData"):
        for key, value in cm.get(field, {}).items():
            if len(key) > 253 or not CONFIGMAP_KEY.fullmatch(key):
                errs.append(f"{field} key {key!r} is not a valid key")
            if field == "binaryData":
                try:
                    size += len(base64.b64decode(value, validate=True))
                except ValueError:
                    errs.append(f"binaryData {key!r} is not base64")
            else:
                size += len(value)
    if size > 1024 * 1024:
        errs.append(f"{size} bytes is over a ConfigMap's 1 MiB")
    return errs


def nodes_for(device: str, count: int, nproc: int) -> tuple[NodeSpec, ...]:
    return tuple(node(f"n{i}", nproc, device) for i in range(count))


# --- every manifest passes the CRD and the operator's rules -----------------------------------


@pytest.mark.parametrize("phase", [1, 2, 3, 4])
@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("script", [None, "/workspace/train.py"])
@pytest.mark.parametrize(("time_limit_s", "min_nodes"), [(None, None), (3600, 1)])
def test_every_pytorchjob_passes_the_crd_and_the_operators_rules(
    tmp_path: Path,
    phase: int,
    device: str,
    script: str | None,
    time_limit_s: int | None,
    min_nodes: int | None,
) -> None:
    job_options = JobOptions(pvc=PVC, min_nodes=min_nodes, image="registry.local/lab/train:2.13.0")
    run = planned(
        phase, nodes_for(device, 2, 2), job_options, tmp_path, script=script, time_limit_s=time_limit_s
    )
    docs, text, result = write(run)
    job = pytorchjob(docs)
    assert k8s_schema.errors(job, CRD, "v1") == []
    assert webhook_errors(job) == []
    assert sorted(volume_errors(job, PVC)) == []
    maps = [d for d in docs if d["kind"] == "ConfigMap"]
    assert len(maps) == (0 if script else 1)
    for cm in maps:
        assert configmap_errors(cm) == []
    policy = job["spec"]["runPolicy"]
    # The CRD leaves cleanPodPolicy a free string; the v1 API's values are common_types.go's.
    assert policy["cleanPodPolicy"] == CLEAN_POD_POLICY in ("All", "Running", "None")
    assert policy["backoffLimit"] == run.settings.max_restarts
    assert policy["ttlSecondsAfterFinished"] > 0
    assert ("activeDeadlineSeconds" in policy) == (time_limit_s is not None)
    [c] = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    if device == "cuda":
        assert c["resources"]["limits"] == {"nvidia.com/gpu": 2}
    else:
        assert "limits" not in c["resources"]
        assert c["resources"]["requests"]["cpu"] == "2"  # a core per process unless --cpu says
    settings = trainer_settings(c)
    if script is None:
        assert settings is not None
        assert settings["checkpoint_dir"] == f"/checkpoints/phase{phase}"
        assert settings["metrics_path"] == f"/checkpoints/labctl-runs/{run.spec.run_id}/metrics.jsonl"
        assert TORCH_NOTE in result.notes and "torch >= 2.3" in text.split("\n---", 1)[0]
    header = text.split("\n---", 1)[0]
    assert f"claim {PVC}" in header and "/checkpoints" in header


def test_the_checks_can_fail(tmp_path: Path) -> None:
    docs, _, _ = write(planned(2, nodes_for("cuda", 2, 2), JobOptions(pvc=PVC), tmp_path))
    job = pytorchjob(docs)
    spec = job["spec"]
    # A field name the v1 API does not have (the API server would drop it, strict apply refuses it).
    spec["elasticPolicy"]["rdzvConfigs"] = spec["elasticPolicy"].pop("rdzvConf")
    spec["runPolicy"]["backoffLimit"] = "3"
    assert len(k8s_schema.errors(job, CRD, "v1")) == 2
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    [c] = worker["template"]["spec"]["containers"]
    c["name"] = "trainer"
    spec["elasticPolicy"]["minReplicas"] = 3
    spec["pytorchReplicaSpecs"]["Master"] = {"replicas": 2, "template": worker["template"]}
    job["metadata"]["name"] = "Labctl_run"
    assert sorted(webhook_errors(job)) == [
        "Master replicas must be 1",
        "Master: must have at least one container with name pytorch",
        "Worker: must have at least one container with name pytorch",
        "elasticPolicy minReplicas 3 > maxReplicas 2",
        "metadata.name 'Labctl_run' is not a DNS-1035 label",
    ]
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["mountPath"] != "/checkpoints"]
    assert sorted(volume_errors(job, PVC)) == [
        "Master/trainer: the claim is not mounted",
        "Worker/trainer: the claim is not mounted",
    ]
    [cm] = [d for d in docs if d["kind"] == "ConfigMap"]
    cm["metadata"]["name"] = "Agent_zip"
    cm["binaryData"] = {"a zip": "not base64!"}
    assert len(configmap_errors(cm)) == 3


# --- the claim and the phase's k8s: section --------------------------------------------------

TINY_PHASES = """\
name: tiny
defaults:
  steps: 40
  seq_len: 16
  model: {vocab: 256, d_model: 32, n_layers: 1, n_heads: 2, d_ff: 64}
  checkpoint_every: 5
  keep_checkpoints: 20
  log_every: 1
  batch_size_per_gpu: 4
  mixed_precision: false
phases:
  1: {k8s: {checkpoint_pvc: from-phase, mount_path: /mnt/ckpt, cpu: "4", memory: 8Gi}}
  2: {}
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "phases.yaml"
    path.write_text(TINY_PHASES)
    return path


def test_the_phase_names_the_claim_and_resources_and_flags_win(tmp_path: Path, tiny: Path) -> None:
    docs, text, _ = write(planned(1, nodes_for("cpu", 1, 1), JobOptions(), tmp_path / "a", phases=tiny))
    job = pytorchjob(docs)
    assert volume_errors(job, "from-phase") == []
    [c] = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert {"name": "checkpoints", "mountPath": "/mnt/ckpt"} in c["volumeMounts"]
    assert c["resources"] == {"requests": {"cpu": "4", "memory": "8Gi"}}
    assert "Resources per pod: cpu 4, memory 8Gi." in text
    assert (trainer_settings(c) or {})["checkpoint_dir"] == "/mnt/ckpt/phase1"
    flags = JobOptions(pvc="flag-claim", mount_path="/ck", cpu="500m", memory="1Gi")
    docs, _, _ = write(planned(1, nodes_for("cpu", 1, 1), flags, tmp_path / "b", phases=tiny))
    job = pytorchjob(docs)
    assert volume_errors(job, "flag-claim") == []
    [c] = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert c["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"}}
    docs, text, _ = write(
        planned(2, nodes_for("cpu", 1, 3), JobOptions(pvc=PVC), tmp_path / "c", phases=tiny)
    )
    assert "Resources per pod: cpu 3; no memory request" in text


def test_a_chosen_checkpoint_folder_must_be_on_the_claim(tmp_path: Path, tiny: Path) -> None:
    from labctl.output.errors import InputError

    on = planned(2, nodes_for("cpu", 1, 1), JobOptions(pvc=PVC), tmp_path / "a", phases=tiny,
                 sets=("checkpoint_dir=/checkpoints/mine/phase{phase}",))  # fmt: skip
    docs, _, _ = write(on)
    [c] = pytorchjob(docs)["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert (trainer_settings(c) or {})["checkpoint_dir"] == "/checkpoints/mine/phase2"
    off = planned(2, nodes_for("cpu", 1, 1), JobOptions(pvc=PVC), tmp_path / "b", phases=tiny,
                  sets=("checkpoint_dir=/data/ckpt/phase{phase}",))  # fmt: skip
    with pytest.raises(InputError) as e:
        write(off)
    assert "/data/ckpt/phase2" in e.value.message and "--mount-path" in e.value.hint
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("mount", ["/opt/labctl", "/opt", "/dev/shm/ck", "/dev"])
def test_a_claim_that_meets_the_pods_own_mounts_is_refused(tmp_path: Path, mount: str) -> None:
    from labctl.output.errors import InputError

    with pytest.raises(InputError) as e:
        write(planned(2, nodes_for("cpu", 1, 1), JobOptions(pvc=PVC, mount_path=mount), tmp_path))
    assert mount in e.value.message and "--mount-path" in e.value.hint
    assert not tmp_path.joinpath("train-phase2.yaml").exists()


@pytest.fixture
def unreachable_lab(tmp_path: Path, tiny: Path) -> Path:
    """An inventory whose only host cannot be reached: whatever is refused here, is refused before preflight."""
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id").write_text("not really a key")
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY.replace("10.0.0.1", "127.0.0.1, port: 1"))
    return inv


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--phase", "2"), "--pvc NAME"),
        (
            ("--phase", "2", "--pvc", "ck", "--set", "checkpoint_dir=/data/ckpt"),
            "is not on the checkpoint volume",
        ),
        (("--phase", "2", "--pvc", "Bad_Name"), "is not a PersistentVolumeClaim name"),
        (("--phase", "2", "--pvc", "ck", "--memory", "lots"), "is not a Kubernetes quantity"),
    ],
)
def test_the_cli_refuses_a_job_off_the_claim_before_any_host_is_asked(
    unreachable_lab: Path, args: tuple[str, ...], said: str
) -> None:
    argv = ["-i", str(unreachable_lab), "train", "-f", str(unreachable_lab.parent / "phases.yaml"), *args,
            "--backend", "k8s", "-o", str(unreachable_lab.parent / "out")]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", *argv], capture_output=True, text=True, timeout=120,
        cwd=unreachable_lab.parent, env={**os.environ, "COLUMNS": "1000"},
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert said in output and "Traceback" not in output and "Preflight" not in output
    assert not (unreachable_lab.parent / "out").exists()


def test_labctl_train_k8s_says_which_torch_the_image_needs(tmp_path: Path, tiny: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        f"lab: t\nhosts:\n  here: {{address: 127.0.0.1, connection: local, python: {sys.executable}, roles: [train]}}\n"
    )
    rc, output = labctl_train(
        inv, "--device", "cpu", "--backend", "k8s", "--pvc", PVC, "-o", str(tmp_path / "out")
    )
    assert rc == 0, output
    assert f"Note: {TORCH_NOTE}" in output
    [path] = (tmp_path / "out").glob("*.yaml")
    assert webhook_errors(pytorchjob(list(yaml.safe_load_all(path.read_text())))) == []


# --- the pod's own command trains, is killed, and resumes from the claim -----------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_the_pod_command_trains_is_killed_and_resumes_from_the_claim(tmp_path: Path, tiny: Path) -> None:
    pytest.importorskip("torch")
    volume = tmp_path / "claim"  # the ReadWriteMany claim, as the pod's mount path
    volume.mkdir()
    one_node = (node("n0", 2, "cpu", OMP_NUM_THREADS="1"),)  # two processes on this machine's cores
    run = planned(2, one_node, JobOptions(pvc=PVC, mount_path=str(volume)), tmp_path / "out",
                  phases=tiny, sets=(*TRAIN_TINY[1::2], "steps=40", "checkpoint_every=5"))  # fmt: skip
    docs, _, _ = write(run)
    job = pytorchjob(docs)
    [cm] = [d for d in docs if d["kind"] == "ConfigMap"]
    [c] = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    # The ConfigMap volume: its zip where the pod's PYTHONPATH points, in a local folder.
    [agent_mount] = [m["mountPath"] for m in c["volumeMounts"] if m["name"] == "labctl-agent"]
    config_folder = k8s_pod_run.configmap_folder(cm, tmp_path / "configmap")
    # What the operator adds for a one-node job; the pod's own name resolves to the pod, here localhost.
    injected = {**operator_env(job), "PET_RDZV_ENDPOINT": f"127.0.0.1:{free_port()}"}
    metrics = volume / "labctl-runs" / run.spec.run_id / "metrics.jsonl"

    k8s_pod_run.train_kill_resume(c, injected, tmp_path, {agent_mount: config_folder}, metrics, 40)
    assert (volume / "phase2").is_dir()
