"""Slurm and Kubeflow job files (train/backends/slurm.py, k8s.py): the batch script is executed with stand-ins
for Slurm's commands, and the manifest's command is read the way the kubelet and torchrun read it."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.hosts.agent_ship import agent_zip
from labctl.output.errors import InputError
from labctl.train.backends.jobs import write_job
from labctl.train.backends.k8s import DEFAULT_IMAGE, k8s_job_name, render_pytorchjob
from labctl.train.backends.slurm import render_sbatch
from labctl.train.request import JobOptions
from labctl.train.spec import LOG_PREFIX_TEMPLATE, RUN_ENV, LaunchSpec, NodeSpec
from tests.k8s_pod_run import k8s_expand

# Everything a shell or the kubelet could take for syntax: quotes, spaces, $, backticks, %.
TRICKY = {
    "name": 'it\'s a "quoted" $HOME `id` $(whoami) ${x} 100% \\ end',
    "lr": 3e-4,
    "tags": ["two words", "line\nbreak"],
}
DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
PVC = "cet-ckpt"  # a Kubernetes job needs a checkpoint claim


def node(host: str, nproc: int = 2, device: str = "cuda", **env: str) -> NodeSpec:
    base = {"CUDA_VISIBLE_DEVICES": "0,1", "OMP_NUM_THREADS": "6", "NCCL_SOCKET_IFNAME": "bond0"}
    return NodeSpec(
        host=host,
        address=f"10.0.0.{len(host)}",
        nproc=nproc,
        device=device,
        python="/opt/lab/venv/bin/python",
        gpu_indices=tuple(range(nproc)) if device == "cuda" else (),
        env={**base, **env},
    )


def make_spec(nodes: tuple[NodeSpec, ...] | None = None, **kw: Any) -> LaunchSpec:
    nodes = nodes or (node("m5"), node("irina"))
    fields: dict[str, Any] = {
        "run_id": "20250611-1420-ab12",
        "phase": 2,
        "dist_backend": "nccl",
        "nodes": nodes,
        "head_address": nodes[0].address,
        "port": 29511,
        "max_restarts": 3,
        "settings": TRICKY,
        "rdzv_timeout": 777,
        "log_dir": "/var/log/labctl/run",
    }
    fields.update(kw)
    return LaunchSpec(**fields)


# --- Slurm -------------------------------------------------------------------------------------


def sbatch_options(script: str) -> dict[str, str]:
    return {m[1]: m[2] for m in re.finditer(r"^#SBATCH --([a-z-]+)=(.*)$", script, re.M)}


@pytest.fixture
def slurm(tmp_path: Path) -> dict[str, Any]:
    """Stand-ins for scontrol and srun, and a PYTHON that records what it was asked to run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        textwrap.dedent(
            """\
            #!/bin/sh
            [ "$1 $2 $3" = "show hostnames gpu-a[07-08]" ] || { echo "scontrol: unexpected $*" >&2; exit 3; }
            printf 'gpu-a07\\ngpu-a08\\n'
            """
        )
    )
    # srun runs its command: drop srun's own options, run the rest.
    (bin_dir / "srun").write_text(
        '#!/bin/sh\nwhile [ $# -gt 0 ]; do case "$1" in --*) shift ;; *) break ;; esac; done\nexec "$@"\n'
    )
    record = tmp_path / "argv.json"
    fake_python = bin_dir / "fake-python"
    fake_python.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "keys = ['PYTHONPATH', 'CUDA_VISIBLE_DEVICES', 'NCCL_SOCKET_IFNAME', 'OMP_NUM_THREADS',\n"
        f"        {RUN_ENV!r}, 'TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE', 'LABCTL_TRAIN_DEVICE']\n"
        "out = {'argv': sys.argv[1:], 'env': {k: os.environ.get(k) for k in keys}}\n"
        f"open({str(record)!r}, 'w').write(json.dumps(out))\n"
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return {"bin": bin_dir, "python": fake_python, "record": record}


def run_sbatch(script: Path, slurm: dict[str, Any], **extra: str) -> subprocess.CompletedProcess[str]:
    """Run the script as sbatch would on the first node: submitted from its own folder."""
    env = {
        "PATH": f"{slurm['bin']}:/usr/bin:/bin",
        "PYTHON": str(slurm["python"]),
        "SLURM_JOB_ID": "4242",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "gpu-a[07-08]",
        "SLURM_SUBMIT_DIR": str(script.parent),
        **extra,
    }
    return subprocess.run(
        ["bash", str(script)], cwd=script.parent, env=env, capture_output=True, text=True, timeout=30
    )


