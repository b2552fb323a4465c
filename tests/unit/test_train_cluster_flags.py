"""`labctl train --backend slurm|k8s|trainjob --nodes N --gpus-per-node G` (issue 24, point 2):
a job for a cluster the flags describe, planned without the lab.

No lab host is asked and no inventory is read: the inventory may be missing, or name a host that
refuses every connection. The job files say what the flags say, and the Kubernetes manifests
pass the same CRD schemas and admission rules as those the lab describes (tests/k8s_schema.py,
tests/crds/). A real Slurm runs such a script in tests/integration/test_slurm_cluster.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.hosts.context import Context
from labctl.output.errors import InputError
from labctl.train import backends, launch, run
from labctl.train.backends import RunsOn
from labctl.train.request import ClusterShape, JobOptions, TrainRequest, parse_memory
from labctl.train.results import JobFiles
from tests import k8s_schema
from tests.unit.test_k8s_manifest import CRD as PYTORCHJOB_CRD
from tests.unit.test_k8s_manifest import TINY_PHASES, pytorchjob, webhook_errors
from tests.unit.test_k8s_manifest import volume_errors as pytorchjob_volume_errors
from tests.unit.test_train_backends import sbatch_options
from tests.unit.test_trainjob_manifest import CRD as TRAINJOB_CRD
from tests.unit.test_trainjob_manifest import (
    merged_container,
    rule_errors,
    runtime,  # noqa: F401 (a fixture)
    trainjob,
)
from tests.unit.test_trainjob_manifest import volume_errors as trainjob_volume_errors

PACKAGED = Path(__file__).parents[2] / "playbooks" / "train.yaml"
PVC = "cet-ckpt"
# The flags each cluster backend needs besides the cluster's: Kubernetes keeps checkpoints on a claim.
NEEDS = {"slurm": (), "k8s": ("--pvc", PVC), "trainjob": ("--pvc", PVC)}
# A lab whose only host refuses every connection at once: asked, it fails the command (exit 1).
REFUSING_LAB = """\
lab: t
defaults: {user: root, ssh_key: keys/id}
hosts:
  m5: {address: 127.0.0.1, port: 1, roles: [train]}
"""


def cli(cwd: Path, *args: str) -> tuple[int, str]:
    """The real CLI (its error paragraphs and exit codes), run in `cwd`."""
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "1000", "LABCTL_INVENTORY": ""},
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture
def phases(tmp_path: Path) -> Path:
    path = tmp_path / "phases.yaml"
    path.write_text(TINY_PHASES)
    return path


@pytest.fixture
def no_lab(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading the inventory, opening a connection or running preflight fails the test."""

    def used(what: str) -> Any:
        raise AssertionError(f"a cluster job described by flags used {what}")

    monkeypatch.setattr(Context, "inventory", property(lambda self: used("the inventory")))
    monkeypatch.setattr(Context, "pool", property(lambda self: used("the connection pool")))
    monkeypatch.setattr(launch, "preflight", lambda *a, **k: used("preflight"))


def start(tmp_path: Path, backend: str, job: JobOptions, *, phase: int = 2, **kw: Any) -> Any:
    ctx = Context.create(inventory_path=tmp_path / "no-such" / "lab.yaml")
    request = TrainRequest(
        phase=phase, file=kw.pop("file", PACKAGED), backend=backend, output=tmp_path / "out", job=job, **kw
    )
    return run.start(ctx, request)


def k8s_job(**flags: Any) -> JobOptions:
    return JobOptions(pvc=PVC, image="registry.local/lab/train:2.13.0", **flags)


# --- the backends say whose machines they run on ------------------------------------------------


