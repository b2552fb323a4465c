"""What `labctl status` does on the controller around the fan-out (labctl/monitor/collect.py, render.py):
monitor.status's declared answer, which call_agent checks every answer against, is read on a thread
of its own while the hosts work instead of by the first answer; `--json` imports no table drawing."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from labctl.agent import commands
from labctl.monitor import collect as monitor_collect
from labctl.monitor.alerts import load_rules

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A process that has not read the declaration yet; the names `declared` is asked for."""
    monkeypatch.setattr(monitor_collect, "_declaration_read", threading.Event())
    asked: list[str] = []
    return asked


def test_the_declaration_is_read_while_the_hosts_work(
    fresh: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    read = threading.Event()

    def declared(name: str) -> Any:
        fresh.append(name)
        read.set()

    seen_during_fan_out: list[bool] = []

    def fan_out(*_args: Any, **_kwargs: Any) -> list[Any]:
        seen_during_fan_out.append(read.wait(5))
        return []

    monkeypatch.setattr(commands, "declared", declared)
    monkeypatch.setattr(monitor_collect, "fan_out", fan_out)
    rules = load_rules(None)
    assert monitor_collect.collect(None, [], rules) == []  # type: ignore[arg-type]
    assert seen_during_fan_out == [True] and fresh == ["monitor.status"]
    # Once a process: a --watch refresh does not read it again.
    read.clear()
    seen_during_fan_out.clear()
    monkeypatch.setattr(
        monitor_collect, "fan_out", lambda *a, **k: seen_during_fan_out.append(read.wait(0.3)) or []
    )
    assert monitor_collect.collect(None, [], rules) == []  # type: ignore[arg-type]
    assert seen_during_fan_out == [False] and fresh == ["monitor.status"]


def test_a_declaration_that_cannot_be_read_is_left_to_call_agent(
    fresh: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    failed = threading.Event()
    hooked: list[Any] = []

    def declared(name: str) -> Any:
        failed.set()
        raise RuntimeError("broken agent table")

    monkeypatch.setattr(commands, "declared", declared)
    monkeypatch.setattr(threading, "excepthook", hooked.append)
    monkeypatch.setattr(monitor_collect, "fan_out", lambda *a, **k: [])
    assert monitor_collect.collect(None, [], load_rules(None)) == []  # type: ignore[arg-type]
    assert failed.wait(5)
    for thread in threading.enumerate():
        if thread.name == "status-declaration":
            thread.join(5)
    assert hooked == []  # no traceback on stderr from the head start


def test_status_json_imports_no_table_drawing() -> None:
    code = (
        "import sys\n"
        "from labctl.monitor.collect import HostStatus\n"
        "from labctl.monitor.render import render_status, status_json\n"
        "doc = status_json([HostStatus('m5', True, {'time': 1.0, 'memory': {'used_bytes': 1}})])\n"
        "assert doc['hosts'][0]['host'] == 'm5', doc\n"
        "print('rich.table' in sys.modules, 'rich.box' in sys.modules)\n"
        "render_status([HostStatus('m5', True, {'time': 1.0, 'memory': {'used_bytes': 1}})])\n"
        "print('rich.table' in sys.modules)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "False", "True"]
