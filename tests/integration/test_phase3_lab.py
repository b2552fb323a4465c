"""`labctl train --phase 3` on the simulated lab, every part real: m5 trains the CET on its CPU
against 3 warm model servers (m5, CPU) and runs their code in irina's sandbox service
(this machine's Docker), and a `labctl rotate` in the middle of the run costs it no step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ON_THIS_MACHINE, REPO, labctl, m5_cache, orchestra_lab, run_json, sh

pytestmark = [pytest.mark.integration, ON_THIS_MACHINE]
LIBRARY = ["p3-a", "p3-b", "p3-c", "p3-d"]
CKPT = "/var/lib/labctl/train/p3-test"
STEPS = 8
# A CET small enough for two cores shared with three model servers and the sandbox.
SETS = [
    f"steps={STEPS}", "batch_size_per_gpu=4", "seq_len=288", "model.d_model=32", "model.n_layers=1",
    "model.n_heads=2", "model.d_ff=64", "log_every=1", "checkpoint_every=100", f"checkpoint_dir={CKPT}",
    "rl.answer_tokens=16", "rl.tasks_per_step=1",
]  # fmt: skip


def train_argv(inv: Path, *extra: str) -> list[str]:
    argv = [
        "-i",
        str(inv),
        "train",
        "--phase",
        "3",
        "--limit",
        "m5",
        "--device",
        "cpu",
        "--python",
        sys.executable,
    ]
    for s in SETS:
        argv += ["--set", s]
    return argv + list(extra)


@pytest.fixture(scope="module")
def p3(lab: Any, docker_images: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The lab with m5's cache mounted, four 6 MB models on irina (a context of 512 bytes: a
    task's prompt fits), 3 warm on m5, and irina serving python sandboxes."""
    inv = lab.inventory_path
    with m5_cache(lab):
        for name in LIBRARY:
            argv = [
                "-i",
                str(inv),
                "bench",
                "make-model",
                "--size-gb",
                "0.006",
                "--name",
                name,
                "--host",
                "irina",
            ]
            labctl(*argv, check=True)

        def python_sandbox(doc: dict[str, Any]) -> None:
            doc["hosts"]["irina"]["sandbox"] = {"languages": ["python"], "pool": 2}

        copy = orchestra_lab(
            inv,
            tmp_path_factory.mktemp("p3"),
            {
                "hosts": "m5",
                "warm": 3,
                "rotate": 1,
                "every": "4h",
                "server": {
                    "python": sys.executable,
                    "start_timeout": 180,
                    "stop_grace": 10,
                    "drain_s": 1,
                },
                "models": [{"name": n, "size_gb": 0.006} for n in LIBRARY],
            },
            python_sandbox,
        )
        try:
            yield copy
        finally:
            labctl("-i", str(copy), "orchestra", "stop", timeout=120)
            labctl("-i", str(copy), "sandbox", "serve", "--stop", timeout=120)
            sh(inv, "m5", f"rm -rf /var/lib/labctl/orchestra {CKPT}")
            sh(inv, "irina", "rm -rf " + " ".join(f"/srv/models/{n}" for n in LIBRARY))


def metrics(inv: Path) -> list[dict[str, Any]]:
    """Rank 0's events of the newest run, as the controller records them beside the inventory."""
    files = sorted((inv.parent / ".labctl" / "runs").glob("*/metrics.jsonl"), key=lambda p: p.stat().st_mtime)
    if not files:
        return []
    return [json.loads(line) for line in files[-1].read_text().splitlines() if line.strip()]


# Every process of the run on m5 (they all carry LABCTL_RUN_ID), sent a signal.
SIGNAL_RUN = "for p in /proc/[0-9]*; do grep -qz '^LABCTL_RUN_ID=' $p/environ 2>/dev/null && kill -{sig} ${{p#/proc/}}; done; true"


