"""A TCP server's accept loop that ends on a client's word or when nobody has talked for a while.

`cache.serve` (cache/serve.py) and `netbench.sink` (netbench.py) both serve this way, listening
where `listen_on` says: one thread per
connection, an idle clock that only runs while no connection is open, and a "shutdown" from a
client that wakes the loop at once. Standard library only, Python 3.8.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
from typing import Callable, Iterator, List, Optional, Tuple

DRAIN_TIMEOUT = 10.0  # how long connections still open may finish once the loop ended


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def listen_on(bind: str, port: int = 0) -> Tuple[socket.socket, str]:
    """Listen on the host's inventory address `bind`, so the bytes take the network that address
    is on; on every address when it is not this host's own (NAT, a name that resolves elsewhere).

    A host name that resolves to loopback on the host itself (Debian's /etc/hosts maps its own
    name to 127.0.1.1) would listen where no other host can connect: every address then. An
    address given as such is taken as it is. Raises the last OSError when nothing can listen.
    """
    tries: List[Tuple[int, str]] = []
    if bind:
        try:
            found = socket.getaddrinfo(bind, port, 0, socket.SOCK_STREAM)
        except socket.gaierror:
            found = []
        literal = _is_ip(bind)
        for family, _t, _p, _c, sa in found:
            if literal or not ipaddress.ip_address(str(sa[0]).split("%")[0]).is_loopback:
                tries.append((int(family), str(sa[0])))
    tries.append((socket.AF_INET, "0.0.0.0"))
    last: Optional[OSError] = None
    for fam, addr in tries:
        s = socket.socket(fam, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((addr, port))
            s.listen(64)
            return s, addr
        except OSError as exc:
            s.close()
            last = exc
    assert last is not None
    raise last


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
