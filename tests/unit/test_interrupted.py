"""What labctl says after Ctrl-C: the command it interrupted and how that command carries on."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.cli import interrupted
from labctl.cli.interrupted import command_words, message
from labctl.train.results import Attached
from labctl.train.spec import LaunchSpec


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["-i", "inv.yaml", "--json", "cache", "sync", "m", "--host", "m5"], "cache sync"),
        (["provision", "--tags", "cron"], "provision"),
        (["train", "--phase", "1"], "train"),
        (["--inventory", "x.yaml", "exec", "-l", "m5", "--", "sleep", "1"], "exec"),
        (["-v", "sim", "up"], "sim up"),
    ],
)
def test_the_command_is_read_past_global_options(argv: list[str], words: str) -> None:
    assert command_words(argv) == words


@pytest.mark.parametrize(
    ("argv", "resume"),
    [
        (["cache", "sync", "m"], "the copy resumes"),
        (["provision"], "changes only what is still different"),
        (
            ["train", "--phase", "1"],
            "resumes from the newest checkpoint in its checkpoint_dir if one was written",
        ),
    ],
)
def test_each_command_says_how_it_carries_on(argv: list[str], resume: str) -> None:
    what, hint = message(argv)
    assert what.startswith(f"Interrupted (Ctrl-C): `labctl {command_words(argv)}`") and resume in hint


def test_a_windows_host_is_named_with_how_to_end_its_command() -> None:
    what, hint = message(["exec", "--", "sleep 9"], ["workstation"])
    assert "On workstation" in what and "may still be running" in what
    assert "labctl exec -l workstation -- taskkill /T /F /PID" in hint


def _interrupted_run(events: list[dict[str, object]]) -> Attached:
    spec = LaunchSpec("p1-x", 1, "gloo", (), "10.0.0.1", 29500, 3, {"checkpoint_dir": "/srv/ckpt/p1"})
    return Attached(spec, [], events, True, None, None, {}, Path("/tmp/p1-x"))


def test_ctrl_c_before_any_checkpoint_says_the_run_starts_again_from_step_1() -> None:
    run = _interrupted_run([{"event": "start", "resumed_from": None}, {"event": "step", "step": 5}])
    assert run.last_checkpoint is None
    assert (
        "No checkpoint was written: the same `labctl train` command starts again from step 1."
        in run.carry_on()
    )
    assert "resumes" not in run.carry_on()


def test_ctrl_c_names_the_newest_checkpoint_the_run_logged() -> None:
    run = _interrupted_run(
        [
            {"event": "start", "resumed_from": 40},
            {"event": "checkpoint", "step": 50, "path": "/srv/ckpt/p1/step-00000050.pt"},
            {"event": "checkpoint", "step": 60, "path": "/srv/ckpt/p1/step-00000060.pt"},
            {"event": "step", "step": 63, "loss": 2.5},
        ]
    )
    assert run.last_checkpoint == 60 and run.to_json()["last_checkpoint"] == 60
    assert "resumes from the checkpoint of step 60 in /srv/ckpt/p1." in run.carry_on()
    # Resumed and then stopped before writing one: the checkpoint it resumed from is still there.
    assert _interrupted_run([{"event": "start", "resumed_from": 40}]).last_checkpoint == 40


def test_what_train_says_after_ctrl_c_is_what_its_run_wrote(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interrupted, "_CARRY_ON", {})
    interrupted.carry_on(
        "train", "No checkpoint was written: the same `labctl train` command starts again from step 1."
    )
    _, hint = message(["-i", "lab.yaml", "train", "--phase", "1"])
    assert hint.startswith("No checkpoint was written") and "resumes" not in hint
    assert "changes only what is still different" in message(["provision"])[1]