def test_every_builtin_backend_declares_whose_machines_it_runs_on() -> None:
    assert {n: backends.get(n).runs_on for n in backends.names()} == {
        "ssh": RunsOn.LAB,
        "slurm": RunsOn.CLUSTER,
        "k8s": RunsOn.CLUSTER,
        "trainjob": RunsOn.CLUSTER,
        "kaggle": RunsOn.PLATFORM,
        "sagemaker": RunsOn.PLATFORM,
    }
    assert backends.running_on(RunsOn.CLUSTER) == ["slurm", "k8s", "trainjob"]


# --- no inventory, no host ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["slurm", "k8s", "trainjob"])
def test_a_job_for_flagged_nodes_reads_no_inventory_and_opens_no_connection(
    tmp_path: Path, no_lab: None, backend: str
) -> None:
    job = JobOptions(nodes=4, gpus_per_node=8, **({"pvc": PVC} if backend != "slurm" else {}))
    result = start(tmp_path, backend, job)
    assert isinstance(result, JobFiles) and result.backend == backend
    assert all(p.is_file() and p.parent == tmp_path / "out" for p in result.files)


@pytest.mark.parametrize("backend", ["slurm", "k8s", "trainjob"])
def test_a_lab_that_refuses_connections_is_not_asked(tmp_path: Path, phases: Path, backend: str) -> None:
    (tmp_path / "keys").mkdir()
    # A real key: a file that is none is refused on this machine before any host is asked.
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "keys" / "id")], check=True
    )
    inv = tmp_path / "inv.yaml"
    inv.write_text(REFUSING_LAB)
    base = ["-i", str(inv), "train", "-f", str(phases), "--phase", "2", "--backend", backend, *NEEDS[backend]]
    # Asked, the lab's host fails the command: the same command with the flags must not ask it.
    rc, output = cli(tmp_path, *base, "-o", str(tmp_path / "lab"))
    assert rc == 1 and "m5" in output, output
    rc, output = cli(tmp_path, *base, "--nodes", "2", "--gpus-per-node", "1", "-o", str(tmp_path / "flags"))
    assert rc == 0, output
    assert "m5" not in output and "Preflight" not in output and "Traceback" not in output
    assert list((tmp_path / "flags").glob("train-phase2.*"))


def test_the_cli_needs_no_inventory_file(tmp_path: Path, phases: Path) -> None:
    missing = tmp_path / "nowhere" / "lab.yaml"
    rc, output = cli(
        tmp_path, "-i", str(missing), "train", "-f", str(phases), "--phase", "2", "--backend", "slurm",
        "--nodes", "4", "--gpus-per-node", "8", "-o", str(tmp_path / "out"),
    )  # fmt: skip
    assert rc == 0, output
    assert "#SBATCH --nodes=4" in (tmp_path / "out" / "train-phase2.sbatch").read_text()
    assert not missing.parent.exists()


def test_the_cli_works_in_a_folder_without_an_inventory(tmp_path: Path) -> None:
    # The phases file where labctl looks by default (playbooks/ in the current folder); no inventory/.
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "train.yaml").write_text(TINY_PHASES)
    rc, output = cli(
        tmp_path, "train", "--phase", "2", "--backend", "slurm", "--nodes", "2", "--gpus-per-node", "0"
    )
    assert rc == 0, output
    # Without -o, the job goes with the run records, in the folder labctl ran in.
    [script] = (tmp_path / ".labctl" / "runs").glob("p2-*/slurm/train-phase2.sbatch")
    assert f"wrote {script}" in output
    assert not (tmp_path / "inventory").exists()


# --- what the job files say -----------------------------------------------------------------------


