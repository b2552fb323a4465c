"""The connection keeper on the simulated lab: one connection per host held between commands,
listed and closed with `labctl connections`, and dropped when the sim stops a host."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from labctl.keeper.client import list_connections, stop
from tests.conftest import keeper_folder, labctl, run_json

pytestmark = pytest.mark.integration


@pytest.fixture
def folder(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    d = keeper_folder()
    monkeypatch.setenv("LABCTL_KEEPER", "always")
    monkeypatch.setenv("LABCTL_KEEPER_DIR", str(d))
    yield d
    shutil.rmtree(d.parent, ignore_errors=True)


def kept(inv: Path, folder: Path) -> dict[str, int]:
    return {e["host"]: e["served"] for e in list_connections(inv, folder)["connections"]}


def test_commands_share_one_connection_per_host_and_a_stopped_host_is_dropped(lab: Any, folder: Path) -> None:
    inv = lab.inventory_path
    linux = "m5,irina,pharaoh"
    try:
        seen: dict[str, set[str]] = {}
        for _ in range(3):
            rc, doc = run_json(inv, "exec", "-l", linux, "--", "echo $SSH_CONNECTION")
            assert rc == 0, doc
            for r in doc["results"]:
                seen.setdefault(r["host"], set()).add(r["stdout"].strip())
        # One TCP connection per host all along: the client's address and port never changed.
        assert {h: len(v) for h, v in seen.items()} == {"m5": 1, "irina": 1, "pharaoh": 1}, seen
        assert kept(inv, folder) == {"m5": 3, "irina": 3, "pharaoh": 3}
        rc, doc = run_json(inv, "connections")
        assert (
            rc == 0
            and doc["running"]
            and {e["host"] for e in doc["connections"]} == {"m5", "irina", "pharaoh"}
        )

        lab.stop_host("pharaoh")
        try:
            assert set(kept(inv, folder)) == {"m5", "irina"}  # dropped by the sim, not found dead later
            rc, doc = run_json(inv, "exec", "-l", linux, "--", "true")
            statuses = {r["host"]: r["status"] for r in doc["results"]}
            assert rc == 1 and statuses == {"m5": "ok", "irina": "ok", "pharaoh": "unreachable"}
        finally:
            lab.start_host("pharaoh")
        rc, doc = run_json(inv, "exec", "-l", "pharaoh", "--", "true")
        assert rc == 0 and kept(inv, folder)["pharaoh"] == 1  # a new connection

        rc, doc = run_json(inv, "connections", "close", "m5")
        assert rc == 0 and doc["closed"] == ["m5"]
        assert "m5" not in kept(inv, folder)
        proc = labctl("-i", str(inv), "connections", "close", "nosuchhost")
        assert proc.returncode == 2 and "No host 'nosuchhost'" in proc.stderr
    finally:
        stop(inv, folder)
