"""Agents kept running on the hosts, one per kept connection: the keeper's side of `agent --serve`.

A direct agent call starts the host's Python, loads the agent and its command's modules, and
runs one command: on a kept connection that start-up is most of what a call costs the host.
So the keeper starts the agent once, on an SSH channel of its own (labctl/agent/core/serve.py), and
sends it each call; the agent forks a child per call that runs the command exactly as a direct
call would. What the caller sees is the same CommandResult as from `conn.run(BOOT line)`:
output as it comes, the exit code, a timeout or a cancel. A cancelled or timed-out call has its
process group ended by the agent (TERM, then KILL), as the remote watchdog does for a direct
call; the channel closing (the connection, or the keeper, gone) ends every call it carries.

A session that cannot start (no agent of that digest on the host yet, an old Python, a
read-only call where the agent is not extracted) answers None, and the call goes the direct way.
"""

from __future__ import annotations

import base64
import json
import queue
import struct
import threading
import time
from typing import Any

from labctl.transport.base import CommandResult, LineCallback, LineSplitter

START_TIMEOUT = 15.0  # the host's Python and the agent's imports, on a loaded host
MAX_FRAME = 64 * 1024 * 1024


class SessionUnavailable(Exception):
    """The kept agent could not be started (no agent of that digest there yet, ...) or has gone."""


