"""Both ends of `labctl bench network`: a sink that counts bytes, and a sender of TCP streams.

The controller keeps `netbench.sink` running on the receiving host (in a thread, like
`cache.serve`) and runs `netbench.send` on the sending host against it: the bytes go host to
host, never through the controller. The sink measures each stream on its own clock (bytes
and the times of the first and last data it read) and hands that back over the stream
itself, so the rate is what arrived, not what the sender's socket buffers took in.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import secrets
import socket
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from ..cache.manifest import emit
from ..core.accepting import Accepting, listen_on
from ..core.errors import AgentError
from ..core.spec import Opt, Or, command

BLOCK = 1 << 20
MAX_LINE = 4096
HELLO_TIMEOUT = 30.0
# After the sender's deadline a stream drains what is still queued (at most a few socket
# buffers): far more than that means the sink is stuck.
REPORT_TIMEOUT = 60.0
PAUSE = 0.3  # between stream counts, so one run's queues are empty before the next starts


def _read_line(sock: socket.socket) -> Tuple[Optional[Dict[str, Any]], bytes]:
    """One JSON line from a socket, and whatever arrived after it (unbuffered, so no data
    byte is hidden in a file object's buffer)."""
    buf = b""
    while b"\n" not in buf:
        chunk = sock.recv(MAX_LINE)
        if not chunk:
            return None, b""
        buf += chunk
        if len(buf) > MAX_LINE and b"\n" not in buf:
            raise ValueError("line too long")
    line, _, rest = buf.partition(b"\n")
    try:
        doc = json.loads(line)
    except RecursionError:  # malformed like any other line, not a handler thread's death
        raise ValueError("the line is nested too deeply to parse as JSON") from None
    if not isinstance(doc, dict):
        raise ValueError("not an object")
    return doc, rest


def _send_line(sock: socket.socket, obj: Dict[str, Any]) -> None:
    sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")


class _Sink(Accepting):
    def __init__(self, token: str, idle_timeout: float) -> None:
        super().__init__(idle_timeout)
        self.token = token
        self.bytes = 0
        self.streams = 0
        self.refused = 0
        self.peers: List[str] = []

    def handle(self, conn: socket.socket, peer: str) -> None:
        with self.in_use():
            try:
                conn.settimeout(HELLO_TIMEOUT)
                hello, rest = _read_line(conn)
                if hello is None or not hmac.compare_digest(str(hello.get("token", "")), self.token):
                    with self.lock:
                        self.refused += 1
                    _send_line(conn, {"ok": False, "error": "bad token"})
                    return
                if hello.get("op") == "shutdown":
                    _send_line(conn, {"ok": True})
                    self.shutdown()
                    return
                with self.lock:
                    self.streams += 1
                    if peer not in self.peers:
                        self.peers.append(peer)
                _send_line(conn, {"ok": True})
                conn.settimeout(max(HELLO_TIMEOUT, self.idle_timeout))
                self._count(conn, len(rest))
            except (OSError, ValueError):
                return  # the sender went away: it reports the stream as failed on its side
            finally:
                conn.close()

    def _count(self, conn: socket.socket, early: int) -> None:
        """Read to EOF; the rate counts bytes after the first read, between it and the last."""
        buf = bytearray(BLOCK)
        view = memoryview(buf)
        first: Optional[float] = time.monotonic() if early else None
        last = first
        counted = 0
        while True:
            n = conn.recv_into(view)
            if not n:
                break
            now = time.monotonic()
            if first is None:
                first = now
            else:
                counted += n
            last = now
            self.last = now
        with self.lock:
            self.bytes += counted + early
        _send_line(conn, {"bytes": counted, "first": first, "last": last, "total": counted + early})


@command(
    takes={"idle_timeout": Or("num", 60.0), "bind": Or("str", "")},
    answers={"bytes?": "int", "streams?": "int", "port?": "int"},
)
def sink_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """Count the bytes of every stream a sender opens, until it says stop or nobody sends for
    `idle_timeout` seconds (or the controller closes the channel and the agent is killed)."""
    idle = args["idle_timeout"]
    try:
        sock, bound = listen_on(args["bind"])
    except OSError as exc:
        raise AgentError(f"cannot listen for the benchmark's streams: {exc}", "listen_failed") from None
    token = secrets.token_urlsafe(24)
    sink = _Sink(token, idle)
    port = sock.getsockname()[1]
    start = time.monotonic()
    emit({"event": "listening", "address": bound, "port": port, "token": token, "pid": os.getpid()})
    reason = sink.serve(sock, sink.handle)
    return {
        "reason": reason,
        "address": bound,
        "port": port,
        "bytes": sink.bytes,
        "streams": sink.streams,
        "refused": sink.refused,
        "peers": sink.peers,
        "seconds": round(time.monotonic() - start, 3),
    }


def _read_token(args: Dict[str, Any]) -> str:
    """The sink's token from the 0600 file the controller put here (removed once read), so it
    never shows on a command line other users can read."""
    path = args["token_file"]
    if not path:
        return str(args["token"])
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError as e:
        raise AgentError(f"cannot read the benchmark's token file {path}: {e.strerror}", "no_token") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(str(path))


def _connect(address: str, port: int, token: str, hello: Dict[str, Any]) -> socket.socket:
    try:
        s = socket.create_connection((address, port), timeout=HELLO_TIMEOUT)
    except OSError as e:
        raise AgentError(f"cannot connect to {address}:{port}: {e}", "connect_failed") from None
    try:
        _send_line(s, dict(hello, token=token))
        answer, _ = _read_line(s)
    except (OSError, ValueError) as e:
        s.close()
        raise AgentError(
            f"{address}:{port} did not answer the benchmark's hello: {e}", "connect_failed"
        ) from None
    if not answer or not answer.get("ok"):
        s.close()
        raise AgentError(
            f"{address}:{port} refused the stream: {(answer or {}).get('error', 'closed')}", "refused"
        )
    return s


class _Stream:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sent = 0
        self.report: Optional[Dict[str, Any]] = None
        self.error: Optional[str] = None

    def run(self, go: threading.Event, deadline: List[float], buf: memoryview) -> None:
        s = self.sock
        try:
            go.wait()
            end = deadline[0]
            while time.monotonic() < end:
                s.sendall(buf)
                self.sent += len(buf)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(REPORT_TIMEOUT)
            self.report, _ = _read_line(s)
            if self.report is None:
                self.error = "the receiver closed the stream without reporting what it got"
        except (OSError, ValueError) as e:
            self.error = str(e) or type(e).__name__
        finally:
            s.close()


def measure_streams(address: str, port: int, token: str, streams: int, seconds: float) -> Dict[str, Any]:
    """`streams` TCP streams at once for `seconds`; the rate as the receiver counted it."""
    socks = []
    hellos = []  # each a TCP handshake and one hello round trip: the path's latency, near enough
    try:
        for _ in range(streams):
            began = time.monotonic()
            socks.append(_connect(address, port, token, {"op": "stream"}))
            hellos.append(time.monotonic() - began)
    except AgentError:
        for s in socks:
            s.close()
        raise
    buf = memoryview(bytes(BLOCK))
    go = threading.Event()
    deadline = [0.0]
    runs = [_Stream(s) for s in socks]
    threads = [threading.Thread(target=r.run, args=(go, deadline, buf), daemon=True) for r in runs]
    for t in threads:
        t.start()
    deadline[0] = time.monotonic() + seconds
    go.set()
    for t in threads:
        t.join()
    failed = [r.error for r in runs if r.error]
    if failed:
        raise AgentError(f"a stream to {address}:{port} failed: {failed[0]}", "stream_failed")
    reports = [r.report or {} for r in runs]
    firsts = [float(x["first"]) for x in reports if x.get("first") is not None]
    lasts = [float(x["last"]) for x in reports if x.get("last") is not None]
    counted = sum(int(x.get("bytes") or 0) for x in reports)
    span = max(lasts) - min(firsts) if firsts and lasts else 0.0
    if counted <= 0 or span <= 0:
        raise AgentError(f"no bytes reached {address}:{port} in {seconds:g} s", "no_data")
    return {
        "streams": streams,
        "bytes": counted,
        "seconds": round(span, 6),
        "bits_per_s": counted * 8 / span,
        "per_stream_bits_per_s": [
            int(x.get("bytes") or 0) * 8 / (float(x["last"]) - float(x["first"]))
            if x.get("first") is not None
            and x.get("last") is not None
            and float(x["last"]) > float(x["first"])
            else 0.0
            for x in reports
        ],
        "sent_bytes": sum(r.sent for r in runs),
        "connect_ms": round(min(hellos) * 1000, 3),
    }


def _stop_sink(address: str, port: int, token: str) -> None:
    with contextlib.suppress(AgentError, OSError):
        _connect(address, port, token, {"op": "shutdown"}).close()


@command(
    takes={
        "address": "str",
        "port": "int",
        "token": Or("any", ""),
        "token_file": Or("str", ""),
        "seconds": Or("num", 5.0),
        "streams": Or(["any"], [1]),
        "keep_sink": Opt("bool", False),
    },
    answers={
        "runs": [
            {
                "streams": "int",
                "bytes": "int",
                "seconds": "num",
                "bits_per_s": "num",
                "per_stream_bits_per_s?": ["num"],
                "connect_ms?": "num?",
            }
        ]
    },
)
def send_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """For each stream count in `streams`, send for `seconds` to the sink at address:port."""
    address, port = args["address"], args["port"]
    token = _read_token(args)
    seconds = args["seconds"]
    counts = [int(n) for n in args["streams"]]
    runs: List[Dict[str, Any]] = []
    try:
        for i, n in enumerate(counts):
            if i:
                time.sleep(PAUSE)
            r = measure_streams(address, port, token, n, seconds)
            emit({"event": "measured", "streams": n, "bits_per_s": r["bits_per_s"]})
            runs.append(r)
    finally:
        if not args["keep_sink"]:
            _stop_sink(address, port, token)
    return {"address": address, "port": port, "seconds": seconds, "runs": runs}
