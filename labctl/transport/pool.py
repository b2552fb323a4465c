"""One connection per host for the whole run, opened on first use and shared by every step."""

from __future__ import annotations

import threading

from labctl.inventory.model import Host
from labctl.transport.local import LocalConnection
from labctl.transport.ssh import SSHConnection

AnyConnection = SSHConnection | LocalConnection


class ConnectionPool:
    def __init__(self, connect_timeout: float | None = None) -> None:
        self.connect_timeout = connect_timeout
        self._conns: dict[str, AnyConnection] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, host: Host) -> AnyConnection:
        """The host's connection, connecting now if needed (raises a classified TransportError)."""
        with self._guard:
            lock = self._locks.setdefault(host.name, threading.Lock())
        with lock:
            conn = self._conns.get(host.name)
            if conn is None:
                if host.connection == "local":
                    conn = LocalConnection(host)
                else:
                    ssh = SSHConnection(host, connect_timeout=self.connect_timeout)
                    ssh.connect()
                    conn = ssh
                self._conns[host.name] = conn
            return conn

    def replace(self, name: str, conn: AnyConnection) -> None:
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