def recorded(slurm: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(slurm["record"].read_text())
    return data


def options(argv: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)


def test_sbatch_script_is_valid_bash_with_the_run_s_allocation(tmp_path: Path) -> None:
    spec = make_spec(nodes=(node("m5", 4), node("irina", 4), node("pharaoh", 4)))
    paths = write_job(spec, "slurm", tmp_path, partition="gpu", time_limit="1-12:00:00")
    script = paths[0]
    assert script.name == "train-phase2.sbatch"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    assert text.startswith("#!/bin/bash\n")
    opts = sbatch_options(text)
    assert opts["nodes"] == "3"
    assert opts["ntasks-per-node"] == "1"
    assert opts["gres"] == "gpu:4"
    assert opts["cpus-per-task"] == str(4 * 6)  # each worker gets its OMP_NUM_THREADS
    assert opts["job-name"] == f"labctl-{spec.run_id}"
    assert opts["output"].endswith("%j.out")
    assert (opts["partition"], opts["time"]) == ("gpu", "1-12:00:00")
    # sbatch stops reading directives at the first command.
    first_command = next(i for i, ln in enumerate(text.splitlines()) if ln and not ln.startswith("#"))
    assert all(i < first_command for i, ln in enumerate(text.splitlines()) if ln.startswith("#SBATCH"))


def test_sbatch_without_gpus_asks_for_none(tmp_path: Path) -> None:
    spec = make_spec(nodes=(node("m5", 3, "cpu"), node("irina", 3, "cpu")), dist_backend="gloo")
    opts = sbatch_options(render_sbatch(spec, None))
    assert "gres" not in opts and "gpus-per-node" not in opts
    assert "partition" not in opts and "time" not in opts
    assert opts["nodes"] == "2"


def test_sbatch_runs_torchrun_with_the_settings_json_intact(tmp_path: Path, slurm: dict[str, Any]) -> None:
    spec = make_spec()
    out = tmp_path / "job dir $x 'q'"  # the submit folder's name needs quoting too
    script, agent = write_job(spec, "slurm", out)
    done = run_sbatch(script, slurm)
    assert done.returncode == 0, done.stderr
    got = recorded(slurm)
    argv = got["argv"]
    entry = spec.entry_argv()
    assert argv[:2] == ["-m", "torch.distributed.run"]
    assert argv[-len(entry) :] == entry
    assert json.loads(argv[-1]) == TRICKY
    opts = options(argv[2 : -len(entry)])
    assert opts["nnodes"] == "2"
    assert opts["nproc-per-node"] == "2"
    assert opts["rdzv-backend"] == "c10d"
    assert opts["rdzv-endpoint"] == f"gpu-a07:{spec.port}"  # the allocation's first node
    assert opts["rdzv-id"] == "4242-0"  # the job and its restart count: a requeued job meets anew
    assert opts["rdzv-conf"] == f"join_timeout={spec.rdzv_timeout}"
    assert opts["max-restarts"] == str(spec.max_restarts)
    assert opts["tee"] == "3"  # torchrun puts the rank prefix on tee'd lines only
    env = got["env"]
    assert env["PYTHONPATH"] == str(agent)
    assert env[RUN_ENV] == spec.run_id
    assert env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == LOG_PREFIX_TEMPLATE
    assert env["LABCTL_TRAIN_DEVICE"] == "cuda"
    # The lab host's bond0 means nothing on a cluster's node: each node decides at start, and
    # gpu-a07 resolves nowhere here, so torch picks and the job says so.
    assert env["NCCL_SOCKET_IFNAME"] is None
    assert "no interface found towards gpu-a07" in done.stderr
    assert env["OMP_NUM_THREADS"] == "6"
    assert env["CUDA_VISIBLE_DEVICES"] is None  # Slurm picks the GPUs


def test_sbatch_python_defaults_to_python3(tmp_path: Path, slurm: dict[str, Any]) -> None:
    (slurm["bin"] / "python3").symlink_to(slurm["python"])
    script = write_job(make_spec(), "slurm", tmp_path)[0]
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env.update(
        PATH=f"{slurm['bin']}:/usr/bin:/bin",
        SLURM_JOB_ID="1",
        SLURM_NNODES="2",
        SLURM_JOB_NODELIST="gpu-a[07-08]",
        SLURM_SUBMIT_DIR=str(tmp_path),
    )
    env.pop("PYTHONPATH", None)
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert recorded(slurm)["argv"][:2] == ["-m", "torch.distributed.run"]


def test_sbatch_agent_zip_is_the_agent_and_imports(tmp_path: Path) -> None:
    data, sha = agent_zip()
    script, agent = write_job(make_spec(), "slurm", tmp_path)
    assert agent.parent == script.parent
    assert agent.name == f"labctl-agent-{sha}.pyz"
    assert agent.read_bytes() == data
    # What PYTHONPATH gives torchrun's workers: labctl.agent from the zip, not from this checkout.
    probe = subprocess.run(
        [sys.executable, "-c", "import labctl.agent as a; print(a.__file__)"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(agent), "PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip().startswith(str(agent))


def test_sbatch_stops_early_when_the_agent_zip_is_not_beside_it(
    tmp_path: Path, slurm: dict[str, Any]
) -> None:
    script, agent = write_job(make_spec(), "slurm", tmp_path)
    agent.unlink()
    done = run_sbatch(script, slurm)
    assert done.returncode == 2
    assert agent.name in done.stderr
    assert not slurm["record"].exists()


def test_sbatch_runs_a_user_script_without_the_agent(tmp_path: Path, slurm: dict[str, Any]) -> None:
    spec = make_spec(script="train.py", script_args=("--tag", "a b $HOME", "--pct=100%"))
    paths = write_job(spec, "slurm", tmp_path)
    assert [p.name for p in paths] == ["train-phase2.sbatch"]
    assert not list(tmp_path.glob("*.pyz"))
    done = run_sbatch(paths[0], slurm)
    assert done.returncode == 0, done.stderr
    got = recorded(slurm)
    assert got["argv"][-4:] == ["train.py", "--tag", "a b $HOME", "--pct=100%"]
    assert got["env"]["PYTHONPATH"] is None


def test_sbatch_leaves_out_settings_the_hosts_disagree_on(tmp_path: Path, slurm: dict[str, Any]) -> None:
    spec = make_spec(nodes=(node("m5", OMP_NUM_THREADS="6"), node("irina", OMP_NUM_THREADS="3")))
    script = write_job(spec, "slurm", tmp_path)[0]
    assert run_sbatch(script, slurm).returncode == 0
    assert recorded(slurm)["env"]["OMP_NUM_THREADS"] is None
    assert "irina: 3" in script.read_text()  # said in a comment, so a person can set it


def test_sbatch_uses_the_largest_process_count_of_a_mixed_lab(tmp_path: Path, slurm: dict[str, Any]) -> None:
    spec = make_spec(nodes=(node("m5", 1), node("irina", 2)))
    script = write_job(spec, "slurm", tmp_path)[0]
    assert sbatch_options(script.read_text())["gres"] == "gpu:2"
    assert run_sbatch(script, slurm).returncode == 0
    assert "--nproc-per-node=2" in recorded(slurm)["argv"]


@pytest.mark.slow
def test_sbatch_starts_real_torchrun_workers(tmp_path: Path, slurm: dict[str, Any]) -> None:
    """One node, two CPU workers under the real torchrun: rendezvous, ranks, prefixes, arguments."""
    pytest.importorskip("torch.distributed")
    (slurm["bin"] / "scontrol").write_text("#!/bin/sh\necho localhost\n")
    (tmp_path / "worker.py").write_text(
        textwrap.dedent(
            """\
            import json, os, sys
            import torch.distributed as dist
            dist.init_process_group("gloo")
            print(dist.get_rank(), dist.get_world_size(), os.environ["LABCTL_RUN_ID"], json.dumps(sys.argv[1:]))
            dist.destroy_process_group()
            """
        )
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cpu = NodeSpec(
        host="h", address="h", nproc=2, device="cpu", python="python3", env={"OMP_NUM_THREADS": "1"}
    )
    args = ("a b", "$HOME", "it's")
    spec = make_spec(
        nodes=(cpu,), dist_backend="gloo", port=port, max_restarts=0, script="worker.py", script_args=args
    )
    script = write_job(spec, "slurm", tmp_path)[0]
    done = run_sbatch(script, slurm, PYTHON=sys.executable, SLURM_NNODES="1", SLURM_JOB_NODELIST="x")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = sorted(ln for ln in done.stdout.splitlines() if ln.startswith("[rank"))
    tail = f"2 {spec.run_id} {json.dumps(list(args))}"
    assert lines == [f"[rank0]:0 {tail}", f"[rank1]:1 {tail}"]


# --- Kubeflow ----------------------------------------------------------------------------------


def manifest(spec: LaunchSpec, tmp_path: Path, **kw: Any) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    paths = write_job(spec, "k8s", tmp_path, **{"pvc": PVC, **kw})
    assert [p.name for p in paths] == [f"train-phase{spec.phase}.yaml"]
    docs = list(yaml.safe_load_all(paths[0].read_text()))
    jobs = [d for d in docs if d["kind"] == "PyTorchJob"]
    maps = [d for d in docs if d["kind"] == "ConfigMap"]
    assert len(jobs) == 1 and len(maps) <= 1 and len(docs) == len(jobs) + len(maps)
    return (maps[0] if maps else None), jobs[0]


def container(job: dict[str, Any]) -> dict[str, Any]:
    containers = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    c: dict[str, Any] = containers[0]
    return c


def pod_env(job: dict[str, Any]) -> dict[str, str]:
    raw = {e["name"]: e["value"] for e in container(job)["env"]}
    return {k: k8s_expand(v, raw) for k, v in raw.items()}


def operator_env(job: dict[str, Any]) -> dict[str, str]:
    """The PET_* variables the training operator (v1, elastic, Worker only) puts in each pod."""
    policy = job["spec"]["elasticPolicy"]
    port = next(p["containerPort"] for p in container(job)["ports"] if p["name"] == "pytorchjob-port")
    env = {
        "PET_RDZV_ENDPOINT": f"{job['metadata']['name']}-worker-0:{port}",
        "PET_RDZV_BACKEND": policy["rdzvBackend"],
        "PET_NNODES": f"{policy['minReplicas']}:{policy['maxReplicas']}",
        "PET_MAX_RESTARTS": str(policy["maxRestarts"]),
        "PET_RDZV_ID": policy["rdzvId"],
        "PET_RDZV_CONF": ",".join(f"{c['key']}={c['value']}" for c in policy["rdzvConf"]),
    }
    return env


def test_pytorchjob_shape(tmp_path: Path) -> None:
    spec = make_spec(nodes=(node("m5", 4), node("irina", 4), node("pharaoh", 4)))
    cm, job = manifest(spec, tmp_path)
    assert cm is not None
    assert job["apiVersion"] == "kubeflow.org/v1"
    name = job["metadata"]["name"]
    assert DNS1035.fullmatch(name) and len(name) <= 63
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 3
    assert worker["restartPolicy"] == "OnFailure"
    assert container(job)["name"] == "pytorch"
    policy = job["spec"]["elasticPolicy"]
    assert policy["rdzvBackend"] == "c10d"
    assert (policy["minReplicas"], policy["maxReplicas"], policy["maxRestarts"]) == (3, 3, spec.max_restarts)
    assert {"key": "join_timeout", "value": str(spec.rdzv_timeout)} in policy["rdzvConf"]
    assert job["spec"]["nprocPerNode"] == "4"  # a string in the v1 API
    assert container(job)["resources"]["limits"]["nvidia.com/gpu"] == 4


def test_pytorchjob_cpu_run_asks_for_no_gpus(tmp_path: Path) -> None:
    spec = make_spec(nodes=(node("m5", 2, "cpu"), node("irina", 2, "cpu")), dist_backend="gloo")
    _, job = manifest(spec, tmp_path)
    limits = container(job).get("resources", {}).get("limits", {})
    assert "nvidia.com/gpu" not in limits
    assert pod_env(job)["LABCTL_TRAIN_DEVICE"] == "cpu"


def test_pytorchjob_carries_the_agent_zip_and_points_python_at_it(tmp_path: Path) -> None:
    data, sha = agent_zip()
    cm, job = manifest(make_spec(), tmp_path)
    assert cm is not None
    [(key, b64)] = cm["binaryData"].items()
    assert sha in key
    assert base64.b64decode(b64) == data
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    [item] = volume["configMap"]["items"]
    assert item["key"] == key
    [mount] = [m for m in container(job)["volumeMounts"] if m["name"] == volume["name"]]
    assert pod_env(job)["PYTHONPATH"] == f"{mount['mountPath']}/{item['path']}"


def test_pytorchjob_command_reaches_torchrun_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = pytest.importorskip("torch.distributed.run")
    spec = make_spec()
    _, job = manifest(spec, tmp_path)
    env = pod_env(job)
    # $(whoami) in the settings must stay text even where the pod defines whoami.
    command = [k8s_expand(arg, {**env, "whoami": "root"}) for arg in container(job)["command"]]
    assert command[1:3] == ["-m", "torch.distributed.run"]
    # The settings travel intact, with the checkpoint folder and metrics placed on the claim.
    settings = {
        **TRICKY,
        "checkpoint_dir": "/checkpoints/phase2",
        "metrics_path": f"/checkpoints/labctl-runs/{spec.run_id}/metrics.jsonl",
    }
    entry = dataclasses.replace(spec, settings=settings).entry_argv()
    assert command[-len(entry) :] == entry
    assert json.loads(command[-1]) == settings
    for key, value in operator_env(job).items():
        monkeypatch.setenv(key, value)
    args = run.get_args_parser().parse_args(command[3:])  # torchrun reads PET_* for unset flags
    assert args.nnodes == "2:2"
    assert args.nproc_per_node == "2"
    assert args.rdzv_backend == "c10d"
    assert args.rdzv_endpoint == f"{job['metadata']['name']}-worker-0:{spec.port}"
    assert args.rdzv_id == spec.run_id
    assert args.rdzv_conf == f"join_timeout={spec.rdzv_timeout}"
    assert int(args.max_restarts) == spec.max_restarts
    assert args.tee == "3"  # torchrun puts the rank prefix on tee'd lines only
    assert args.module and args.training_script == "labctl.agent.train.trainer"
    assert args.training_script_args == ["--settings", json.dumps(settings, sort_keys=True)]


def test_pytorchjob_env_is_portable(tmp_path: Path) -> None:
    spec = make_spec()
    _, job = manifest(spec, tmp_path)
    env = pod_env(job)
    assert env[RUN_ENV] == spec.run_id
    assert env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == LOG_PREFIX_TEMPLATE
    assert env["OMP_NUM_THREADS"] == "6"
    # The GPUs are the device plugin's to pick, and a pod's interface is not the lab's bond.
    assert not {"CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME"} & env.keys()
    assert all(isinstance(e["value"], str) for e in container(job)["env"])


def test_pytorchjob_leaves_out_settings_the_hosts_disagree_on(tmp_path: Path) -> None:
    spec = make_spec(nodes=(node("m5", OMP_NUM_THREADS="8"), node("irina", OMP_NUM_THREADS="4")))
    path = write_job(spec, "k8s", tmp_path, pvc=PVC)[0]
    _, job = manifest(spec, tmp_path)
    assert "OMP_NUM_THREADS" not in pod_env(job)
    header = path.read_text().split("\n---", 1)[0]
    assert "OMP_NUM_THREADS" in header and "irina: 4" in header


def test_pytorchjob_for_a_user_script(tmp_path: Path) -> None:
    spec = make_spec(script="/workspace/train.py", script_args=("--tag", "a $(b) c"))
    cm, job = manifest(spec, tmp_path, image="registry.local/lab/train:2.13")
    assert cm is None
    assert container(job)["image"] == "registry.local/lab/train:2.13"
    env = pod_env(job)
    command = [k8s_expand(arg, {**env, "b": "X"}) for arg in container(job)["command"]]
    assert command[-3:] == ["/workspace/train.py", "--tag", "a $(b) c"]
    assert "PYTHONPATH" not in env
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert not [v for v in pod["volumes"] if "configMap" in v]


def test_pytorchjob_image_placeholder_is_flagged(tmp_path: Path) -> None:
    path = write_job(make_spec(), "k8s", tmp_path, pvc=PVC)[0]
    text = path.read_text()
    _, job = manifest(make_spec(), tmp_path)
    assert container(job)["image"] == DEFAULT_IMAGE
    header = text.split("\n---", 1)[0]
    assert DEFAULT_IMAGE in header and "pin" in header


def test_pytorchjob_may_shrink_to_min_nodes(tmp_path: Path) -> None:
    spec = make_spec(nodes=(node("a"), node("b"), node("c"), node("d")))
    _, job = manifest(spec, tmp_path, min_nodes=3)
    policy = job["spec"]["elasticPolicy"]
    assert (policy["minReplicas"], policy["maxReplicas"]) == (3, 4)
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 4


def test_pytorchjob_mixed_lab_uses_the_largest_count_and_says_so(tmp_path: Path) -> None:
    spec = make_spec(nodes=(node("m5", 1), node("irina", 2)))
    path = write_job(spec, "k8s", tmp_path, pvc=PVC)[0]
    _, job = manifest(spec, tmp_path)
    assert job["spec"]["nprocPerNode"] == "2"
    assert container(job)["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert "--nproc-per-node=2" in container(job)["command"]
    header = path.read_text().split("\n---", 1)[0]
    assert "m5: 1" in header and "irina: 2" in header


@pytest.mark.parametrize(
    ("run_id", "nnodes"),
    [
        ("20250611-1420-ab12", 2),
        ("2025_06_11T14:20 Big-Run", 3),
        ("x" * 80, 12),
        ("ÄÖÜ", 1),
        ("---", 2),
    ],
)
def test_job_names_fit_kubernetes(run_id: str, nnodes: int) -> None:
    name = k8s_job_name(run_id, nnodes)
    assert DNS1035.fullmatch(name)
    # The operator names each worker's Service after the job; those must fit a label too.
    assert len(f"{name}-worker-{nnodes - 1}") <= 63


def test_job_names_keep_cut_or_cleaned_run_ids_apart() -> None:
    assert k8s_job_name("a" * 80 + "1", 2) != k8s_job_name("a" * 80 + "2", 2)
    assert k8s_job_name("run_1", 2) != k8s_job_name("run-1", 2)


# --- bad input ---------------------------------------------------------------------------------


def assert_input_error(excinfo: pytest.ExceptionInfo[InputError]) -> None:
    assert excinfo.value.message and excinfo.value.hint


def test_unknown_backend(tmp_path: Path) -> None:
    with pytest.raises(InputError) as e:
        write_job(make_spec(), "pbs", tmp_path)
    assert_input_error(e)
    assert "slurm" in e.value.hint and "k8s" in e.value.hint
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("backend", ["slurm", "k8s"])
def test_mixed_devices_are_refused(tmp_path: Path, backend: str) -> None:
    spec = make_spec(nodes=(node("m5", 2, "cuda"), node("irina", 2, "cpu")))
    with pytest.raises(InputError) as e:
        write_job(spec, backend, tmp_path)
    assert_input_error(e)
    assert "irina" in e.value.message


@pytest.mark.parametrize(
    ("backend", "kw"),
    [
        ("slurm", {"partition": "gpu; rm -rf /"}),
        ("slurm", {"partition": "gpu\n"}),
        ("slurm", {"time_limit": "tomorrow"}),
        ("slurm", {"time_limit": "1:00:00\n"}),
        ("slurm", {"image": "pytorch/pytorch:2.13.0"}),
        ("slurm", {"min_nodes": 1}),
        ("k8s", {"partition": "gpu", "pvc": PVC}),
        ("k8s", {"min_nodes": 0, "pvc": PVC}),
        ("k8s", {"min_nodes": 3, "pvc": PVC}),
        ("k8s", {"image": "two words", "pvc": PVC}),
    ],
)
def test_bad_options_are_refused(tmp_path: Path, backend: str, kw: dict[str, Any]) -> None:
    with pytest.raises(InputError) as e:
        write_job(make_spec(), backend, tmp_path, **kw)
    assert_input_error(e)


def test_a_run_without_nodes_is_refused() -> None:
    empty = dataclasses.replace(make_spec(), nodes=())
    with pytest.raises(InputError) as e:
        render_sbatch(empty, None)
    assert_input_error(e)
    with pytest.raises(InputError):
        render_pytorchjob(empty, "eA==", "a.pyz", JobOptions(pvc=PVC))