def test_the_sbatch_script_asks_for_what_the_flags_say(tmp_path: Path) -> None:
    job = JobOptions(nodes=4, gpus_per_node=8, cpus_per_node=64, memory_per_node="512G")
    [script, _agent] = start(tmp_path, "slurm", job).files
    text = script.read_text()
    got = sbatch_options(text)
    assert (got["nodes"], got["gres"], got["cpus-per-task"], got["mem"]) == ("4", "gpu:8", "64", "512G")
    assert "--nproc-per-node=8 " in text and "export OMP_NUM_THREADS=8" in text
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_a_cpu_cluster_asks_for_no_gpu_and_memory_in_slurms_units(tmp_path: Path) -> None:
    job = JobOptions(nodes=3, gpus_per_node=0, memory_per_node="1.5Gi")
    text = start(tmp_path, "slurm", job).files[0].read_text()
    got = sbatch_options(text)
    assert "gres" not in got and got["nodes"] == "3" and got["mem"] == "1536M"
    assert "export LABCTL_TRAIN_DEVICE=cpu" in text and "--nproc-per-node=1 " in text


def test_gpus_a_phase_leaves_idle_are_asked_for_and_said(tmp_path: Path) -> None:
    # The packaged phase 1 is single_gpu_debug: one process per node, whatever the node has.
    result = start(tmp_path, "slurm", JobOptions(nodes=2, gpus_per_node=8), phase=1)
    text = result.files[0].read_text()
    assert sbatch_options(text)["gres"] == "gpu:8" and "--nproc-per-node=1 " in text
    [idle] = [n for n in result.notes if "idle" in n]
    assert "7 of the 8 GPUs" in idle and "--gpus-per-node 1" in idle and "7 of the 8 GPUs" in text


@pytest.mark.parametrize("phase", [1, 2, 3, 4])
@pytest.mark.parametrize(
    ("flags", "limits", "requests"),
    [
        ({"nodes": 1, "gpus_per_node": 0}, None, {"cpu": "1"}),
        ({"nodes": 3, "gpus_per_node": 4}, {"nvidia.com/gpu": 4}, None),
        (
            {"nodes": 4, "gpus_per_node": 8, "cpus_per_node": 64, "memory_per_node": "512G"},
            {"nvidia.com/gpu": 8},
            {"cpu": "64", "memory": "512Gi"},
        ),
    ],
)
def test_every_pytorchjob_from_the_flags_passes_the_crd_and_the_operators_rules(
    tmp_path: Path, phase: int, flags: dict[str, Any], limits: Any, requests: Any
) -> None:
    [path] = start(tmp_path, "k8s", k8s_job(**flags), phase=phase).files
    docs = list(yaml.safe_load_all(path.read_text()))
    job = pytorchjob(docs)
    assert k8s_schema.errors(job, PYTORCHJOB_CRD, "v1") == []
    assert webhook_errors(job) == [] and pytorchjob_volume_errors(job, PVC) == []
    spec = job["spec"]
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    assert worker["replicas"] == spec["elasticPolicy"]["maxReplicas"] == flags["nodes"]
    [c] = worker["template"]["spec"]["containers"]
    assert c["resources"].get("limits") == limits and c["resources"].get("requests") == requests


@pytest.mark.parametrize("phase", [1, 2])
@pytest.mark.parametrize(
    ("flags", "limits", "requests"),
    [
        ({"nodes": 2, "gpus_per_node": 0, "cpus_per_node": 16}, None, {"cpu": "16"}),
        (
            {"nodes": 4, "gpus_per_node": 8, "cpus_per_node": 64, "memory_per_node": "700M"},
            {"nvidia.com/gpu": 8},
            {"cpu": "64", "memory": "700Mi"},
        ),
    ],
)
def test_every_trainjob_from_the_flags_passes_the_crd_and_the_trainers_rules(
    tmp_path: Path,
    runtime: dict[str, Any],  # noqa: F811
    phase: int,
    flags: dict[str, Any],
    limits: Any,
    requests: Any,
) -> None:
    [path] = start(tmp_path, "trainjob", k8s_job(**flags), phase=phase).files
    job = trainjob(list(yaml.safe_load_all(path.read_text())))
    assert k8s_schema.errors(job, TRAINJOB_CRD, "v1alpha1") == []
    assert rule_errors(job, runtime) == []
    assert trainjob_volume_errors(*merged_container(job, runtime), PVC) == []
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] == flags["nodes"]
    assert trainer["resourcesPerNode"].get("limits") == limits
    assert trainer["resourcesPerNode"].get("requests") == requests


