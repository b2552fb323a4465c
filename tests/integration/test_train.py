"""`labctl train` on the simulated lab: real torchrun over real SSH, gloo on CPUs.

The sim hosts share this machine's kernel and disk, so the controller's venv serves as their
torch interpreter (--python), and the tests can look for a run's processes in /proc
directly: every process of a run carries LABCTL_RUN_ID and LABCTL_HOST.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, TRAIN_TINY, labctl, run_json

pytestmark = pytest.mark.integration

TINY = TRAIN_TINY


def train_args(lab: Any, *extra: str, steps: int = 40, ckpt_every: int = 10) -> list[str]:
    ckpt = f"/var/lib/labctl/train/test-{uuid.uuid4().hex[:8]}"
    return [
        "-i", str(lab.inventory_path), "train", "--phase", "1", "--limit", "m5,irina", "--device", "cpu",
        "--python", sys.executable, *TINY, "--set", f"steps={steps}", "--set", f"checkpoint_every={ckpt_every}",
        "--set", f"checkpoint_dir={ckpt}", *extra,
    ]  # fmt: skip


def runs_dir(lab: Any) -> Path:
    return Path(lab.inventory_path).parent / ".labctl" / "runs"


def run_processes(run_id: str) -> list[tuple[int, str]]:
    """(pid, host) of every process on this machine (all sim hosts) that belongs to `run_id`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"LABCTL_RUN_ID={run_id}".encode() in env:
            host = next((e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"LABCTL_HOST=")), "?")
            found.append((int(name), host))
    return found


def workers(run_id: str, host: str) -> list[int]:
    """Trainer processes (torchrun's children, which have LOCAL_RANK) of `run_id` on `host`."""
    pids = []
    for pid, h in run_processes(run_id):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if h == host and any(e.startswith(b"LOCAL_RANK=") for e in env):
            pids.append(pid)
    return pids


