"""A TCP server's accept loop that ends on a client's word or when nobody has talked for a while.

`cache_serve` (cache/serve.py) and `net_sink` (netbench.py) both serve this way: one thread per
connection, an idle clock that only runs while no connection is open, and a "shutdown" from a
client that wakes the loop at once. Standard library only, Python 3.8.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Callable, Iterator, Optional

DRAIN_TIMEOUT = 10.0  # how long connections still open may finish once the loop ended


class Accepting:
    """The state the accept loop shares with its connection threads: subclass it and call
    `serve`; each handler runs inside `in_use()` and calls `shutdown()` on a client's word."""

    def __init__(self, idle_timeout: float) -> None:
        self.idle_timeout = idle_timeout
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.active = 0
        self.last = time.monotonic()
        self.listener: Optional[socket.socket] = None

    def touch(self) -> None:
        self.last = time.monotonic()

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """One connection open: the idle clock waits until the last one closes."""
        with self.lock:
            self.active += 1
        try:
            yield
        finally:
            with self.lock:
                self.active -= 1
            self.touch()

    def shutdown(self) -> None:
        self.stop.set()
        if self.listener is not None:
            with contextlib.suppress(OSError):
                self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept() at once, not at its timeout

    def serve(self, sock: socket.socket, handle: Callable[[socket.socket, str], None]) -> str:
        """Accept until `shutdown()` or idle; closes `sock`, lets open connections finish, and
        returns why it ended: "shutdown" or "idle"."""
        self.listener = sock
        sock.settimeout(0.5)
        reason = "shutdown"
        try:
            while not self.stop.is_set():
                try:
                    conn, addr = sock.accept()
                except socket.timeout:  # noqa: UP041 (on Python < 3.10 it is not TimeoutError)
                    if self.active == 0 and time.monotonic() - self.last > self.idle_timeout:
                        reason = "idle"
                        break
                    continue
                except OSError:
                    if self.stop.is_set():
                        break  # shut down by a client (see shutdown)
                    raise
                self.touch()
                threading.Thread(target=handle, args=(conn, str(addr[0])), daemon=True).start()
        finally:
            sock.close()
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while self.active and time.monotonic() < deadline:
            time.sleep(0.05)
        return reason