def rotate_while_training(p3: Path) -> dict[str, Any]:
    """`labctl rotate` while the run trains; its JSON answer. Should the run come within three steps
    of its end before the rotation is done (a loaded machine loads the joiner slowly), the run is
    held (SIGSTOP) until it is, so that steps after the rotation exist to show the new warm set."""
    rotating = subprocess.Popen(
        [sys.executable, "-m", "labctl", "-i", str(p3), "--json", "rotate"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    held = False
    try:
        deadline = time.monotonic() + 400
        while rotating.poll() is None:
            assert time.monotonic() < deadline, "the rotation never ended"
            done = max((e["step"] for e in metrics(p3) if e.get("event") == "step"), default=0)
            if not held and done >= STEPS - 3:
                sh(p3, "m5", SIGNAL_RUN.format(sig="STOP"))
                held = True
            time.sleep(0.3)
    finally:
        if held:
            sh(p3, "m5", SIGNAL_RUN.format(sig="CONT"))
        if rotating.poll() is None:
            rotating.kill()
    out, err = rotating.communicate()
    assert rotating.returncode == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


def test_phase3_waits_for_the_sandbox_then_trains_through_a_rotation(p3: Path) -> None:
    rc, doc = run_json(p3, "orchestra", "start", timeout=400)
    assert rc == 0, doc
    # The orchestra is warm but no sandbox serves the trainers: the preflight says what to run.
    proc = labctl(*train_argv(p3, "--dry-run"), timeout=200)
    assert proc.returncode == 1 and "labctl sandbox serve" in proc.stderr, proc.stderr
    rc, served = run_json(p3, "sandbox", "serve", timeout=300)
    assert rc == 0 and served["trainers"] == {"m5": "ok"}, served
    proc = labctl(*train_argv(p3, "--dry-run"), timeout=200)
    assert proc.returncode == 0, proc.stderr

    sh(p3, "m5", f"rm -rf {CKPT}")
    run = subprocess.Popen(
        [sys.executable, "-m", "labctl", "--json", *train_argv(p3)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 400
        while not any(e.get("event") == "step" and e["step"] >= 2 for e in metrics(p3)):
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "the run never reached step 2"
            time.sleep(1)
        rotated = rotate_while_training(p3)
        assert len(rotated["joined"]) == 1 and len(rotated["left"]) == 1, rotated
        out, err = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 0, err
    assert json.loads(out)["state"] == "finished"
    events = metrics(p3)
    steps = [e for e in events if e["event"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, STEPS + 1)) and events[-1]["event"] == "done"
    # Every step judged its answers (random tiny models: reward 0.0, never missing) and lost none.
    assert all(e["reward"] is not None and e["answers_failed"] == 0 and e["executions"] > 0 for e in steps), (
        steps
    )
    joined, left = rotated["joined"][0]["model"], rotated["left"][0]["model"]
    assert joined in steps[-1]["orchestra_ms"] and left not in steps[-1]["orchestra_ms"], steps[-1]
    assert len(steps[0]["orchestra_ms"]) == 3 and left in steps[0]["orchestra_ms"]


def test_bench_phase3_measures_the_cycle_and_the_sandbox_service(p3: Path) -> None:
    """Runs after the test above (the warm set and the service are up): two of the three figures
    (the third, a run through a rotation, is what the test above checks step by step)."""
    argv = [
        "bench",
        "phase3",
        "--only",
        "cycle,sandbox",
        "--rounds",
        "1",
        "--programs",
        "4",
        "--batches",
        "1",
    ]
    rc, doc = run_json(p3, *argv, timeout=900)
    assert rc == 0, doc
    assert [r["k"] for r in doc["cycle"]] == [1, 2, 3] and "training" not in doc
    assert all(r["at_once_s"] > 0 and r["one_after_another_s"] >= r["slowest_alone_s"] for r in doc["cycle"])
    sb = doc["sandbox"]
    # The tasks' reference programs pass every test through the service; the peers ran without error.
    assert sb["host"] == "irina" and sb["service"]["failed"] == 0 and sb["service"]["exec_per_s"] > 0
    assert (
        sb["docker_run"]["errors"] == 0 and sb["pool"]["errors"] == 0 and sb["docker_run"]["exec_per_s"] > 0
    )