def start(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "labctl", "--json", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def newest_run(lab: Any, before: set[str], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = {p.name for p in runs_dir(lab).glob("*")} - before if runs_dir(lab).exists() else set()
        if new:
            return new.pop()
        time.sleep(0.2)
    raise AssertionError("no run was recorded")


def wait_for_event(lab: Any, run_id: str, pred: Any, timeout: float = 120) -> dict[str, Any]:
    path = runs_dir(lab) / run_id / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            # The controller may be mid-write: only whole lines count.
            for line in path.read_text().split("\n")[:-1]:
                event = json.loads(line)
                if pred(event):
                    return event
        time.sleep(0.2)
    raise AssertionError(f"no matching event in {path} after {timeout} s")


def existing_runs(lab: Any) -> set[str]:
    return {p.name for p in runs_dir(lab).glob("*")} if runs_dir(lab).exists() else set()


def test_two_host_phase1_run_completes_and_loss_falls(lab: Any) -> None:
    args = train_args(lab, steps=40)
    proc = labctl("--json", *args, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["state"] == "finished" and out["done"] and out["world_size"] == 2
    assert [h["host"] for h in out["hosts"]] == ["m5", "irina"]
    assert out["last_step"] == 40
    assert out["last_loss"] < 0.8 * out["first_loss"], out
    assert out["remaining_processes"] == {} and run_processes(out["run_id"]) == []
    # Every rank's output is kept per host, beside the inventory.
    logs = Path(out["log_dir"])
    assert "[rank1]:" in (logs / "irina.log").read_text() and "[rank0]:" in (logs / "m5.log").read_text()
    # Each host's local rank 0 wrote its own verified checkpoint of the final step.
    ckpt = next(a.split("=", 1)[1] for a in args if a.startswith("checkpoint_dir="))
    ls = labctl("-i", str(lab.inventory_path), "--json", "exec", "-l", "m5,irina", "--", f"ls {ckpt}")
    for r in json.loads(ls.stdout)["results"]:
        assert "step-00000040.pt" in r["stdout"] and "step-00000040.json" in r["stdout"], r


def test_killed_worker_restarts_and_training_resumes_from_the_checkpoint(lab: Any) -> None:
    before = existing_runs(lab)
    proc = start(train_args(lab, "--set", "max_restarts=2", steps=120, ckpt_every=10))
    try:
        run_id = newest_run(lab, before)
        wait_for_event(lab, run_id, lambda e: e.get("event") == "checkpoint" and e["step"] >= 20)
        victims = workers(run_id, "irina")
        assert victims, run_processes(run_id)
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    out = json.loads(stdout)
    assert out["restarts"] >= 1 and out["done"] and out["last_step"] == 120
    events = [json.loads(x) for x in (runs_dir(lab) / run_id / "metrics.jsonl").read_text().splitlines()]
    starts = [e for e in events if e["event"] == "start"]
    assert starts[0]["resumed_from"] is None and len(starts) >= 2  # the workers started again
    resumed = starts[-1]["resumed_from"]
    assert resumed is not None and resumed >= 20
    after = [e["step"] for e in events[events.index(starts[-1]) :] if e["event"] == "step"]
    # The step count continues from the checkpoint; it does not start over.
    assert after and min(after) > resumed and after[-1] == 120
    assert run_processes(run_id) == []


def test_a_failed_host_stops_the_others_and_nothing_is_left(lab: Any) -> None:
    # No restarts allowed: irina's torchrun gives up when its worker dies, and labctl stops m5.
    before = existing_runs(lab)
    proc = start(train_args(lab, "--set", "max_restarts=0", steps=100000, ckpt_every=1000))
    try:
        run_id = newest_run(lab, before)
        wait_for_event(lab, run_id, lambda e: e.get("event") == "step")
        for pid in workers(run_id, "irina"):
            os.kill(pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr
    out = json.loads(stdout)
    by_host = {h["host"]: h for h in out["hosts"]}
    # Whichever torchrun gives up first (irina's, or m5's when gloo reports the lost peer first)
    # is the failed host, and labctl stops the other one.
    assert out["state"] == "failed" and out["failed_host"] in by_host
    assert by_host[out["failed_host"]]["status"] == "failed"
    assert {h["status"] for h in out["hosts"]} <= {"failed", "cancelled"}
    assert out["remaining_processes"] == {} and run_processes(run_id) == []


def test_a_fatal_trainer_error_ends_the_run_at_once_with_the_trainers_reason(lab: Any) -> None:
    # Every worker refuses its device: each would refuse it again, so torchrun must not restart one.
    before = existing_runs(lab)
    args = train_args(lab, "--set", "max_restarts=3", "--set", "env.LABCTL_TRAIN_DEVICE=cuda")
    started = time.monotonic()
    proc = labctl(*args, timeout=300)
    took = time.monotonic() - started
    reason = "LABCTL_TRAIN_DEVICE=cuda but torch sees no CUDA device"
    shown = proc.stdout + proc.stderr
    assert proc.returncode == 2, shown  # the trainer refused its input: fixed there, not on a host
    assert reason in " ".join(shown.split()) and "no restart" in shown, shown
    for noise in ("ChildFailedError", "To enable traceback", "error_file", "Traceback"):
        assert noise not in shown, shown
    run_id = newest_run(lab, before)
    record = json.loads((runs_dir(lab) / run_id / "run.json").read_text())
    assert record["state"] == "failed" and reason in record["reason"], record
    logs = "".join((runs_dir(lab) / run_id / f"{h}.log").read_text() for h in ("m5", "irina"))
    # One attempt: each worker said it once at most (labctl may stop a host before its worker
    # does), and torchrun never started one again (restarts would say it 4 times on a host).
    assert logs.count("error: " + reason) in (1, 2), logs
    assert took < 120 and run_processes(run_id) == []


def test_ctrl_c_leaves_no_process_of_the_run_on_any_host(lab: Any) -> None:
    before = existing_runs(lab)
    proc = start(train_args(lab, steps=100000, ckpt_every=1000))
    try:
        run_id = newest_run(lab, before)
        wait_for_event(lab, run_id, lambda e: e.get("event") == "step")
        assert {h for _, h in run_processes(run_id)} == {"m5", "irina"}
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert "Interrupted (Ctrl-C): `labctl train`" in stderr
    # checkpoint_every 1000 and the first step just logged: nothing to resume from, and it says so.
    text = " ".join(stderr.split())
    assert "No checkpoint was written: the same `labctl train` command starts again from step 1." in text
    assert "resumes" not in text
    out = json.loads(stdout)
    assert out["state"] == "interrupted" and out["remaining_processes"] == {}
    assert run_processes(run_id) == []


def test_preflight_refuses_a_gpu_the_torch_build_lacks_and_launches_nothing(lab: Any) -> None:
    # m5 declares a V100 (sm_70); this torch is a CPU build and no GPU answers in the sim.
    before = existing_runs(lab)
    proc = labctl(
        "-i", str(lab.inventory_path), "train", "--phase", "1", "--limit", "m5", "--python", sys.executable
    )
    assert proc.returncode == 1
    text = " ".join(proc.stderr.split())
    assert "nothing was launched" in text and "m5:" in text
    assert "CPU build" in text and "Tesla V100 (sm_70)" in text and "--device cpu" in text
    assert existing_runs(lab) == before
    # On the lab's hosts (each its own PID namespace): another test's lab may be training beside this one.
    rc, ps = run_json(lab.inventory_path, "exec", "--", "ps -eo args")
    assert rc == 0, ps
    listings = [r["stdout"] for r in ps["results"]]
    assert len(listings) == len(lab.hosts) and all("torch.distributed.run" not in out for out in listings)


def test_phase3_waits_for_the_orchestra_warm_set(lab: Any) -> None:
    inv = str(lab.inventory_path)
    args = [
        "-i", inv, "train", "--phase", "3", "--limit", "m5", "--device", "cpu", "--python", sys.executable,
        "--dry-run", *TINY, "--set", "requires_sandbox=false",  # the sandbox's part: test_phase3_lab.py
        "--set", "seq_len=288",  # the CET reads the longest task and its context: phase 3 needs 277
    ]  # fmt: skip
    refused = labctl(*args)
    assert (
        refused.returncode == 1
        and "warm set" in refused.stderr
        and "requires_orchestra=false" in refused.stderr
    )
    state = json.dumps({"models": [{"name": "llama-3.1-8b", "gpu": 1, "state": "loaded"}], "updated": 0})
    put = f"mkdir -p /var/lib/labctl/orchestra && echo '{state}' > /var/lib/labctl/orchestra/warm.json"
    endpoints = json.dumps(
        {"models": [{"name": "llama-3.1-8b", "model": "llama-3.1-8b", "base_url": "http://m5:8101/v1"}]}
    )
    told = f"echo '{endpoints}' > /var/lib/labctl/orchestra/endpoints.json"
    try:
        labctl("-i", inv, "exec", "-l", "m5", "--", put, check=True)
        # The warm set is up, but m5's trainers were never told where it answers.
        untold = labctl(*args)
        assert untold.returncode == 1 and "endpoints.json, and there is none" in untold.stderr, untold.stderr
        labctl("-i", inv, "exec", "-l", "m5", "--", told, check=True)
        ok = labctl(*args, "--json")
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["settings"]["phase"] == 3
    finally:
        labctl("-i", inv, "exec", "-l", "m5", "--", "rm -rf /var/lib/labctl/orchestra")


def test_dry_run_prints_each_hosts_exact_command(lab: Any) -> None:
    proc = labctl("--json", *train_args(lab, "--dry-run"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    m5, irina = out["hosts"]
    assert out["world_size"] == 2 and out["backend"] == "gloo"
    assert m5["argv"][1:3] == ["-m", "torch.distributed.run"] and m5["env"]["GLOO_SOCKET_IFNAME"] == "eth0"
    assert f"--rdzv-endpoint={out['rendezvous']}" in irina["argv"] and out["rendezvous"].startswith(
        lab.hosts["m5"]
    )
    assert run_processes(out["run_id"]) == [] and out["run_id"] not in existing_runs(lab)


def test_detached_run_has_status_and_stops_everywhere(lab: Any) -> None:
    inv = str(lab.inventory_path)
    started = labctl("--json", *train_args(lab, "--detach", steps=100000, ckpt_every=1000))
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]
    try:
        deadline = time.monotonic() + 90
        state: dict[str, Any] = {}
        while time.monotonic() < deadline:
            st = json.loads(labctl("-i", inv, "--json", "train", "status", run_id).stdout)["runs"][0]
            state = st["host_state"]
            # Rank 0 (m5) reports the steps; irina's ranks print none.
            if (state.get("m5", {}).get("last_event") or {}).get("event") == "step":
                break
            time.sleep(1)
        assert {h: s["state"] for h, s in state.items()} == {"m5": "running", "irina": "running"}
        assert state["m5"]["last_event"]["event"] == "step"
        stop = labctl("-i", inv, "--json", "train", "stop", run_id)
        assert stop.returncode == 0 and json.loads(stop.stdout)["remaining"] == {}
        assert run_processes(run_id) == []
        st = json.loads(labctl("-i", inv, "--json", "train", "status", run_id).stdout)["runs"][0]
        assert st["state"] == "stopped" and {s["state"] for s in st["host_state"].values()} == {"stopped"}
    finally:
        labctl("-i", inv, "train", "stop", run_id)


def test_slurm_and_k8s_backends_write_job_files_instead_of_launching(lab: Any, tmp_path: Path) -> None:
    # The claim is mounted where the run's chosen checkpoint folder lies.
    k8s = ("--pvc", "cet-ckpt", "--mount-path", "/var/lib/labctl/train")
    for backend, extra in (("slurm", ()), ("k8s", k8s), ("trainjob", k8s)):
        proc = labctl("--json", *train_args(lab, "--backend", backend, "-o", str(tmp_path / backend), *extra))
        assert proc.returncode == 0, proc.stderr
        files = [Path(f) for f in json.loads(proc.stdout)["files"]]
        assert files and all(f.exists() for f in files)
        assert run_processes(json.loads(proc.stdout)["run_id"]) == []
    sbatch = next((tmp_path / "slurm").glob("*.sbatch"))
    assert subprocess.run(["bash", "-n", str(sbatch)]).returncode == 0
    kinds = {d["kind"] for d in yaml.safe_load_all(next((tmp_path / "trainjob").glob("*.yaml")).read_text())}
    assert kinds == {"ConfigMap", "TrainJob"}
