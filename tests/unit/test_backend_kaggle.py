"""`labctl train --backend kaggle` (train/backends/kaggle.py, cloud/): the kernel folder's metadata,
and its script run for real on this machine (LABCTL_KAGGLE_ROOT standing in for /kaggle, torch from
the venv): a session trains and checkpoints into working/, and the next one, with the first one's
output attached as its input, resumes there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.train import settings as trainer_settings

INVENTORY = """\
lab: t
defaults: {user: root, ssh_key: keys/id}
hosts:
  m5: {address: 10.0.0.1, roles: [train]}
"""
# A model small enough that a session takes seconds on a CPU.
PHASES = """\
name: tiny
defaults:
  steps: 6
  seq_len: 16
  model: {vocab: 256, d_model: 32, n_layers: 1, n_heads: 2, d_ff: 64}
  checkpoint_every: 3
  log_every: 1
phases:
  1: {batch_size_per_gpu: 4, mixed_precision: false, instance_type: ml.g4dn.xlarge}
"""


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id").write_text("not really a key")
    (tmp_path / "phases.yaml").write_text(PHASES)
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    return inv


def labctl_train(inv: Path, *args: str) -> tuple[int, str]:
    """The real CLI (its error rendering and exit codes included), phase 1 of the tiny phases file."""
    argv = ["-i", str(inv), "train", "-f", str(inv.parent / "phases.yaml"), "--phase", "1", *args]
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=inv.parent,
        env={**os.environ, "COLUMNS": "1000"},  # one command on one line, as a person copies it
    )
    return proc.returncode, proc.stdout + proc.stderr


def write_session(inv: Path, out: Path, *args: str) -> dict[str, Any]:
    rc, output = labctl_train(inv, "--backend", "kaggle", "-o", str(out), *args)
    assert rc == 0, output
    meta: dict[str, Any] = json.loads((out / "kernel-metadata.json").read_text())
    return meta


def run_session(script: Path, root: Path, **env: str) -> tuple[int, list[dict[str, Any]], str]:
    """The kernel's code file alone, as Kaggle runs it: no labctl on the path, /kaggle at `root`."""
    pytest.importorskip("torch")
    alone = root / "code" / script.name
    alone.parent.mkdir(parents=True)
    shutil.copy(script, alone)  # without the bundle beside it: the script must carry the trainer
    (root / "input").mkdir(exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LABCTL_RUN_ID")}
    proc = subprocess.run(
        [sys.executable, str(alone)],
        cwd=alone.parent,
        env={**clean, "LABCTL_KAGGLE_ROOT": str(root), "LABCTL_TRAIN_DEVICE": "cpu", **env},
        capture_output=True,
        text=True,
        timeout=240,
    )
    events = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return proc.returncode, events, proc.stdout + proc.stderr


def test_the_kernel_metadata_carries_what_kaggle_needs(lab: Path, tmp_path: Path) -> None:
    meta = write_session(
        lab, tmp_path / "s2", "--kaggle-id", "alice/cet-p1-s2", "--resume-from", "alice/cet-p1-s1"
    )
    assert meta["id"] == "alice/cet-p1-s2" and meta["title"] == "cet-p1-s2"
    assert (meta["language"], meta["kernel_type"]) == ("python", "script")
    assert meta["enable_gpu"] is True and meta["enable_internet"] is False and meta["is_private"] is True
    assert meta["kernel_sources"] == ["alice/cet-p1-s1"]
    code = tmp_path / "s2" / meta["code_file"]
    assert code.is_file() and sorted(p.name for p in code.parent.iterdir()) == sorted(
        ["kernel-metadata.json", code.name, next(p.name for p in code.parent.glob("labctl-agent-*.pyz"))]
    )
    # The session's time: Kaggle's 12 h less the margin, as the trainer's time_limit.
    text = code.read_text()
    config = json.loads(eval(text.split("CONFIG = json.loads(", 1)[1].split(")\n", 1)[0]))
    assert config["time_limit_s"] == 12 * 3600 - 30 * 60 and config["resume_from"] == "alice/cet-p1-s1"
    first = write_session(lab, tmp_path / "s1", "--kaggle-id", "alice/cet-p1-s1")
    assert first["kernel_sources"] == []


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ((), "--backend kaggle needs --kaggle-id"),
        (("--kaggle-id", "not-an-id"), "--kaggle-id 'not-an-id' is not a Kaggle kernel id"),
        (("--kaggle-id", "alice/cet-p1-s1", "--resume-from", "alice/x"), "--resume-from 'alice/x' is not"),
        (("--kaggle-id", "alice/cet-p1-s1", "--resume-from", "alice/cet-p1-s1"), "this session's own id"),
        (
            ("--kaggle-id", "alice/cet-p1-s1", "--time-limit", "12h1m"),
            "--time-limit 12h1m is over Kaggle's 12h",
        ),
        (("--kaggle-id", "alice/cet-p1-s1", "--time-limit", "soon"), "'soon' is not a duration"),
        (
            ("--kaggle-id", "alice/cet-p1-s1", "--role-arn", "arn:aws:iam::123456789012:role/x"),
            "--role-arn applies to --backend sagemaker, not kaggle",
        ),
        (("--kaggle-id", "alice/cet-p1-s1", "--dry-run"), "--check does not apply to --backend kaggle"),
    ],
)
def test_a_broken_kaggle_session_is_refused_naming_the_flag(
    lab: Path, tmp_path: Path, args: tuple[str, ...], named: str
) -> None:
    rc, output = labctl_train(lab, "--backend", "kaggle", "-o", str(tmp_path / "out"), *args)
    assert rc == 2, output
    assert named in output and "Traceback" not in output
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_the_script_trains_and_the_next_session_resumes_from_its_output(lab: Path, tmp_path: Path) -> None:
    write_session(lab, tmp_path / "s1", "--kaggle-id", "alice/cet-p1-s1", "--time-limit", "5m")
    rc, events, out = run_session(tmp_path / "s1" / "train-phase1.py", tmp_path / "k1")
    assert rc == 0, out
    start = next(e for e in events if e["event"] == "start")
    assert start["resumed_from"] is None and events[-1]["event"] == "done" and events[-1]["step"] == 6
    ckpts = tmp_path / "k1" / "working" / "checkpoints" / "phase1"
    assert (ckpts / "step-00000006.pt").is_file()
    settings = json.loads((tmp_path / "k1" / "working" / "labctl-settings.json").read_text())
    assert settings["checkpoint_dir"] == str(ckpts) and 0 < settings["time_limit"] <= 300 - 30

    # Session 2 (four more steps): Kaggle mounts session 1's output at /kaggle/input/SLUG.
    write_session(
        lab,
        tmp_path / "s2",
        "--kaggle-id",
        "alice/cet-p1-s2",
        "--resume-from",
        "alice/cet-p1-s1",
        "--set",
        "steps=10",
    )
    (tmp_path / "k2" / "input").mkdir(parents=True)
    shutil.copytree(tmp_path / "k1" / "working", tmp_path / "k2" / "input" / "cet-p1-s1")
    rc, events2, out = run_session(tmp_path / "s2" / "train-phase1.py", tmp_path / "k2")
    assert rc == 0, out
    start = next(e for e in events2 if e["event"] == "start")
    assert start["resumed_from"] == 6, out
    steps = [e["step"] for e in events2 if e["event"] == "step"]
    assert steps == [7, 8, 9, 10] and events2[-1]["event"] == "done"
    # The loss goes on from where session 1 left it, not from the initial loss.
    last1 = [e["loss"] for e in events if e["event"] == "step"][-1]
    first2 = next(e["loss"] for e in events2 if e["event"] == "step")
    assert abs(first2 - last1) < 0.1
    assert (tmp_path / "k2" / "working" / "checkpoints" / "phase1" / "step-00000010.pt").is_file()


