"""`labctl status` against the simulated lab over real SSH: `--json` rows, and `--watch` read off
an 80-column tmux screen while a host goes down and comes back.

Each test that stops a sim host starts it again in a `finally`; the tmux test also puts back the
orchestra's warm.json it writes on the hosts that stay up.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, SIM_HOSTS, run_json

pytestmark = pytest.mark.integration
DOWN = "irina"
WARM_JSON = "/var/lib/labctl/orchestra/warm.json"


def answering_hosts(inv: Path) -> list[str]:
    """The hosts whose agent answers `monitor.status` (the Windows-marked workstation is skipped)."""
    rc, doc = run_json(inv, "status")
    assert rc == 0, doc
    return [h["host"] for h in doc["hosts"] if h["sample"]]


def test_status_json_has_a_row_per_host_and_marks_a_stopped_one(lab: Any) -> None:
    inv = lab.inventory_path
    rc, doc = run_json(inv, "status")
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert rc == 0, doc
    assert sorted(hosts) == sorted(SIM_HOSTS)
    assert all(h["reachable"] for h in hosts.values())
    assert [n for n, h in hosts.items() if h["sample"] is None] == ["workstation"]  # Windows: skipped
    assert all(h["sample"]["cpu"]["count"] >= 1 for n, h in hosts.items() if n != "workstation")
    lab.stop_host(DOWN)
    try:
        rc, doc = run_json(inv, "status")
    finally:
        lab.start_host(DOWN)
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert rc == 1
    assert hosts[DOWN]["reachable"] is False and hosts[DOWN]["sample"] is None
    assert hosts[DOWN]["error"] and hosts[DOWN]["hint"]
    assert all(h["reachable"] for n, h in hosts.items() if n != DOWN)


class Pane:
    """`labctl status --watch 1` in a detached tmux session, 80 columns wide, read as text."""

    def __init__(self, inv: Path) -> None:
        self.name = f"labctl-status-{uuid.uuid4().hex[:8]}"
        cmd = f"{shlex.quote(sys.executable)} -m labctl -i {shlex.quote(str(inv))} status --watch 1; echo EXIT=$?; sleep 60"
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", self.name, "-x", "80", "-y", "50", "-c", str(REPO), cmd],
            check=True,
        )

    def screen(self) -> str:
        return subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True, check=True
        ).stdout

    def wait(self, what: str, ok: Callable[[str], bool], seconds: float = 30) -> str:
        deadline = time.monotonic() + seconds
        while True:
            text = self.screen()
            if ok(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"the status screen never showed {what}:\n{text}")
            time.sleep(0.2)

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


def row(text: str, host: str) -> str:
    """The first screen line of `host`'s rows."""
    return next((line for line in text.splitlines() if line.split()[:1] == [host]), "")


@contextmanager
def warm_marker(inv: Path, hosts: list[str]) -> Iterator[Callable[[str], None]]:
    """A function writing the orchestra's warm.json with one model name on `hosts` (a private
    /var/lib/labctl per sim host); each host's old file is put back after."""
    w, keep = shlex.quote(WARM_JSON), shlex.quote(WARM_JSON + ".status-test")

    def on_hosts(line: str) -> None:
        rc, doc = run_json(inv, "exec", "-l", ",".join(hosts), "--", line)
        assert rc == 0, doc

    def write(model: str) -> None:
        state = shlex.quote(json.dumps({"models": [{"name": model, "gpu": None, "port": None}]}))
        on_hosts(f"mkdir -p {shlex.quote(str(Path(WARM_JSON).parent))} && printf %s {state} > {w}")

    on_hosts(f"if [ -e {w} ]; then cp -p {w} {keep}; fi")
    try:
        yield write
    finally:
        on_hosts(f"if [ -e {keep} ]; then mv {keep} {w}; else rm -f {w}; fi")


def test_watch_in_80_columns_survives_a_host_going_down_and_coming_back(lab: Any) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("needs tmux (apt-get install tmux)")
    inv = lab.inventory_path
    names = answering_hosts(inv)
    up = [n for n in names if n != DOWN]
    pane = Pane(inv)
    try:
        text = pane.wait("every host", lambda t: all("cpu" in row(t, n) for n in names))
        assert all(len(line) <= 80 for line in text.splitlines())
        lab.stop_host(DOWN)
        try:
            text = pane.wait(f"{DOWN} unreachable", lambda t: "unreachable" in row(t, DOWN))
            # The others keep updating while it is down: a change made now on their side shows.
            with warm_marker(inv, up) as write:
                marker = f"probe-{uuid.uuid4().hex[:6]}"
                write(marker)
                text = pane.wait(f"{marker} from the hosts still up", lambda t: t.count(marker) >= len(up))
            assert "unreachable" in row(text, DOWN)
            assert all("cpu" in row(text, n) for n in up)
        finally:
            lab.start_host(DOWN)
        text = pane.wait(f"{DOWN} back", lambda t: "cpu" in row(t, DOWN))
        assert "unreachable" not in text
        subprocess.run(["tmux", "send-keys", "-t", pane.name, "C-c"], check=True)
        text = pane.wait("the exit status after Ctrl-C", lambda t: "EXIT=" in t)
        assert "EXIT=0" in text and "Traceback" not in text
    finally:
        pane.close()
