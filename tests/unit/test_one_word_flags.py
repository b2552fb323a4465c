"""One word per idea (issue 40): `--check` is "compute and show, change nothing" everywhere.

Commands that said `--dry-run` before still take it for one release, hidden from --help and
parsed to exactly what `--check` parses to.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from labctl.cli.app import app

# Every command whose "show, change nothing" flag is --check, and those that called it --dry-run.
TAKES_CHECK = {
    "provision",
    "ckpt pull",
    "ckpt backup",
    "cron install",
    "cron remove",
    "train",
    "orchestra start",
    "orchestra stop",
    "rotate",
}
WAS_DRY_RUN = {"ckpt backup", "train", "orchestra start", "orchestra stop", "rotate"}


def _commands() -> Iterator[tuple[str, Any]]:
    def walk(cmd: Any, path: list[str]) -> Iterator[tuple[str, Any]]:
        yield " ".join(path), cmd
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            yield from walk(sub, [*path, name])

    yield from walk(typer.main.get_command(app), [])


COMMANDS = dict(_commands())


def _named(cmd: Any, flag: str) -> list[Any]:
    return [p for p in cmd.params if flag in getattr(p, "opts", ())]


def _help(path: str) -> str:
    res = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert res.exit_code == 0, res.output
    return res.output


def test_the_commands_that_take_check_are_the_ones_listed() -> None:
    assert {path for path, cmd in COMMANDS.items() if _named(cmd, "--check")} == TAKES_CHECK
    assert {path for path, cmd in COMMANDS.items() if _named(cmd, "--dry-run")} == WAS_DRY_RUN


@pytest.mark.parametrize("path", sorted(TAKES_CHECK))
def test_help_shows_check_and_not_dry_run(path: str) -> None:
    shown = _help(path)
    assert "--check" in shown
    assert "--dry-run" not in shown


def test_no_command_help_mentions_dry_run() -> None:
    mentions = [path or "labctl" for path in COMMANDS if "--dry-run" in _help(path)]
    assert mentions == []


def test_every_dry_run_left_is_a_hidden_alias_beside_check() -> None:
    for path in WAS_DRY_RUN:
        [alias] = _named(COMMANDS[path], "--dry-run")
        assert alias.hidden and not alias.expose_value, path
        assert len(_named(COMMANDS[path], "--check")) == 1, path


def _params(path: str, args: list[str]) -> dict[str, Any]:
    cmd = COMMANDS[path]
    with cmd.make_context(path.split()[-1], list(args)) as ctx:
        return dict(ctx.params)


@pytest.mark.parametrize("path", sorted(WAS_DRY_RUN))
def test_dry_run_parses_exactly_as_check(path: str) -> None:
    [check] = _named(COMMANDS[path], "--check")
    by_old_name, by_new_name, neither = (_params(path, a) for a in (["--dry-run"], ["--check"], []))
    assert by_old_name == by_new_name
    assert by_new_name[check.name] is True and neither[check.name] is False
    assert {k: v for k, v in neither.items() if k != check.name} == {
        k: v for k, v in by_new_name.items() if k != check.name
    }
    # Both names together, either order, are still one "check".
    assert _params(path, ["--check", "--dry-run"]) == by_new_name == _params(path, ["--dry-run", "--check"])


@pytest.mark.parametrize(("flag", "check"), [(["--dry-run"], True), (["--check"], True), ([], False)])
@pytest.mark.parametrize(("argv", "kind"), [(["rotate"], "rotate"), (["orchestra", "stop"], "stop")])
def test_the_rotation_is_told_to_change_nothing_by_either_name(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], kind: str, flag: list[str], check: bool
) -> None:
    seen: list[tuple[str, bool]] = []
    monkeypatch.setattr(
        "labctl.cli.orchestra_cmd.run_rotation", lambda ctx, k, file, told, *rest: seen.append((k, told))
    )
    res = CliRunner().invoke(app, [*argv, *flag])
    assert res.exit_code == 0, res.output
    assert seen == [(kind, check)]
