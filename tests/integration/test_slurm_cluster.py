"""`labctl train --backend slurm` under a real Slurm (Debian's slurm-wlm, one node, started here).

The sbatch script labctl writes is submitted with sbatch for real: it trains to its last step;
cancelled mid-run and submitted again it resumes past its last checkpoint; requeued by Slurm
(`scontrol requeue`, what preemption does) it starts again by itself and resumes too.
Two nodes: two `slurmd -N NAME` side by side on this machine (distinct ports and spool folders,
both at NodeAddr 127.0.0.1) run one torchrun each, which meet at the head node's NodeAddr.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import k8s_pod_run, slurm_cluster
from tests.conftest import ON_SLURM

pytestmark = [pytest.mark.integration, ON_SLURM]

STEPS = 80
PHASES = f"""\
name: tiny
defaults:
  steps: {STEPS}
  seq_len: 16
  model: {{vocab: 256, d_model: 32, n_layers: 1, n_heads: 2, d_ff: 64}}
  checkpoint_every: 5
  keep_checkpoints: 40
  log_every: 1
  batch_size_per_gpu: 4
  checkpoint_dir: CKPT/phase{{phase}}
phases:
  1: {{}}
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    why = slurm_cluster.missing()
    if why:
        pytest.skip(why)
    with slurm_cluster.one_node_cluster() as env:
        yield env