def test_a_session_without_the_previous_output_attached_trains_nothing(lab: Path, tmp_path: Path) -> None:
    write_session(lab, tmp_path / "s2", "--kaggle-id", "alice/cet-p1-s2", "--resume-from", "alice/cet-p1-s1")
    rc, events, out = run_session(tmp_path / "s2" / "train-phase1.py", tmp_path / "k")
    assert rc == 2 and events == []
    assert "no checkpoints of alice/cet-p1-s1" in out and "kernel_sources" in out


@pytest.mark.skipif(
    not hasattr(trainer_settings, "EXIT_PAUSED"), reason="needs part A's trainer time_limit (issue 16 item 1)"
)
def test_a_session_pauses_at_its_time_limit_and_the_next_resumes(lab: Path, tmp_path: Path) -> None:
    big = ("--set", "steps=100000", "--set", "checkpoint_every=100000")
    write_session(lab, tmp_path / "s1", "--kaggle-id", "alice/cet-p1-s1", "--time-limit", "10s", *big)
    rc, events, out = run_session(tmp_path / "s1" / "train-phase1.py", tmp_path / "k1")
    assert rc == 75, out
    paused = events[-1]
    assert paused["event"] == "paused" and paused["reason"] == "time_limit", out
    step = paused["resume_step"]
    write_session(
        lab,
        tmp_path / "s2",
        "--kaggle-id",
        "alice/cet-p1-s2",
        "--resume-from",
        "alice/cet-p1-s1",
        "--time-limit",
        "10s",
        *big,
    )
    (tmp_path / "k2" / "input").mkdir(parents=True)
    shutil.copytree(tmp_path / "k1" / "working", tmp_path / "k2" / "input" / "cet-p1-s1")
    rc, events2, out = run_session(tmp_path / "s2" / "train-phase1.py", tmp_path / "k2")
    assert rc == 75, out
    assert next(e for e in events2 if e["event"] == "start")["resumed_from"] == step


