"""A command's side of the keeper.

`KeeperClient.connection(host)` is what the pool asks first: a `KeptConnection` when the
inventory's keeper is there and willing, else None (and a keeper is started, detached, for the
next command): the command then connects itself, exactly as with keeping off.

A `KeptConnection` is a transport.base.Connection. Each `run` is one socket to the keeper:
output lines arrive as they come, the result (or the classified error) at the end. Cancelling
sends `cancel`; Ctrl-C, an exception or the process dying closes the socket: either way the
keeper closes that command's channel, and the remote watchdog ends what it started. The
timeout is the keeper's to apply (the same SSHConnection.run applies it); the client gives up
on its own only well after it.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import labctl
from labctl.inventory.model import Host
from labctl.keeper import sock as ks
from labctl.keeper.wire import error_from_wire, host_to_wire
from labctl.transport.base import CommandResult, ConnectionLost, LineCallback
from labctl.transport.wrap import GRACE_SECONDS

# Past the command's own timeout (and its watchdog's grace), how long the client waits for the
# keeper's answer before it closes the socket itself.
LATE_ANSWER = 30.0


def keeping_disabled() -> bool:
    """$LABCTL_KEEPER=0/off/no: no keeper, whatever the inventory says."""
    return os.environ.get("LABCTL_KEEPER", "").strip().lower() in ("0", "off", "no", "false")


def keeping_always() -> bool:
    """$LABCTL_KEEPER=always: a command that finds no keeper starts one and waits for it, so
    that even the first command goes through it (how the tests run the transport's failure
    cases through the keeper). Otherwise the first command connects itself, and does not
    wait: a cold command is no slower for keeping."""
    return os.environ.get("LABCTL_KEEPER", "").strip().lower() == "always"


# How long a command under LABCTL_KEEPER=always waits for the keeper it started to listen.
KEEPER_START_WAIT = 15.0


class KeeperClient:
    """The keeper of one inventory, as the commands of one run see it."""

    def __init__(self, inventory: Path, persist: float, folder: Path | None = None) -> None:
        self.inventory = str(Path(inventory).absolute())
        self.persist = persist
        self.folder = folder
        self._spawned = False
        self._wanted = False
        self._given_up = False
        self._lock = threading.Lock()

    @property
    def socket_path(self) -> Path:
        return ks.socket_path(Path(self.inventory), self.folder)

    def _connect(self, timeout: float = 2.0) -> socket.socket:
        folder = ks.ensure_dir(self.folder, create=False)
        return ks.connect(ks.socket_path(Path(self.inventory), folder), timeout)

    def request(self, req: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        """One request, one answer (list, close, stop); KeeperUnavailable when no keeper answers."""
        s = self._connect(timeout)
        try:
            ks.send_frame(s, {"v": ks.PROTOCOL, **req})
            answer = ks.recv_frame(s)
        except (OSError, ConnectionError, ValueError) as e:
            raise ks.KeeperUnavailable(f"the keeper did not answer: {e}") from None
        finally:
            ks.close_quietly(s)
        if answer is None:
            raise ks.KeeperUnavailable("the keeper closed without an answer")
        return answer

    def host_request(self, host: Host, op: str, **extra: Any) -> dict[str, Any]:
        return {
            "v": ks.PROTOCOL,
            "op": op,
            "inventory": self.inventory,
            "host": host_to_wire(host),
            "persist": self.persist,
            "ssh_auth_sock": os.environ.get("SSH_AUTH_SOCK", ""),
            **extra,
        }

    def connection(self, host: Host) -> KeptConnection | None:
        """A connection to `host` through the keeper, opened there (a classified TransportError
        when the host cannot be reached); None when there is no keeper to ask, or it declines."""
        if self._given_up or host.connection != "ssh":
            return None
        req = self.host_request(host, "open")
        try:
            answer = self.request(req, timeout=host.connect_timeout + 10)
        except ks.KeeperUnavailable:
            self._start_once()
            if not keeping_always() or not self._wait_for_keeper():
                return None
            try:
                answer = self.request(req, timeout=host.connect_timeout + 10)
            except ks.KeeperUnavailable:
                return None
        if answer.get("t") == "ok":
            return KeptConnection(self, host)
        if answer.get("t") == "error":
            raise error_from_wire(answer, host.name)
        return None  # unwilling: connect directly

    def _start_once(self) -> None:
        with self._lock:
            if self._spawned or self._wanted:
                return
            if not keeping_always():
                # One try per run: this command connects itself, and the keeper starts when it
                # is done (`close`), so a cold command shares no CPU with a starting keeper.
                self._given_up = self._wanted = True
                return
            self._spawned = True
        self._spawn()

    def _spawn(self) -> None:
        try:
            spawn(Path(self.inventory), self.persist, self.folder)
        except (OSError, ks.KeeperUnavailable):
            self._given_up = True

    def close(self) -> None:
        """The command is done: start the keeper it found missing, for the next command."""
        with self._lock:
            start, self._wanted = self._wanted and not self._spawned, False
            self._spawned = self._spawned or start
        if start:
            self._spawn()

    def _wait_for_keeper(self) -> bool:
        """Whether a keeper answers within KEEPER_START_WAIT (LABCTL_KEEPER=always)."""
        deadline = time.monotonic() + KEEPER_START_WAIT
        while time.monotonic() < deadline and not self._given_up:
            try:
                ks.close_quietly(self._connect(1.0))
                return True
            except ks.KeeperUnavailable:
                time.sleep(0.02)
        self._given_up = True
        return False


def spawn(inventory: Path, persist: float, folder: Path | None = None) -> subprocess.Popen[bytes]:
    """Start the inventory's keeper, detached from this command's session and terminal."""
    folder = ks.ensure_dir(folder)
    sock_path = ks.socket_path(inventory, folder)
    env = dict(os.environ)
    # The same labctl as this command, wherever the keeper's working folder is.
    root = str(Path(labctl.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "labctl.keeper.server",
            "--inventory",
            str(Path(inventory).absolute()),
            "--persist",
            repr(float(persist)),
            "--socket",
            str(sock_path),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd="/",
        env=env,
        start_new_session=True,
        close_fds=True,
    )
    # A keeper that leaves while this command still runs (idle, another version's) is reaped
    # here at once rather than left a zombie until the command exits.
    threading.Thread(target=proc.wait, daemon=True, name="keeper-reaper").start()
    return proc


class KeptConnection:
    """transport.base.Connection through the keeper."""

    def __init__(self, client: KeeperClient, host: Host) -> None:
        self.client = client
        self.host = host
        self.name = host.name

    def _lost(self, when: str, why: str = "") -> ConnectionLost:
        h = self.host
        return ConnectionLost(
            f"connection to {h.name} ({h.address}:{h.port}) lost {when}: the connection keeper went away{why}.",
            "Run the command again; `labctl connections` shows what the keeper holds, and "
            "connections: {persist: 0} in the inventory's defaults turns keeping off.",
        )

    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        on_line: LineCallback | None = None,
        cancel: threading.Event | None = None,
        watchdog: bool = True,
        grace: int = GRACE_SECONDS,
    ) -> CommandResult:
        fields = dict(command=command, env=env or None, watchdog=watchdog, grace=grace)
        result = self._exchange("run", fields, timeout, grace, on_line, cancel)
        if result is None:
            raise self._lost("before the command started", " (it declined)")
        return result

    def run_agent(
        self,
        *,
        python: str,
        path: str,
        digest: str,
        argv: list[str],
        read_only: bool,
        timeout: float | None,
        cancel: threading.Event | None,
        on_line: LineCallback | None,
    ) -> CommandResult | None:
        """The agent call in the agent the keeper keeps on the host (keeper/agents.py); None when
        the keeper has none to offer (an older keeper, no agent of that digest there yet)."""
        fields = dict(python=python, path=path, digest=digest, argv=argv, read_only=read_only)
        return self._exchange("agent", fields, timeout, GRACE_SECONDS, on_line, cancel)

    def _exchange(
        self,
        op: str,
        fields: dict[str, Any],
        timeout: float | None,
        grace: int,
        on_line: LineCallback | None,
        cancel: threading.Event | None,
    ) -> CommandResult | None:
        """One command through the keeper: its result, or None if the keeper declined it."""
        start = time.monotonic()
        try:
            s = self.client._connect(self.host.connect_timeout)
        except ks.KeeperUnavailable as e:
            raise self._lost("before the command started", f" ({e})") from None
        try:
            req = self.client.host_request(
                self.host, op, timeout=timeout, stream=on_line is not None, **fields
            )
            try:
                ks.send_frame(s, req)
            except OSError as e:
                raise self._lost("before the command started", f" ({e})") from None
            s.settimeout(0.1)
            give_up = None if timeout is None else start + timeout + grace + LATE_ANSWER
            cancel_sent = False
            reader = _FrameReader(s)
            while True:
                if cancel is not None and cancel.is_set() and not cancel_sent:
                    cancel_sent = True
                    try:
                        ks.send_frame(s, {"op": "cancel"})
                    except OSError:
                        pass
                try:
                    frame = reader.next()
                except (OSError, ConnectionError, ValueError) as e:
                    raise self._lost("while a command ran there", f" ({e})") from None
                if frame is None:
                    if reader.closed:
                        raise self._lost("while a command ran there")
                    if give_up is not None and time.monotonic() > give_up:
                        return CommandResult(None, "", "", time.monotonic() - start, timed_out=True)
                    continue
                t = frame.get("t")
                if t == "line":
                    if on_line is not None:
                        on_line(str(frame.get("s")), str(frame.get("l")))
                elif t == "exit":
                    return CommandResult(
                        rc=frame.get("rc"),
                        stdout=str(frame.get("stdout", "")),
                        stderr=str(frame.get("stderr", "")),
                        seconds=time.monotonic() - start,
                        timed_out=bool(frame.get("timed_out")),
                        cancelled=bool(frame.get("cancelled")),
                        may_still_run=bool(frame.get("may_still_run")),
                    )
                elif t == "error":
                    raise error_from_wire(frame, self.name)
                elif t == "unwilling":
                    return None
                else:
                    raise self._lost("before the command started", f" (it answered {t!r})")
        finally:
            # Ctrl-C, an error, or done: the socket closing is what tells the keeper.
            ks.close_quietly(s)

    def put_bytes(
        self, data: bytes, remote_path: str, mode: int = 0o644, dir_mode: int | None = None
    ) -> None:
        req = self.client.host_request(
            self.host,
            "put",
            data=base64.b64encode(data).decode(),
            path=remote_path,
            mode=mode,
            dir_mode=dir_mode,
        )
        try:
            answer = self.client.request(req, timeout=max(60.0, len(data) / 1e6) + 30)
        except ks.KeeperUnavailable as e:
            raise self._lost("while a file was sent", f" ({e})") from None
        if answer.get("t") == "error":
            raise error_from_wire(answer, self.name)
        if answer.get("t") != "ok":
            raise self._lost("while a file was sent", f" (it answered {answer.get('t')!r})")

    def close(self) -> None:
        pass  # the keeper keeps it: that is the point


class _FrameReader:
    """Frames from a socket with a short timeout, without losing a frame cut by that timeout."""

    def __init__(self, s: socket.socket) -> None:
        self.s = s
        self.buf = bytearray()
        self.closed = False

    def next(self) -> dict[str, Any] | None:
        """The next whole frame, or None if none arrived in time (`closed`: the keeper closed)."""
        import json
        import struct

        while True:
            if len(self.buf) >= 4:
                (n,) = struct.unpack(">I", self.buf[:4])
                if n > ks.MAX_FRAME:
                    raise ConnectionError(f"a frame of {n} bytes")
                if len(self.buf) >= 4 + n:
                    body = bytes(self.buf[4 : 4 + n])
                    del self.buf[: 4 + n]
                    obj = json.loads(body)
                    if not isinstance(obj, dict):
                        raise ConnectionError("a frame that is not a JSON object")
                    return obj
            try:
                chunk = self.s.recv(1 << 20)
            except TimeoutError:
                return None
            if not chunk:
                self.closed = True
                return None
            self.buf += chunk


def list_connections(inventory: Path, folder: Path | None = None) -> dict[str, Any]:
    """The keeper's answer to `list` (KeeperUnavailable when it is not running)."""
    answer = KeeperClient(inventory, 0, folder).request({"op": "list"})
    if answer.get("t") != "list":
        raise ks.KeeperUnavailable(str(answer.get("reason", "the keeper declined")))
    return answer


