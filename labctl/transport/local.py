"""`connection: local`: run on this machine with no SSH, same interface as SSHConnection."""

from __future__ import annotations

import errno
import os
import selectors
import signal
import subprocess
import threading
import time
from pathlib import Path

from labctl.agent.core.fsutil import write_atomic
from labctl.inventory.model import Host
from labctl.transport.base import CommandResult, LineCallback, LineSplitter, file_error
from labctl.transport.shell import check_env
from labctl.transport.wrap import GRACE_SECONDS


class LocalConnection:
    def __init__(self, host: Host) -> None:
        self.host = host
        self.name = host.name

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
        # No watchdog here (`watchdog`, `grace`): it ends a command when an SSH channel's stdin
        # closes, and this command's stdin is /dev/null. Its own session stands in for it: a
        # timeout, Ctrl-C or another host's failure stop that session.
        start = time.monotonic()
        # The rule SSHConnection's `export` applies: 'A=B' or 'A;id' is bad input, not a Popen error.
        full_env = {**os.environ, **check_env(env or {}, "the command environment")}
        # Its own session, so a timeout or Ctrl-C can stop everything it started.
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            start_new_session=True,
        )
        assert proc.stdout is not None and proc.stderr is not None
        splitters = {
            proc.stdout: LineSplitter("stdout", on_line),
            proc.stderr: LineSplitter("stderr", on_line),
        }
        sel = selectors.DefaultSelector()
        for f in splitters:
            sel.register(f, selectors.EVENT_READ)
        deadline = None if timeout is None else start + timeout
        timed_out = cancelled = False
        open_streams = 2
        while open_streams:
            for key, _ in sel.select(0.1):
                data = os.read(key.fd, 65536)
                if data:
                    splitters[key.fileobj].feed(data)  # type: ignore[index]
                else:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
            if cancel is not None and cancel.is_set():
                cancelled = True
                break
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                break
        sel.close()
        if timed_out or cancelled:
            _kill_group(proc)
        rc = proc.wait()
        return CommandResult(
            rc=None if (timed_out or cancelled) else rc,
            stdout=splitters[proc.stdout].finish(),
            stderr=splitters[proc.stderr].finish(),
            seconds=time.monotonic() - start,
            timed_out=timed_out,
            cancelled=cancelled,
        )

    def put_bytes(
        self, data: bytes, remote_path: str, mode: int = 0o644, dir_mode: int | None = None
    ) -> None:
        path = Path(remote_path)
        try:
            if dir_mode is not None:
                path.parent.mkdir(mode=dir_mode, parents=True, exist_ok=True)
                if path.parent.stat().st_mode & 0o7777 != dir_mode:
                    path.parent.chmod(dir_mode)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(str(path), data, mode=mode)
        except OSError as e:
            raise file_error(
                self.name,
                e.filename or str(path.parent),
                errno.errorcode.get(e.errno or 0, ""),
                e.strerror or str(e),
            ) from None

    def close(self) -> None:
        pass


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=3)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