def test_a_users_script_runs_with_the_time_limit_and_checkpoint_folder(lab: Path, tmp_path: Path) -> None:
    script = tmp_path / "mine.py"
    script.write_text(
        textwrap.dedent(
            """\
            import json, os, sys
            print(json.dumps({"argv": sys.argv[1:], "limit": os.environ["LABCTL_TIME_LIMIT_S"],
                              "ckpt": os.environ["LABCTL_CHECKPOINT_DIR"]}))
            """
        )
    )
    rc, output = labctl_train(
        lab, "--backend", "kaggle", "-o", str(tmp_path / "s"), "--kaggle-id", "alice/mine-1",
        "--script", str(script), "--script-args", "--lr 'a b'", "--time-limit", "1h",
    )  # fmt: skip
    assert rc == 0, output
    rc, events, out = run_session(tmp_path / "s" / "train-phase1.py", tmp_path / "k")
    assert rc == 0, out
    (seen,) = events
    assert seen["argv"] == ["--lr", "a b"] and 0 < int(seen["limit"]) <= 3600 - 360
    assert seen["ckpt"] == str(tmp_path / "k" / "working" / "checkpoints" / "phase1")


@pytest.mark.parametrize("mount", ["cet-p1-s1", "notebooks/alice/cet-p1-s1"])
def test_the_previous_sessions_checkpoints_are_found_where_kaggle_mounts_them(
    tmp_path: Path, mount: str
) -> None:
    from labctl.train.backends.cloud.session import copy_previous, find_previous

    src = tmp_path / "input" / mount / "checkpoints" / "phase1"
    src.mkdir(parents=True)
    for name in ("step-00000003.pt", "step-00000003.json", ".step-00000006.pt.x.tmp"):
        (src / name).write_bytes(name.encode())
    found = find_previous(str(tmp_path / "input"), "cet-p1-s1", "checkpoints/phase1")
    assert found == str(src)
    assert find_previous(str(tmp_path / "input"), "cet-p1-s9", "checkpoints/phase1") is None
    dst = tmp_path / "working"
    dst.mkdir()
    (dst / "step-00000003.json").write_text("already here")
    # The previous session's unfinished write stays behind; a file already here is not overwritten.
    assert copy_previous(found, str(dst)) == ["step-00000003.pt"]
    assert sorted(p.name for p in dst.iterdir()) == ["step-00000003.json", "step-00000003.pt"]
    assert (dst / "step-00000003.json").read_text() == "already here"


def test_a_session_is_written_beside_an_inventory_it_never_parses(lab: Path, tmp_path: Path) -> None:
    """A cloud session runs on the platform's machine and needs nothing of the lab's hosts: an
    inventory being edited (here, not YAML at all) stops nothing."""
    lab.write_text("hosts: [unclosed\n")
    meta = write_session(lab, tmp_path / "out", "--kaggle-id", "alice/cet-p1-s1")
    assert meta["id"] == "alice/cet-p1-s1"
    assert (tmp_path / "out" / meta["code_file"]).is_file()
