"""main() builds only the command argv names (labctl.cli.app.app_for): the same output as the
whole tree, without importing the other command modules."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from labctl.cli.app import COMMANDS, app_for, build_app, command_of
from tests.conftest import REPO


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["exec", "--json", "--", "true"], "exec"),
        (["-i", "lab.yaml", "--json", "-vv", "exec", "true"], "exec"),
        (["--inventory=lab.yaml", "cache", "ls"], "cache"),
        (["-ilab.yaml", "--verbose", "-v", "status"], "status"),
        (["--inventory", "lab.yaml", "sim", "--help"], "sim"),
        ([], None),
        (["--help"], None),
        (["-h", "exec"], None),
        (["--version"], None),
        (["--install-completion"], None),
        (["--show-completion", "bash"], None),
        (["exe"], None),
        (["-i"], None),
        (["-vi", "lab.yaml", "exec"], None),  # a cluster: unclear, so the whole tree
        (["--json=1", "exec"], None),
        (["--", "exec"], None),
    ],
)
def test_command_of_finds_the_command_after_the_root_options(argv: list[str], name: str | None) -> None:
    assert command_of(argv) == name


OUTPUT_CASES = [
    ["--help"],
    ["exec", "--help"],
    ["cache", "--help"],
    ["cache", "ls", "--help"],
    ["status", "--help"],
    ["-i", "x.yaml", "--json", "trust", "--help"],
    ["exe"],
    ["exec"],
    ["exec", "--no-such-option"],
    ["cache", "no-such-subcommand"],
    ["--version"],
    [],
]


@pytest.mark.parametrize("argv", OUTPUT_CASES, ids=lambda a: " ".join(a) or "(nothing)")
def test_app_for_an_argv_answers_byte_for_byte_as_the_whole_tree(argv: list[str]) -> None:
    runner = CliRunner()
    env = {"COLUMNS": "100", "TERM": "dumb"}
    narrow = runner.invoke(app_for(argv), argv, prog_name="labctl", env=env)
    whole = runner.invoke(build_app(), argv, prog_name="labctl", env=env)
    assert (narrow.exit_code, narrow.stdout, narrow.stderr) == (whole.exit_code, whole.stdout, whole.stderr)
    assert narrow.stdout or narrow.stderr


def test_app_for_a_named_command_has_only_that_command() -> None:
    import typer

    root = typer.main.get_command(app_for(["-i", "x.yaml", "exec", "true"]))
    assert list(root.commands) == ["exec"]  # type: ignore[attr-defined]
    whole = typer.main.get_command(app_for(["--help"]))
    assert set(whole.commands) == set(COMMANDS)  # type: ignore[attr-defined]


def test_main_for_exec_imports_no_other_command_module() -> None:
    code = (
        "import json, sys\n"
        "sys.argv = ['labctl', '-i', 'no-such-inventory.yaml', '--json', 'exec', '--', 'true']\n"
        "from labctl.cli.app import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.stdout.flush()\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('labctl.cli.') and m.endswith('_cmd'))))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO, env=None
    )
    loaded = json.loads(proc.stdout.splitlines()[-1])
    assert loaded == ["labctl.cli.exec_cmd"], proc.stdout + proc.stderr
