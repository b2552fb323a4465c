"""What every connection offers (`Connection`), the result of a command, and classified failures."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from labctl.output.errors import DISK_FULL, NOT_WRITABLE, HostError
from labctl.transport.wrap import GRACE_SECONDS

# Called with ("stdout" | "stderr", line without its newline) as output arrives.
LineCallback = Callable[[str, str], None]


@dataclass
class CommandResult:
    rc: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    cancelled: bool = False
    # Timed out or cancelled where closing the channel does not stop the command (Windows).
    may_still_run: bool = False

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out and not self.cancelled


def still_running_hint(host: str) -> str:
    """How to find and end a command that may outlive its session on a Windows host."""
    return (
        f"Look for it with `labctl exec -l {host} -- tasklist /v` and end it with "
        f"`labctl exec -l {host} -- taskkill /T /F /PID PID`."
    )


class TransportError(HostError):
    """A failure reaching or using a host; `monitor.status` is the recap's word for it."""

    status = "failed"


class Unreachable(TransportError):
    status = "unreachable"


class AuthFailed(TransportError):
    status = "auth"


class HostKeyError(TransportError):
    status = "hostkey"

    def __init__(self, message: str, hint: str, offered: str = "", pinned: str = "") -> None:
        super().__init__(message, hint)
        self.offered = offered
        self.pinned = pinned


class ConnectionLost(Unreachable):
    """The SSH session went away while a command or an upload was under way."""


class CommandTimeout(TransportError):
    status = "timeout"


class Cancelled(TransportError):
    status = "cancelled"


@runtime_checkable
class Connection(Protocol):
    """What every transport (SSHConnection, LocalConnection) offers, and all its users may
    call: the pool and `HostRun.conn` hand connections out as this type, so mypy checks each
    transport against it and no caller leans on one transport's extras."""

    name: str

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
    ) -> CommandResult: ...

    def put_bytes(
        self, data: bytes, remote_path: str, mode: int = 0o644, dir_mode: int | None = None
    ) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class KeptAgent(Protocol):
    """A connection that can run an agent call in an agent kept running on the host (the
    keeper's KeptConnection, labctl/keeper/agents.py): the same CommandResult as running the
    BOOT line with `run`, or None when it has no such agent to offer (then the caller runs it)."""

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
    ) -> CommandResult | None: ...


def file_error(host: str, path: str, errno_name: str, reason: str) -> HostError:
    """A write on `host` under `path` that failed with `errno_name`, named with its fix."""
    where = f"{host}:{path}" if path else host
    df = f"df -h {path}" if path else "df -h"
    if errno_name in DISK_FULL:
        return HostError(
            f"disk full on {where} ({reason}).",
            f"Free space there (`labctl exec -l {host} -- {df}` shows what is left), then run the "
            "command again: nothing half-written was kept.",
        )
    if errno_name in NOT_WRITABLE:
        return HostError(
            f"{where} is not writable ({reason}).",
            "Make it writable for the SSH user (a read-only mount: `mount -o remount,rw`; else its "
            "owner and mode), then run the command again.",
        )
    return HostError(
        f"{host}: cannot write {path}: {reason}.", "Check that folder on the host, then run again."
    )


class LineSplitter:
    """Turns chunks of bytes into whole lines for `on_line`, and keeps the full text."""

    def __init__(self, stream: str, on_line: LineCallback | None) -> None:
        self.stream = stream
        self.on_line = on_line
        self.chunks: list[bytes] = []
        self._partial = b""

    def feed(self, data: bytes) -> None:
        self.chunks.append(data)
        if self.on_line is None:
            return
        buf = self._partial + data
        *lines, self._partial = buf.split(b"\n")
        for line in lines:
            self.on_line(self.stream, line.decode("utf-8", "replace").rstrip("\r"))

    def finish(self) -> str:
        if self.on_line is not None and self._partial:
            self.on_line(self.stream, self._partial.decode("utf-8", "replace"))
            self._partial = b""
        return b"".join(self.chunks).decode("utf-8", "replace")
