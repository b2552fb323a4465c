"""What every connection offers, the result of a command, and classified failures."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from labctl.errors import HostError

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

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out and not self.cancelled


class TransportError(HostError):
    """A failure reaching or using a host; `status` is the recap's word for it."""

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


class CommandTimeout(TransportError):
    status = "timeout"


class Cancelled(TransportError):
    status = "cancelled"


class Connection(Protocol):
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
    ) -> CommandResult: ...

    def put_bytes(self, data: bytes, remote_path: str, mode: int = 0o644) -> None: ...

    def close(self) -> None: ...


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
