"""The one frame every command runs in (labctl.cli.runner) and the one table of commands (app.COMMANDS)."""

from __future__ import annotations

import json
from typing import Any, Optional

import pytest
import typer
from typer.testing import CliRunner

from labctl.cli.common import JsonOpt
from labctl.cli.runner import Outcome, run_command
from labctl.hosts.context import Context
from labctl.output.errors import HostError


class Pool:
    """Stands in for the ConnectionPool: counts how often the command closed it."""

    def __init__(self) -> None:
        self.closed = 0

    def close_all(self) -> None:
        self.closed += 1


def _app(work: Any) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def cmd(ctx: typer.Context, json_out: JsonOpt = False) -> None:
        run_command(ctx, work, json_out=json_out)

    @app.command()
    def other() -> None:  # two commands, so `cmd` is a sub-command as labctl's are
        pass

    return app


def _outcome_work(pool: Pool, code: int, shown: list[str]) -> Any:
    def work(c: Context) -> Outcome:
        c._pool = pool  # type: ignore[assignment]
        return Outcome({"answer": 42}, lambda: shown.append("rendered"), code)

    return work


@pytest.mark.parametrize("code", [0, 1, 3])
def test_json_and_the_renderer_exit_with_the_same_code_and_the_pool_is_closed(code: int) -> None:
    runner = CliRunner()
    for args in (["cmd"], ["cmd", "--json"]):
        pool, shown = Pool(), list[str]()
        res = runner.invoke(_app(_outcome_work(pool, code, shown)), args)
        assert res.exit_code == code, res.output
        assert pool.closed == 1
        if "--json" in args:
            assert json.loads(res.stdout) == {"answer": 42}
            assert shown == []
        else:
            assert shown == ["rendered"]
            assert res.stdout == ""


@pytest.mark.parametrize("error", [HostError("m5 is down.", "Start it."), KeyboardInterrupt()])
def test_the_pool_is_closed_when_the_work_raises_and_the_error_passes_through(error: BaseException) -> None:
    pool = Pool()

    def work(c: Context) -> Optional[Outcome]:
        c._pool = pool  # type: ignore[assignment]
        raise error

    app = _app(work)
    if isinstance(error, KeyboardInterrupt):
        res = CliRunner().invoke(app, ["cmd"])
        assert res.exit_code == 130  # typer's exit for Ctrl-C, as before
    else:
        res = CliRunner().invoke(app, ["cmd", "--json"])
        assert res.exception is error  # labctl.cli.app.main reports it, not the runner
        assert res.stdout == ""
    assert pool.closed == 1


def test_work_that_showed_everything_itself_exits_0_and_prints_nothing_more() -> None:
    pool = Pool()

    def work(c: Context) -> Optional[Outcome]:
        c._pool = pool  # type: ignore[assignment]
        return None

    for args in (["cmd"], ["cmd", "--json"]):
        pool.closed = 0
        res = CliRunner().invoke(_app(work), args)
        assert (res.exit_code, res.stdout, pool.closed) == (0, "", 1)


def test_every_command_of_the_table_loads_and_the_app_has_exactly_those() -> None:
    from labctl.agent.core.registry import load
    from labctl.cli.app import COMMANDS, app

    for name, entry in COMMANDS.items():
        target = load(entry)
        assert isinstance(target, (typer.Typer, typer.models.CommandInfo)) or callable(target), name
    root = typer.main.get_command(app)
    groups = [n for n, e in COMMANDS.items() if isinstance(load(e), typer.Typer)]
    # The help lists the commands, then the groups, each in the table's order.
    assert list(root.commands) == [n for n in COMMANDS if n not in groups] + groups  # type: ignore[attr-defined]


def test_a_command_module_runs_its_commands_through_the_runner() -> None:
    # The frame lives in one place: no command module builds and closes a Context itself.
    import re
    from pathlib import Path

    import labctl.cli

    folder = Path(labctl.cli.__file__).parent
    own = list(folder.glob("*_cmd.py"))
    assert own
    for path in own:
        text = path.read_text()
        assert not re.search(r"\bmake_context\(|\bc\.close\(\)", text), path.name
