"""What labctl says after Ctrl-C: the command it interrupted and how that command carries on."""

from __future__ import annotations

import pytest

from labctl.cli.interrupted import command_words, message


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
        (["train", "--phase", "1"], "resumes from the last checkpoint"),
    ],
)
def test_each_command_says_how_it_carries_on(argv: list[str], resume: str) -> None:
    what, hint = message(argv)
    assert what.startswith(f"Interrupted (Ctrl-C): `labctl {command_words(argv)}`") and resume in hint


def test_a_windows_host_is_named_with_how_to_end_its_command() -> None:
    what, hint = message(["exec", "--", "sleep 9"], ["workstation"])
    assert "On workstation" in what and "may still be running" in what
    assert "labctl exec -l workstation -- taskkill /T /F /PID" in hint