def write_job(tmp_path: Path, *extra: str, hosts: int = 1) -> Path:
    """`labctl train --backend slurm` for a CPU run on `hosts` hosts; the folder with the script."""
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        "lab: t\nhosts:\n"
        + "".join(
            f"  h{i}: {{address: 127.0.0.1, connection: local, python: {sys.executable}, roles: [train]}}\n"
            for i in range(hosts)
        )
    )
    phases = tmp_path / "phases.yaml"
    phases.write_text(PHASES.replace("CKPT", str(tmp_path / "ckpt")))
    out = tmp_path / "job"
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", "-i", str(inv), "train", "-f", str(phases), "--phase", "1",
         "--device", "cpu", "--backend", "slurm", "-o", str(out), *extra],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def sbatch(job: Path, env: dict[str, str]) -> str:
    [script] = job.glob("*.sbatch")
    proc = subprocess.run(
        ["sbatch", "--parsable", f"--export=ALL,PYTHON={sys.executable}", script.name],
        cwd=job, env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def events(job: Path) -> list[dict[str, Any]]:
    found = list(job.glob("labctl-runs/*/metrics.jsonl"))
    return k8s_pod_run.events(found[0]) if found else []


def output(job: Path) -> str:
    return "".join(p.read_text() for p in job.glob("*.out"))


def wait_for_checkpoint(job: Path, job_id: str, env: dict[str, str]) -> None:
    """Until a checkpoint is in the metrics file and in the job's output file. The output has it
    only once torchrun's tail has passed it on, and whatever it had not when the step is killed is
    lost: a test that kills the job then still has the first attempt's lines to look for."""
    deadline = time.monotonic() + 120
    while not (
        any(e["event"] == "checkpoint" for e in events(job)) and '"event": "checkpoint"' in output(job)
    ):
        state = slurm_cluster.job_state(job_id, env)
        assert state in ("PENDING", "RUNNING", "CONFIGURING"), f"job {state}: {output(job)}"
        assert time.monotonic() < deadline, "no checkpoint within 120 s"
        time.sleep(0.05)


def runs(all_events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The events split at each start: one list per time the trainer ran."""
    out: list[list[dict[str, Any]]] = []
    for e in all_events:
        if e["event"] == "start":
            out.append([])
        if out:
            out[-1].append(e)
    return out


def assert_resumed(second: list[dict[str, Any]], saved: int) -> None:
    start = second[0]
    assert start["event"] == "start" and start["resumed_from"] is not None and start["resumed_from"] >= saved
    steps = [e["step"] for e in second if e["event"] == "step"]
    assert steps and min(steps) > start["resumed_from"]
    assert second[-1]["event"] == "done" and second[-1]["step"] == STEPS


def test_the_sbatch_script_trains_to_its_last_step(cluster: dict[str, str], tmp_path: Path) -> None:
    job = write_job(tmp_path)
    job_id = sbatch(job, cluster)
    assert slurm_cluster.wait_for(job_id, cluster, {"COMPLETED", "FAILED", "CANCELLED"}) == "COMPLETED", (
        output(job)
    )
    [only] = runs(events(job))
    assert only[0]["resumed_from"] is None
    assert only[-1]["event"] == "done" and only[-1]["step"] == STEPS
    assert (tmp_path / "ckpt" / "phase1" / f"step-{STEPS:08d}.pt").exists()
    # Decided on the node at start: the one-node job's head is this machine, so its address's interface.
    assert "no interface found" not in output(job)


def test_a_cancelled_job_submitted_again_resumes_past_its_last_checkpoint(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    job = write_job(tmp_path)
    first_id = sbatch(job, cluster)
    wait_for_checkpoint(job, first_id, cluster)
    subprocess.run(["scancel", first_id], env=cluster, check=True, timeout=30)
    slurm_cluster.wait_for(first_id, cluster, {"CANCELLED", "COMPLETED", "FAILED"})
    first = events(job)
    assert not any(e["event"] == "done" for e in first), output(job)
    saved = max(e["step"] for e in first if e["event"] == "checkpoint")
    second_id = sbatch(job, cluster)
    assert slurm_cluster.wait_for(second_id, cluster, {"COMPLETED", "FAILED", "CANCELLED"}) == "COMPLETED"
    assert_resumed(runs(events(job))[-1], saved)


def test_a_requeued_job_starts_again_by_itself_and_resumes(cluster: dict[str, str], tmp_path: Path) -> None:
    job = write_job(tmp_path)
    job_id = sbatch(job, cluster)
    wait_for_checkpoint(job, job_id, cluster)
    subprocess.run(["scontrol", "requeue", job_id], env=cluster, check=True, timeout=30)
    saved_before = max(e["step"] for e in events(job) if e["event"] == "checkpoint")
    # Slurm holds a requeued job back (its begin time a couple of minutes on) before it may run
    # again; bring that forward so the test does not sit out the wait. It then starts by itself.
    slurm_cluster.wait_for(job_id, cluster, {"PENDING"})
    subprocess.run(
        ["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=cluster, check=True, timeout=30
    )
    assert slurm_cluster.wait_for(job_id, cluster, {"COMPLETED", "FAILED"}, timeout=300) == "COMPLETED", (
        output(job)
    )
    attempts = runs(events(job))
    assert len(attempts) == 2, output(job)
    assert_resumed(attempts[1], saved_before)
    # Both attempts' lines are in the one output file (--open-mode=append).
    assert output(job).count('"event": "start"') == 2


def test_no_requeue_is_written_as_slurm_reads_it(cluster: dict[str, str], tmp_path: Path) -> None:
    job = write_job(tmp_path, "--no-requeue")
    job_id = sbatch(job, cluster)
    shown = subprocess.run(
        ["scontrol", "show", "job", job_id], env=cluster, capture_output=True, text=True, timeout=10
    ).stdout
    assert "Requeue=0" in shown
    slurm_cluster.wait_for(job_id, cluster, {"COMPLETED", "FAILED", "CANCELLED"})
    assert os.path.exists(tmp_path / "ckpt" / "phase1")


def test_two_nodes_train_together_and_one_of_them_writes_the_shared_checkpoints(tmp_path: Path) -> None:
    why = slurm_cluster.missing()
    if why:
        pytest.skip(why)
    job = write_job(tmp_path, hosts=2)
    assert "#SBATCH --nodes=2" in next(job.glob("*.sbatch")).read_text()
    with slurm_cluster.cluster(2) as env:
        job_id = sbatch(job, env)
        state = slurm_cluster.wait_for(job_id, env, {"COMPLETED", "FAILED", "CANCELLED"})
        assert state == "COMPLETED", output(job)
    [only] = runs(events(job))
    assert only[0]["world_size"] == 2 and only[-1]["event"] == "done" and only[-1]["step"] == STEPS
    # One writer on the shared folder: every checkpoint reported once, and each file matches its manifest.
    saved = [e["step"] for e in only if e["event"] == "checkpoint"]
    assert saved == sorted(set(saved)) and saved[-1] == STEPS
    folder = tmp_path / "ckpt" / "phase1"
    manifest = json.loads((folder / f"step-{STEPS:08d}.json").read_text())
    data = (folder / f"step-{STEPS:08d}.pt").read_bytes()
    assert hashlib.sha256(data).hexdigest() == manifest["sha256"] and len(data) == manifest["bytes"]


def test_a_job_for_nodes_the_flags_describe_trains_without_any_inventory(tmp_path: Path) -> None:
    """--nodes/--gpus-per-node instead of the lab: no inventory file at all, and Slurm takes the
    nodes, CPUs and memory the flags asked for (a --mem over a node's RealMemory would never run)."""
    why = slurm_cluster.missing()
    if why:
        pytest.skip(why)
    phases = tmp_path / "phases.yaml"
    phases.write_text(PHASES.replace("CKPT", str(tmp_path / "ckpt")))
    job = tmp_path / "job"
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", "-i", str(tmp_path / "no-such-inventory.yaml"), "train",
         "-f", str(phases), "--phase", "1", "--backend", "slurm", "--nodes", "2", "--gpus-per-node", "0",
         "--cpus-per-node", "1", "--memory-per-node", "256M", "-o", str(job)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    script = next(job.glob("*.sbatch")).read_text()
    for line in ("--nodes=2", "--cpus-per-task=1", "--mem=256M"):
        assert f"#SBATCH {line}\n" in script
    assert "--gres" not in script
    with slurm_cluster.cluster(2) as env:
        job_id = sbatch(job, env)
        state = slurm_cluster.wait_for(job_id, env, {"COMPLETED", "FAILED", "CANCELLED"})
        assert state == "COMPLETED", output(job)
        shown = subprocess.run(
            ["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True, timeout=10
        ).stdout
    assert "NumNodes=2" in shown and "MinMemoryNode=256M" in shown
    [only] = runs(events(job))
    assert only[0]["world_size"] == 2 and only[-1]["event"] == "done" and only[-1]["step"] == STEPS
