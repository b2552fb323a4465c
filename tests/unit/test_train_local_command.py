"""An attached `labctl train` on a `connection: local` host (train/launch.py).

Over SSH the run is wrapped in the watchdog, which ends it when the channel's stdin closes. A
local host's command has /dev/null for stdin, so the same wrapper ended every local run at
once (torchrun "exited 143"): a local host's command runs unwrapped, in LocalConnection's own
session, which Ctrl-C, a timeout or a failed host stop.
"""

from __future__ import annotations

import json
import shlex
import threading
from pathlib import Path
from typing import Any

import pytest

from labctl.inventory.model import Host
from labctl.train import launch
from labctl.train.spec import LaunchSpec, NodeSpec
from labctl.transport.local import LocalConnection
from labctl.transport.wrap import wrap_with_watchdog

EVENT = {"event": "step", "step": 1, "loss": 5.0}


class _Spec(LaunchSpec):
    """A run whose per-host command is a shell line of the test's, not torchrun."""

    def shell_line(self, node: NodeSpec) -> str:
        return "sh -c " + shlex.quote(self.settings["line"])  # one command: the launch line exec's it


def spec(tmp_path: Path, line: str) -> _Spec:
    node = NodeSpec(host="here", address="127.0.0.1", nproc=1, device="cpu", python="python3")
    return _Spec(
        run_id="r-local",
        phase=1,
        dist_backend="gloo",
        nodes=(node,),
        head_address="127.0.0.1",
        port=29500,
        max_restarts=0,
        settings={"line": line},
        log_dir=str(tmp_path / "log"),
    )


def local_host() -> Host:
    return Host(name="here", address="127.0.0.1", connection="local")


RANK0_LINE = f"sleep 0.5; echo '[rank0]:{json.dumps(EVENT)}'"


def test_the_watchdog_wrapper_ends_a_local_command_at_once(tmp_path: Path) -> None:
    # Why a local host's command is not wrapped: its stdin is /dev/null, the watchdog's EOF.
    s = spec(tmp_path, RANK0_LINE)
    res = LocalConnection(local_host()).run(
        wrap_with_watchdog(launch._command(s, s.nodes[0]), grace=1), timeout=30, watchdog=False
    )
    assert res.rc != 0 and "[rank0]" not in res.stdout


def test_a_local_command_runs_to_its_end_in_the_runs_folder(tmp_path: Path) -> None:
    s = spec(tmp_path, RANK0_LINE + "; pwd")
    res = LocalConnection(local_host()).run(launch._command(s, s.nodes[0]), timeout=30, grace=1)
    assert res.rc == 0, res.stderr
    assert res.stdout.splitlines() == [f"[rank0]:{json.dumps(EVENT)}", s.log_dir]


def test_run_attached_on_a_local_host_trains_and_streams_rank_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = local_host()

    class Run:
        def __init__(self) -> None:
            self.host = host
            self.cancel = threading.Event()
            self.conn = LocalConnection(host)

    def fan_out(ctx: Any, hosts: list[Host], step: Any, **_: Any) -> list[Any]:
        return [step(Run()) for _ in hosts]

    monkeypatch.setattr(launch, "fan_out", fan_out)
    monkeypatch.setattr(launch, "stop_everywhere", lambda *a, **k: {"here": []})
    s = spec(tmp_path, RANK0_LINE)
    stream = launch.Stream(tmp_path / "runs", ranks=None)
    stream.open(["here"])
    try:
        outcome = launch.run_attached(None, s, [host], stream, grace=1, timeout=60)  # type: ignore[arg-type]
    finally:
        stream.close()
    assert [(r.status, r.rc) for r in outcome.results] == [("ok", 0)], outcome.results
    assert [{k: e[k] for k in EVENT} for e in outcome.events] == [EVENT]
    assert outcome.failed_host is None
