"""SSH or local is chosen in one place (transport.pool.open_connection), and every transport
is a `Connection`, the type its users see."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import pytest

import labctl
from labctl.inventory.model import Host
from labctl.transport import pool
from labctl.transport.base import Connection
from labctl.transport.local import LocalConnection
from labctl.transport.ssh import SSHConnection

PKG = Path(labctl.__file__).parent


def test_only_open_connection_builds_a_transport() -> None:
    builders = []
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("SSHConnection", "LocalConnection")
            ):
                builders.append(str(path.relative_to(PKG)))
    assert sorted(set(builders)) == ["transport/pool.py"]


def test_the_pool_and_a_network_transaction_both_open_through_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from labctl.network.txn import connect_fresh

    host = Host.model_validate(
        {"name": "here", "address": "127.0.0.1", "connection": "local", "python": sys.executable}
    )
    opened: list[tuple[str, Any]] = []

    def fake(h: Host, connect_timeout: float | None = None) -> Connection:
        opened.append((h.name, connect_timeout))
        return LocalConnection(h)

    monkeypatch.setattr(pool, "open_connection", fake)
    p = pool.ConnectionPool(connect_timeout=3.0)
    assert p.get(host) is p.get(host)
    connect_fresh(host, 7.0)
    assert opened == [("here", 3.0), ("here", 7.0)]


def test_each_transport_is_a_connection() -> None:
    host = Host.model_validate(
        {"name": "here", "address": "127.0.0.1", "connection": "local", "python": sys.executable}
    )
    local = pool.open_connection(host)
    assert isinstance(local, LocalConnection) and isinstance(local, Connection)
    remote = SSHConnection(
        Host.model_validate({"name": "far", "address": "127.0.0.1"})
    )  # not connected: nothing is reached
    assert isinstance(remote, Connection)
