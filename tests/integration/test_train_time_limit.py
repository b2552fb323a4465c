"""`labctl train --time-limit` on the simulated lab: a real 2-host gloo run that pauses, and resumes.

The pause comes from the clock, so nothing here asserts when it happens, only what a paused
run leaves: one common step N, a checkpoint of N on every host, exit 75 with the resumable
step, `train status` saying paused, and a second run that starts at N with the loss carried on.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TRAIN_TINY, labctl

pytestmark = pytest.mark.integration

TINY = TRAIN_TINY
# Long enough for torchrun, torch's import and the rendezvous on both hosts of a 2-core machine
# that another xdist worker's lab also loads, and then for 2 steps or more; counted from
# torchrun's start on the first host.
LIMIT_S = 45


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_time_boxed_two_host_run_pauses_at_one_step_and_the_next_run_resumes_there(lab: Any) -> None:
    inv = str(lab.inventory_path)
    ckpt = f"/var/lib/labctl/train/test-tl-{uuid.uuid4().hex[:8]}"
    common = [
        "-i", inv, "train", "--phase", "1", "--limit", "m5,irina", "--device", "cpu", "--python", sys.executable,
        *TINY, "--set", f"checkpoint_dir={ckpt}", "--set", "checkpoint_every=100000",
    ]  # fmt: skip
    runs = Path(inv).parent / ".labctl" / "runs"
    before = {p.name for p in runs.glob("*")} if runs.exists() else set()
    first = labctl(*common, "--set", "steps=100000", "--time-limit", f"{LIMIT_S}s", timeout=300)
    assert first.returncode == 75, first.stdout + first.stderr
    (run_id,) = {p.name for p in runs.glob("*")} - before
    got = events(runs / run_id / "metrics.jsonl")
    assert [e["event"] for e in got if e["event"] in ("done", "paused")] == ["paused"]
    paused = got[-1]
    n = paused["resume_step"]
    assert paused["event"] == "paused" and paused["reason"] == "time_limit" and paused["step"] == n > 0
    assert paused["time_limit"] == LIMIT_S and paused["checkpoint"] == f"{ckpt}/step-{n:08d}.pt"
    text = " ".join((first.stdout + first.stderr).split())
    assert f"time limit reached, resumable at step {n}: run the same command again to resume" in text

    # Every host's local rank 0 wrote the checkpoint of the same step, and nothing newer.
    ls = labctl("-i", inv, "--json", "exec", "-l", "m5,irina", "--", f"ls {ckpt}")
    listed = {r["host"]: r["stdout"].split() for r in json.loads(ls.stdout)["results"]}
    assert listed == {h: [f"step-{n:08d}.json", f"step-{n:08d}.pt"] for h in ("m5", "irina")}, listed

    status = labctl("-i", inv, "--json", "train", "status", run_id)
    row = json.loads(status.stdout)["runs"][0]
    assert row["state"] == "paused" and row["resume_step"] == n
    shown = labctl("-i", inv, "train", "status", run_id)
    assert "paused" in shown.stdout + shown.stderr

    # The same folder again: it starts at n and the loss goes on from where it was.
    second = labctl("--json", *common, "--set", f"steps={n + 5}", timeout=300)
    assert second.returncode == 0, second.stderr
    out = json.loads(second.stdout)
    assert out["state"] == "finished" and out["resumed_from"] == [n] and out["last_step"] == n + 5
    initial = next(e["loss"] for e in got if e["event"] == "step")
    assert paused["loss"] < initial, got  # it had learnt something before the pause
    # Nearer where the first run stopped than where it began: carried on, not started over.
    assert abs(out["first_loss"] - paused["loss"]) < abs(out["first_loss"] - initial), (initial, paused, out)
    labctl("-i", inv, "exec", "-l", "m5,irina", "--", f"rm -rf {ckpt}")
