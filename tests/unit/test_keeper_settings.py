"""`connections: {persist: ...}` in the inventory's defaults, who asks the keeper, and how
`labctl connections` and `doctor` report it."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from labctl.cli.app import app
from labctl.doctor.checks import check_keeper
from labctl.hosts.context import Context
from labctl.inventory.load import InventoryError, load_inventory
from labctl.keeper.client import KeeperClient, keeper_state


def write(folder: Path, defaults: str = "") -> Path:
    p = folder / "lab.yaml"
    p.write_text(f"lab: t\n{defaults}hosts:\n  m1: {{address: 127.0.0.1, connection: local}}\n")
    return p


@pytest.fixture
def folder() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="ks", dir="/tmp"))
    os.mkdir(d / "k", 0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize(("text", "seconds"), [("10m", 600), ("90s", 90), ("1h", 3600), ("0", 0), ("45", 45)])
def test_persist_reads_a_duration(folder: Path, text: str, seconds: float) -> None:
    inv = load_inventory(write(folder, f"defaults:\n  connections: {{persist: {text}}}\n"))
    assert inv.connections.persist == seconds
    assert "connections" not in inv.hosts["m1"].model_dump()  # not a host's setting


def test_persist_defaults_to_ten_minutes(folder: Path) -> None:
    assert load_inventory(write(folder)).connections.persist == 600


@pytest.mark.parametrize("bad", ["soon", "-1", "2d", "yes", "{}"])
def test_a_bad_persist_is_an_inventory_error(folder: Path, bad: str) -> None:
    with pytest.raises(InventoryError) as e:
        load_inventory(write(folder, f"defaults:\n  connections: {{persist: {bad}}}\n"))
    assert "persist" in str(e.value.paragraph())


def test_a_host_cannot_set_it(folder: Path) -> None:
    p = folder / "lab.yaml"
    p.write_text("lab: t\nhosts:\n  m1: {address: 127.0.0.1, connections: {persist: 0}}\n")
    with pytest.raises(InventoryError):
        load_inventory(p)


def test_who_asks_the_keeper(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LABCTL_KEEPER", "on")
    on = Context.create(write(folder, "defaults:\n  connections: {persist: 5m}\n"))
    k = on.keeper()
    assert isinstance(k, KeeperClient) and k.persist == 300
    off = Context.create(write(folder, "defaults:\n  connections: {persist: 0}\n"))
    assert off.keeper() is None
    monkeypatch.setenv("LABCTL_KEEPER", "0")
    assert Context.create(write(folder)).keeper() is None
    # A local host never goes through the keeper: there is nothing to keep.
    monkeypatch.setenv("LABCTL_KEEPER", "on")
    monkeypatch.setenv("LABCTL_KEEPER_DIR", str(folder / "k"))
    c = Context.create(write(folder))
    conn = c.pool.get(c.inventory.host("m1"))
    assert type(conn).__name__ == "LocalConnection"
    assert os.listdir(folder / "k") == []  # and no keeper was started for it


def test_connections_and_doctor_report_no_keeper(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LABCTL_KEEPER", "on")
    monkeypatch.setenv("LABCTL_KEEPER_DIR", str(folder / "k"))
    inv = write(folder)
    res = CliRunner().invoke(app, ["connections", "-i", str(inv), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["running"] is False and doc["enabled"] is True and doc["persist"] == 600
    [line] = check_keeper(keeper_state(inv, 600, folder / "k"))
    assert line.status == "pass" and "not running" in line.found
    [line] = check_keeper(keeper_state(inv, 0, folder / "k"))
    assert line.status == "pass" and line.found.startswith("off")
    os.chmod(folder / "k", 0o755)
    [line] = check_keeper(keeper_state(inv, 600, folder / "k"))
    assert line.status == "warn" and "mode 755" in line.found
    res = CliRunner().invoke(app, ["connections", "close", "m1", "-i", str(inv), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout) == {"closed": []}
    res = CliRunner().invoke(app, ["connections", "stop", "-i", str(inv), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout) == {"stopped": False}


def test_doctor_counts_the_connections_with_a_kept_agent() -> None:
    conns = [
        {"host": "m5", "agents": [{"pid": 40, "calls": 3}]},
        {"host": "irina", "agents": []},
    ]
    state = {"enabled": True, "running": True, "pid": 7, "persist": 600.0, "connections": conns}
    [line] = check_keeper(state)
    assert (
        line.status == "pass"
        and "keeps 2 connection(s) (irina, m5), 1 with an agent kept running" in line.found
    )