def test_the_flags_win_over_the_phases_k8s_requests(tmp_path: Path, phases: Path) -> None:
    # TINY_PHASES' phase 1 asks for cpu 4 and memory 8Gi per pod.
    job = JobOptions(nodes=2, gpus_per_node=0, cpus_per_node=6, memory_per_node="2G")
    [path] = start(tmp_path, "k8s", job, phase=1, file=phases).files
    [c] = pytorchjob(list(yaml.safe_load_all(path.read_text())))["spec"]["pytorchReplicaSpecs"]["Worker"][
        "template"
    ]["spec"]["containers"]
    assert c["resources"] == {"requests": {"cpu": "6", "memory": "2Gi"}}


# --- --dry-run --------------------------------------------------------------------------------------


def test_dry_run_shows_the_job_and_writes_nothing(tmp_path: Path, phases: Path) -> None:
    rc, output = cli(
        tmp_path, "-i", str(tmp_path / "missing.yaml"), "train", "-f", str(phases), "--phase", "2",
        "--backend", "slurm", "--nodes", "4", "--gpus-per-node", "8", "--dry-run", "-o", str(tmp_path / "out"),
    )  # fmt: skip
    assert rc == 0, output
    assert "4 nodes × 8 GPUs" in output and "No lab host asked; nothing written" in output
    assert "#SBATCH --nodes=4" in output and "#SBATCH --gres=gpu:8" in output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["phases.yaml"]


def test_dry_run_json_cuts_the_agent_zip_out_of_a_manifest(tmp_path: Path) -> None:
    import json

    rc, output = cli(
        tmp_path, "--json", "train", "-f", str(PACKAGED), "--phase", "2", "--backend", "k8s", "--pvc", PVC,
        "--nodes", "2", "--gpus-per-node", "4", "--dry-run",
    )  # fmt: skip
    assert rc == 0, output
    doc = json.loads(output)
    assert (doc["dry_run"], doc["nodes"], doc["gpus_per_node"], doc["world_size"]) == (True, 2, 4, 8)
    [f] = doc["files"]
    assert "more characters)" in f["text"] and f["bytes"] > len(f["text"])
    assert "kind: PyTorchJob" in f["text"] and not (tmp_path / ".labctl").exists()


