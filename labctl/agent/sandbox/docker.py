"""A Docker Engine API client over its unix socket: HTTP/1.1, one connection per request.

Only what the sandbox needs: containers (create, start, rename, update, kill, remove, list by
label, inspect) and execs whose stdout/stderr arrive as Docker's multiplexed stream, read as it
comes with a byte cap and a wall-clock deadline, so a flood or a hang never grows the agent.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import quote, urlencode

SOCKET = "/var/run/docker.sock"
API = "/v1.41"  # Docker 20.10 and later
HEADER = struct.Struct(">BxxxI")  # stream (1 stdout, 2 stderr), 3 zero bytes, payload size
EXEC_INSPECT_TRIES = 200  # an exec's exit code lands just after its stream closes


class DockerError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"docker: {message} (HTTP {status})")
        self.status = status
        self.message = message


class Demux:
    """Docker's multiplexed exec stream, fed in pieces as they arrive, split into stdout and
    stderr with at most `cap` bytes kept of each; what is past the cap is read and dropped so
    the program never blocks on a full pipe, and `truncated` says so."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.out = {1: bytearray(), 2: bytearray()}
        self.truncated = False
        self._pending = b""
        self._stream = 0
        self._left = 0  # payload bytes of the current frame still to come

    def feed(self, data: bytes) -> None:
        data = self._pending + data
        self._pending = b""
        pos = 0
        while pos < len(data):
            if self._left == 0:
                if len(data) - pos < HEADER.size:
                    self._pending = data[pos:]
                    return
                self._stream, self._left = HEADER.unpack_from(data, pos)
                pos += HEADER.size
                continue
            take = min(self._left, len(data) - pos)
            self._keep(data[pos : pos + take])
            pos += take
            self._left -= take

    def _keep(self, chunk: bytes) -> None:
        buf = self.out.get(self._stream)
        if buf is None:  # stream 0 (stdin echo) or unknown: never the program's output
            return
        room = self.cap - len(buf)
        if len(chunk) > room:
            self.truncated = True
            chunk = chunk[: max(room, 0)]
        buf += chunk

    @property
    def stdout(self) -> bytes:
        return bytes(self.out[1])

    @property
    def stderr(self) -> bytes:
        return bytes(self.out[2])


class _Conn:
    """One HTTP/1.1 exchange on a fresh unix-socket connection, read by hand so a timed-out
    read leaves it usable (a socket file object refuses every read after one timeout)."""

    def __init__(self, path: str, timeout: float) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
        except OSError:
            self.sock.close()
            raise
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def send(self, method: str, target: str, body: Optional[bytes], upgrade: bool = False) -> None:
        head = [f"{method} {target} HTTP/1.1", "Host: docker"]
        head.append("Connection: Upgrade\r\nUpgrade: tcp" if upgrade else "Connection: close")
        if body is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + (body or b""))

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if not self._fill():
                raise ConnectionError("docker closed the connection mid-response")
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise ConnectionError("docker closed the connection mid-response")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def head(self) -> Tuple[int, Dict[str, str]]:
        status = int(self._line().split()[1])
        headers: Dict[str, str] = {}
        while True:
            line = self._line()
            if not line:
                return status, headers
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()

    def body(self, headers: Dict[str, str]) -> bytes:
        if "chunked" in headers.get("transfer-encoding", ""):
            out = b""
            while True:
                size = int(self._line().split(b";")[0], 16)
                if size == 0:
                    return out
                out += self._exact(size)
                self._line()
        if "content-length" in headers:
            return self._exact(int(headers["content-length"]))
        while self._fill():
            pass
        out, self.buf = self.buf, b""
        return out

    def some(self) -> bytes:
        """What has arrived (at least one byte), or b"" at the end of the stream."""
        if self.buf:
            out, self.buf = self.buf, b""
            return out
        return self.sock.recv(65536)


def _target(path: str, query: Optional[Dict[str, Any]]) -> str:
    return API + path + ("?" + urlencode(query) if query else "")


def _error(status: int, body: bytes) -> DockerError:
    try:
        message = json.loads(body.decode()).get("message", "")
    except (ValueError, AttributeError):
        message = body.decode("utf-8", "replace").strip()
    return DockerError(status, message or "error")


