"""One connection per host for the whole run, opened on first use and shared by every step;
and `open_connection`, the one place that picks SSH or local for a host (the pool, and a
network transaction that needs a connection of its own, both open theirs through it)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from labctl.inventory.model import Host
from labctl.transport.base import Connection
from labctl.transport.local import LocalConnection
from labctl.transport.ssh import SSHConnection


class KeptSource(Protocol):
    """Where a pool asks first for a connection held between commands (labctl.keeper's
    KeeperClient): a connection, or None to connect directly; `close` when the command is done."""

    def connection(self, host: Host) -> Connection | None: ...

    def close(self) -> None: ...


def open_connection(host: Host, connect_timeout: float | None = None) -> Connection:
    """A new, connected connection to `host` as its `connection:` says (raises a classified
    TransportError). `connect_timeout` None: the host's own. Always a connection of the
    caller's own (a network transaction replaces it); the keeper opens its connections with
    this too: the same rules (pinned host key, the inventory's key and user)."""
    if host.connection == "local":
        return LocalConnection(host)
    ssh = SSHConnection(host, connect_timeout=connect_timeout)
    ssh.connect()
    return ssh


class ConnectionPool:
    def __init__(
        self,
        connect_timeout: float | None = None,
        keeper: Callable[[], KeptSource | None] | None = None,
    ) -> None:
        """`keeper`: called once, on the first connection, for the inventory's keeper (None:
        keeping is off); an SSH host is asked of it first (labctl.keeper)."""
        self.connect_timeout = connect_timeout
        self._keeper_factory = keeper
        self._keeper: KeptSource | None = None
        self._keeper_asked = False
        self._conns: dict[str, Connection] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, host: Host) -> Connection:
        """The host's connection, connecting now if needed (raises a classified TransportError)."""
        with self._guard:
            lock = self._locks.setdefault(host.name, threading.Lock())
        with lock:
            conn = self._conns.get(host.name)
            if conn is None:
                keeper = self._keeper_client()
                # A --connect-timeout of this command's own is for a direct connection.
                if keeper is not None and self.connect_timeout is None:
                    conn = keeper.connection(host)
                if conn is None:
                    conn = open_connection(host, self.connect_timeout)
                self._conns[host.name] = conn
            return conn

    def _keeper_client(self) -> KeptSource | None:
        with self._guard:
            if not self._keeper_asked:
                self._keeper_asked = True
                if self._keeper_factory is not None:
                    try:
                        self._keeper = self._keeper_factory()
                    except Exception:
                        self._keeper = None
            return self._keeper

    def replace(self, name: str, conn: Connection) -> None:
        """Use `conn` for `name` from now on (a network change left the old one dead)."""
        with self._guard:
            old = self._conns.get(name)
            self._conns[name] = conn
        if old is not None and old is not conn:
            try:
                old.close()
            except Exception:
                pass

    def drop(self, name: str) -> None:
        with self._guard:
            conn = self._conns.pop(name, None)
        if conn is not None:
            conn.close()

    def close_all(self) -> None:
        with self._guard:
            conns = list(self._conns.values())
            self._conns.clear()
        for c in conns:
            try:
                c.close()
            except Exception:
                pass
        if self._keeper is not None:
            self._keeper.close()