# --- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "args", "said"),
    [
        ("slurm", ("--nodes", "0", "--gpus-per-node", "8"), "--nodes 0 is out of range"),
        ("k8s", ("--nodes", "2", "--gpus-per-node", "-1"), "--gpus-per-node -1 is out of range"),
        ("trainjob", ("--nodes", "2", "--gpus-per-node", "1", "--cpus-per-node", "0"), "--cpus-per-node 0"),
        (
            "slurm",
            ("--nodes", "2", "--gpus-per-node", "8", "--memory-per-node", "lots"),
            "--memory-per-node 'lots' is not an amount of memory",
        ),
        (
            "slurm",
            ("--nodes", "2", "--gpus-per-node", "8", "--memory-per-node", "64"),
            "--memory-per-node '64'",
        ),
        ("slurm", ("--nodes", "2"), "--nodes also needs --gpus-per-node"),
        ("k8s", ("--cpus-per-node", "8"), "--cpus-per-node also needs --nodes and --gpus-per-node"),
        (
            "ssh",
            ("--nodes", "2", "--gpus-per-node", "8"),
            "--nodes, --gpus-per-node describe a cluster's nodes for --backend slurm or k8s or trainjob, not ssh",
        ),
        ("ssh", ("--memory-per-node", "8G"), "--memory-per-node describes a cluster's nodes"),
        ("kaggle", ("--gpus-per-node", "1"), "--gpus-per-node applies to --backend slurm or k8s or trainjob"),
        ("sagemaker", ("--nodes", "0"), "--nodes 0 is out of range"),
        (
            "slurm",
            ("--nodes", "2", "--gpus-per-node", "8", "--limit", "m5"),
            "--limit is about the lab's hosts",
        ),
        ("slurm", ("--nodes", "2", "--gpus-per-node", "0", "--device", "cuda"), "--gpus-per-node 0 gives"),
        ("k8s", ("--nodes", "2", "--gpus-per-node", "8", "--cpu", "4", "--cpus-per-node", "8"), "--cpu and"),
        ("k8s", ("--nodes", "2", "--gpus-per-node", "8"), "--pvc NAME"),
    ],
)
def test_bad_cluster_flags_exit_2_with_a_paragraph_naming_the_flag(
    tmp_path: Path, phases: Path, backend: str, args: tuple[str, ...], said: str
) -> None:
    extra = ("--pvc", PVC) if backend in ("k8s", "trainjob") and said != "--pvc NAME" else ()
    rc, output = cli(
        tmp_path, "-i", str(tmp_path / "missing.yaml"), "train", "-f", str(phases), "--phase", "2",
        "--backend", backend, *extra, *args, "-o", str(tmp_path / "out"),
    )  # fmt: skip
    assert rc == 2, output
    assert said in " ".join(output.split()) and "Traceback" not in output and "Usage:" not in output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("text", "mib"),
    [("64G", 65536), ("64Gi", 65536), ("64GiB", 65536), ("512m", 512), ("1.5G", 1536), (" 2T ", 2 << 20)],
)
def test_memory_takes_slurm_and_kubernetes_binary_units(text: str, mib: int) -> None:
    assert parse_memory(text, "--memory-per-node") == mib


@pytest.mark.parametrize("text", ["64", "0G", "-1G", "lots", "64Gx", "G", ""])
def test_memory_without_a_unit_or_amount_is_refused(text: str) -> None:
    with pytest.raises(InputError) as e:
        JobOptions(memory_per_node=text)
    assert e.value.message.startswith("--memory-per-node") and "64G" in e.value.hint


def test_memory_is_written_in_each_schedulers_units() -> None:
    assert (ClusterShape(1, 0, None, 1536).slurm_memory(), ClusterShape(1, 0, None, 1536).k8s_memory()) == (
        "1536M",
        "1536Mi",
    )
    assert (ClusterShape(1, 0, None, 2048).slurm_memory(), ClusterShape(1, 0, None, 2048).k8s_memory()) == (
        "2G",
        "2Gi",
    )


def test_without_the_flags_the_lab_still_describes_the_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[list[str]] = []

    def preflight(ctx: Context, hosts: list[Any], *a: Any) -> Any:
        asked.append([h.name for h in hosts])
        raise InputError("stop here", "")

    monkeypatch.setattr(launch, "preflight", preflight)
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id").write_text("not really a key")
    inv = tmp_path / "inv.yaml"
    inv.write_text(REFUSING_LAB)
    ctx = Context.create(inventory_path=inv)
    with pytest.raises(InputError, match="stop here"):
        run.start(ctx, TrainRequest(phase=2, file=PACKAGED, backend="slurm", output=tmp_path / "out"))
    assert asked == [["m5"]]


@pytest.mark.parametrize("args", [["train", "status"], ["train", "stop", "p1-x"], ["ckpt", "list"]])
def test_run_records_beside_a_missing_inventory_name_the_inventory_not_an_empty_list(
    tmp_path: Path, args: list[str]
) -> None:
    """Run records live beside the inventory, found without parsing it; a mistyped -i is still
    named as such, never answered with "no runs"."""
    rc, out = cli(tmp_path, "-i", str(tmp_path / "typo" / "lab.yaml"), *args)
    assert rc == 2, out
    assert f"No inventory at {tmp_path / 'typo' / 'lab.yaml'}" in out and "No run" not in out