class Client:
    def __init__(self, path: str = SOCKET, timeout: float = 60.0) -> None:
        self.path = path
        self.timeout = timeout

    def available(self) -> bool:
        return os.path.exists(self.path)

    def request(
        self, method: str, path: str, body: Any = None, query: Optional[Dict[str, Any]] = None
    ) -> Any:
        """The answer's JSON (None when empty); a DockerError for a status of 400 and above."""
        conn = _Conn(self.path, self.timeout)
        try:
            conn.send(method, _target(path, query), None if body is None else json.dumps(body).encode())
            status, headers = conn.head()
            data = conn.body(headers)
        finally:
            conn.close()
        if status >= 400:
            raise _error(status, data)
        return json.loads(data.decode()) if data.strip() else None

    # containers
    def create(self, config: Dict[str, Any], name: str) -> str:
        return str(self.request("POST", "/containers/create", config, {"name": name})["Id"])

    def start(self, cid: str) -> None:
        self.request("POST", f"/containers/{quote(cid)}/start")

    def rename(self, old: str, new: str) -> bool:
        """False when `old` is no longer there (another claimer renamed it first)."""
        try:
            self.request("POST", f"/containers/{quote(old)}/rename", query={"name": new})
        except DockerError as e:
            if e.status in (404, 409):
                return False
            raise
        return True

    def update(self, cid: str, body: Dict[str, Any]) -> None:
        self.request("POST", f"/containers/{quote(cid)}/update", body)

    def kill(self, cid: str) -> None:
        """SIGKILL to the container's init: everything in it dies with it. Gone already: fine."""
        try:
            self.request("POST", f"/containers/{quote(cid)}/kill", query={"signal": "KILL"})
        except DockerError as e:
            if e.status not in (404, 409):
                raise

    def remove(self, cid: str) -> None:
        try:
            self.request("DELETE", f"/containers/{quote(cid)}", query={"force": "1", "v": "1"})
        except DockerError as e:
            if e.status not in (404, 409):  # 409: dockerd is removing it already
                raise

    def inspect(self, cid: str) -> Dict[str, Any]:
        return dict(self.request("GET", f"/containers/{quote(cid)}/json"))

    def list(self, labels: List[str], running_only: bool = True) -> List[Dict[str, Any]]:
        filters: Dict[str, List[str]] = {"label": labels}
        if running_only:
            filters["status"] = ["running"]
        query = {"all": "1", "filters": json.dumps(filters)}
        return list(self.request("GET", "/containers/json", query=query))

    # execs
    def exec_create(
        self, cid: str, cmd: List[str], env: Optional[List[str]] = None, stdin: bool = False
    ) -> str:
        body = {
            "Cmd": cmd,
            "Env": env or [],
            "AttachStdin": stdin,
            "AttachStdout": True,
            "AttachStderr": True,
            "Tty": False,
            "WorkingDir": "/work",
        }
        return str(self.request("POST", f"/containers/{quote(cid)}/exec", body)["Id"])

    def exec_stream(
        self, exec_id: str, stdin: Optional[bytes], cap: int, deadline: float
    ) -> Tuple[Demux, bool]:
        """Start an exec and read its output until it ends or `deadline` (time.monotonic) passes.

        Returns the demultiplexed output and whether the deadline passed first; then the exec
        still runs and the caller kills its container. stdin, when given, is written from a
        thread (a program may print before it reads) and then half-closed: the program's EOF.
        """
        demux = Demux(cap)
        conn = _Conn(self.path, self.timeout)
        try:
            body = json.dumps({"Detach": False, "Tty": False}).encode()
            conn.send("POST", _target(f"/exec/{quote(exec_id)}/start", None), body, upgrade=True)
            status, headers = conn.head()
            if status >= 400:
                raise _error(status, conn.body(headers))
            writer = None
            if stdin is not None:
                writer = threading.Thread(target=_write_stdin, args=(conn.sock, stdin), daemon=True)
                writer.start()
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return demux, True
                conn.sock.settimeout(left)
                try:
                    data = conn.some()
                except socket.timeout:  # noqa: UP041 (on Python < 3.10 it is not TimeoutError)
                    return demux, True
                if not data:
                    return demux, False
                demux.feed(data)
        finally:
            conn.close()

    def exec_exit_code(self, exec_id: str) -> Optional[int]:
        for _ in range(EXEC_INSPECT_TRIES):
            info = self.request("GET", f"/exec/{quote(exec_id)}/json")
            if not info.get("Running"):
                code = info.get("ExitCode")
                return None if code is None else int(code)
            time.sleep(0.005)
        return None


def _write_stdin(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the program exited without reading it all, or the run was killed


def oom_kills(cid: str) -> Optional[int]:
    """How many processes the kernel's OOM killer took in the container's memory cgroup
    (cgroup v1 or v2, cgroupfs or systemd driver), or None where no such file is readable."""
    candidates = [
        f"/sys/fs/cgroup/memory/docker/{cid}/memory.oom_control",
        f"/sys/fs/cgroup/memory/system.slice/docker-{cid}.scope/memory.oom_control",
        f"/sys/fs/cgroup/docker/{cid}/memory.events",
        f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/memory.events",
    ]
    for path in candidates:
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None