def close_connections(inventory: Path, host: str | None = None, folder: Path | None = None) -> list[str]:
    answer = KeeperClient(inventory, 0, folder).request({"op": "close", "host": host})
    return [str(h) for h in answer.get("hosts", [])]


def stop(inventory: Path, folder: Path | None = None) -> bool:
    try:
        return KeeperClient(inventory, 0, folder).request({"op": "stop"}).get("t") == "ok"
    except ks.KeeperUnavailable:
        return False


def keeper_state(inventory: Path, persist: float, folder: Path | None = None) -> dict[str, Any]:
    """The inventory's keeper as `labctl connections` and `doctor` report it: whether keeping is
    on, whether a keeper runs (else `reason`), its pid and its connections."""
    state: dict[str, Any] = {
        "inventory": str(Path(inventory).absolute()),
        "persist": persist,
        "enabled": persist > 0 and not keeping_disabled(),
        "running": False,
        "connections": [],
    }
    try:
        ks.ensure_dir(folder, create=False)
    except ks.KeeperUnavailable as e:
        state["reason"] = str(e)
        state["folder_problem"] = (folder or ks.keeper_dir()).exists()
        return state
    try:
        answer = list_connections(inventory, folder)
    except ks.KeeperUnavailable as e:
        state["reason"] = str(e)
        return state
    state.update(running=True, pid=answer.get("pid"), connections=answer.get("connections", []))
    return state