class AgentSession:
    """One `agent --serve` on one channel of an SSH connection (transport.ssh.SSHConnection)."""

    def __init__(self, conn: Any, line: str) -> None:
        self.conn = conn
        self.line = line
        self.chan: Any = None
        self.pid: int | None = None
        self.calls = 0
        self.retired = False
        self.dead = threading.Event()
        self._ready = threading.Event()
        self._send = threading.Lock()
        self._guard = threading.Lock()
        self._waiters: dict[int, queue.Queue[dict[str, Any] | None]] = {}
        self._next = 0

    # -- life -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Open the channel and wait for the agent's `ready` (SessionUnavailable if it never says it)."""
        client = getattr(self.conn, "_client", None)
        transport = client.get_transport() if client is not None else None
        if transport is None or not transport.is_active():
            raise SessionUnavailable("the connection is closed")
        try:
            self.chan = transport.open_session(timeout=self.conn.connect_timeout)
            self.chan.exec_command(self.line)
        except Exception as e:
            raise SessionUnavailable(f"could not start it: {e}") from None
        threading.Thread(target=self._reader, daemon=True, name="keeper-agent").start()
        deadline = time.monotonic() + START_TIMEOUT
        while not self._ready.wait(0.05):
            if self.dead.is_set() or time.monotonic() > deadline:
                self.chan.status_event.wait(1.0)  # the exit status may follow the end of output
                rc = self.chan.exit_status if self.chan.exit_status_ready() else None
                self.close()
                raise SessionUnavailable(f"it did not start (rc {rc})")

    def usable(self) -> bool:
        return self._ready.is_set() and not self.dead.is_set() and not self.retired

    def retire(self) -> None:
        """No new calls here: the agent leaves once the calls it runs are done (they are not cut short)."""
        if self.retired or self.dead.is_set():
            return
        self.retired = True
        try:
            self._frame({"id": 0, "retire": True})
        except OSError:
            pass

    def close(self) -> None:
        """Closing the channel closes the agent's stdin: it ends its calls and exits."""
        self.dead.set()
        if self.chan is not None:
            try:
                self.chan.close()
            except Exception:
                pass
        with self._guard:
            waiters = list(self._waiters.values())
        for q in waiters:
            q.put(None)

    def _reader(self) -> None:
        buf = b""
        try:
            while True:
                data = self.chan.recv(1 << 16)
                if not data:
                    break
                buf += data
                while len(buf) >= 4:
                    (n,) = struct.unpack(">I", buf[:4])
                    if n > MAX_FRAME:
                        raise ValueError(f"a frame of {n} bytes")
                    if len(buf) < 4 + n:
                        break
                    frame, buf = json.loads(buf[4 : 4 + n]), buf[4 + n :]
                    self._dispatch(frame)
        except Exception:
            pass
        self.close()

    def _dispatch(self, frame: dict[str, Any]) -> None:
        if "ready" in frame:
            self.pid = int(frame["ready"])
            self._ready.set()
            return
        with self._guard:
            q = self._waiters.get(int(frame.get("id", -1)))
        if q is not None:
            q.put(frame)

    def _frame(self, obj: dict[str, Any]) -> None:
        body = json.dumps(obj).encode()
        with self._send:
            self.chan.sendall(struct.pack(">I", len(body)) + body)

    # -- one call -------------------------------------------------------------------------------

    def call(
        self,
        argv: list[str],
        *,
        read_only: bool,
        timeout: float | None,
        on_line: LineCallback | None,
        cancel: threading.Event,
    ) -> CommandResult:
        """Run one agent command; SessionUnavailable when the session was gone before it started."""
        return self._call({"argv": argv, "ro": read_only}, timeout, on_line, cancel)

    def shell(
        self,
        command: str,
        *,
        grace: float,
        timeout: float | None,
        on_line: LineCallback | None,
        cancel: threading.Event,
    ) -> CommandResult:
        """Run a shell command (`sh -c`) as the remote watchdog would (transport/wrap.py): its own
        process group, stdin /dev/null, ended with TERM then KILL after `grace` when cancelled,
        timed out, or when the connection goes. SessionUnavailable as `call`."""
        return self._call({"sh": command, "grace": grace}, timeout, on_line, cancel)

    def _call(
        self,
        fields: dict[str, Any],
        timeout: float | None,
        on_line: LineCallback | None,
        cancel: threading.Event,
    ) -> CommandResult:
        start = time.monotonic()
        q: queue.Queue[dict[str, Any] | None] = queue.Queue()
        with self._guard:
            self._next += 1
            cid = self._next
            self._waiters[cid] = q
        try:
            if not self.usable():
                raise SessionUnavailable("the kept agent has gone")
            self.calls += 1
            try:
                self._frame({"id": cid, **fields})
            except OSError as e:
                self.close()
                raise SessionUnavailable(f"could not reach the kept agent: {e}") from None
            out, err = LineSplitter("stdout", on_line), LineSplitter("stderr", on_line)
            deadline = None if timeout is None else start + timeout
            while True:
                stop = "cancelled" if cancel.is_set() else None
                if stop is None and deadline is not None and time.monotonic() > deadline:
                    stop = "timed_out"
                if stop is not None:
                    try:
                        self._frame({"id": cid, "cancel": True})
                    except OSError:
                        pass  # the channel is gone: the agent ends every call it carried
                    return CommandResult(
                        None,
                        out.finish(),
                        err.finish(),
                        time.monotonic() - start,
                        timed_out=stop == "timed_out",
                        cancelled=stop == "cancelled",
                    )
                try:
                    frame = q.get(timeout=0.05)
                except queue.Empty:
                    continue
                if frame is None:
                    why = "; its kept agent ended" if self.conn_alive() else ""
                    raise self.conn._lost("while a command ran there", why)
                if frame.get("stale"):
                    self.retired = True  # it leaves once its other calls are done
                    raise SessionUnavailable("the kept agent's files changed on disk")
                if "rc" in frame:
                    return CommandResult(
                        int(frame["rc"]), out.finish(), err.finish(), time.monotonic() - start
                    )
                (out if frame.get("s") == "o" else err).feed(base64.b64decode(frame.get("d", "")))
        finally:
            with self._guard:
                self._waiters.pop(cid, None)

    def conn_alive(self) -> bool:
        client = getattr(self.conn, "_client", None)
        transport = client.get_transport() if client is not None else None
        return transport is not None and transport.is_active()
