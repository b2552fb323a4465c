"""The accept loop `cache.serve` and `netbench.sink` share (labctl/agent/core/accepting.py), on real sockets."""

from __future__ import annotations

import socket
import threading

from labctl.agent.core.accepting import Accepting


class _Echo(Accepting):
    def __init__(self, idle_timeout: float) -> None:
        super().__init__(idle_timeout)
        self.seen: list[str] = []

    def handle(self, conn: socket.socket, peer: str) -> None:
        with self.in_use():
            try:
                word = conn.recv(64)
                self.seen.append(peer)
                conn.sendall(b"ok")
                if word == b"shutdown":
                    self.shutdown()
            finally:
                conn.close()


def _listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock


def test_a_clients_shutdown_ends_the_loop_after_its_connections() -> None:
    server, sock = _Echo(idle_timeout=3600), _listening()
    port = sock.getsockname()[1]
    out: list[str] = []
    loop = threading.Thread(target=lambda: out.append(server.serve(sock, server.handle)))
    loop.start()
    for word in (b"hello", b"shutdown"):
        with socket.create_connection(("127.0.0.1", port)) as c:
            c.sendall(word)
            assert c.recv(2) == b"ok"
    loop.join(60)
    assert out == ["shutdown"]
    assert server.seen == ["127.0.0.1", "127.0.0.1"]
    assert server.active == 0
    assert sock.fileno() == -1  # closed: nobody else can connect


def test_nobody_talking_ends_the_loop_as_idle() -> None:
    server, sock = _Echo(idle_timeout=0), _listening()
    assert server.serve(sock, server.handle) == "idle"
    assert server.seen == []
    assert sock.fileno() == -1
