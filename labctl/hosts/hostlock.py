"""One changing run per host at a time: `labctl provision`, and the orchestra's rotation.

Two runs at once would both read the host's state before either changed it, and both apply
(two tmpfs mounts stacked on one cache path; two rotations starting the same model). A
changing run holds the host's lock (the agent's `provision.host_lock`, a flock held by a process on its
own channel) from before it reads the host's state until the host is done, so a second run
plans from what the first one left. The second run waits, saying for whom, and after `wait`
seconds gives up naming the holder. `--check` changes nothing and takes no lock.
"""

from __future__ import annotations

import getpass
import os
import socket
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from labctl.output.errors import HostError, LabctlError
from labctl.output.progress import QUIET, Progress

if TYPE_CHECKING:
    from labctl.hosts.fanout import HostRun

LOCK_WAIT = 600.0  # seconds a run waits for another run on the same host
HOLD_FOREVER = 30 * 24 * 3600.0  # the lock lives as long as the run; its channel ends it


@dataclass(frozen=True)
class LockKind:
    """Which lock: its file on the host (None: the agent's provision lock), who holds it, and
    the words a waiting or refused run is told."""

    command: str  # as the holder records itself: "labctl provision"
    doing: str  # "is changing this host"
    busy: str  # "is being provisioned by another run"
    hint: str
    wait_env: str  # another wait, in seconds (tests use a short one)
    path: str | None = None


PROVISION = LockKind(
    "labctl provision",
    "is changing this host",
    "is being provisioned by another run",
    "Let that run finish (or stop it), then run again. `labctl provision --check` takes no lock.",
    "LABCTL_PROVISION_LOCK_WAIT",
)
LOCK_WAIT_ENV = PROVISION.wait_env


def describe(holder: dict[str, Any]) -> str:
    """`labctl provision pid 123 on laptop (root), holding it since 2026-01-02 13:20:05`, from
    what the holder recorded."""
    if not holder:
        return "a run that has not said who it is yet"
    when = holder.get("locked_at") or holder.get("started")
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if isinstance(when, (int, float)) else "?"
    user = f" ({holder['user']})" if holder.get("user") else ""
    return f"{holder.get('command', 'labctl')} pid {holder.get('pid', '?')} on {holder.get('controller', '?')}{user}, holding it since {at}"


def waiting_text(host: str, command: str, doing: str, holder: str, wait: float) -> str:
    """The "waiting" event said in words; each command shows it in its own style."""
    return f"{host}: another {command} {doing} ({holder}); waiting for it, up to {wait:g} s"


class HostLock:
    """`with HostLock(run):` the host's provision lock (or `kind`'s) is held for the block."""

    def __init__(
        self,
        run: HostRun,
        wait: float | None = None,
        progress: Progress = QUIET,
        kind: LockKind = PROVISION,
    ) -> None:
        self.run = run
        self.kind = kind
        self.wait = wait if wait is not None else _wait_from_env(kind.wait_env)
        self.progress = progress
        self.release = threading.Event()
        self.locked = threading.Event()
        self.ended = threading.Event()
        self.holder: dict[str, Any] = {}
        self.error: LabctlError | None = None
        self.thread = threading.Thread(target=self._hold, daemon=True, name=f"lock-{run.host.name}")

    def _hold(self) -> None:
        from labctl.hosts.agent_ship import call_agent
        from labctl.hosts.fanout import on_host

        me = {**_me(), "command": self.kind.command, "user": _user()}
        args: dict[str, Any] = {"holder": me, "wait": self.wait}
        if self.kind.path:
            args["path"] = self.kind.path
        try:
            on_host(
                self.run.ctx,
                self.run.host,
                lambda r: call_agent(
                    r,
                    "provision.host_lock",
                    args,
                    timeout=HOLD_FOREVER,
                    on_line=self._line,
                ),
                self.release,
            )
        except LabctlError as e:
            self.error = e
        finally:
            self.ended.set()

    def _line(self, stream: str, line: str) -> None:
        from labctl.hosts.agent_ship import agent_event

        event = agent_event(stream, line)
        if event is None:
            return
        if event.get("event") in ("waiting", "busy"):
            holder = event.get("holder")
            self.holder = holder if isinstance(holder, dict) else {}
        if event.get("event") == "waiting":
            self.progress.event(
                "waiting",
                host=self.run.host.name,
                command=self.kind.command,
                doing=self.kind.doing,
                holder=describe(self.holder),
                wait=self.wait,
            )
        elif event.get("event") == "locked":
            self.locked.set()

    def __enter__(self) -> HostLock:
        from labctl.hosts.agent_ship import AgentFailed

        self.thread.start()
        while not self.locked.wait(0.1):
            if self.run.cancel.is_set():
                self._stop()
                raise HostError(
                    f"{self.run.host.name}: cancelled while waiting for the host's lock ({self.kind.command})."
                )
            if self.ended.is_set() and not self.locked.is_set():
                err = self.error
                if isinstance(err, AgentFailed) and err.kind == "busy":
                    raise HostError(
                        f"{self.run.host.name} {self.kind.busy} ({describe(self.holder)}); "
                        f"waited {self.wait:g} s for it.",
                        self.kind.hint,
                    )
                raise err or HostError(f"{self.run.host.name}: the host's lock ended before it was taken.")
        return self

    def _stop(self) -> None:
        self.release.set()  # the channel closes; the host's watchdog ends the holder, and the flock with it
        self.thread.join(10)

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop()


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def _me() -> dict[str, Any]:
    """Who this run is, as the host records it for a run that finds the lock taken."""
    return {"controller": socket.gethostname(), "pid": os.getpid(), "started": _STARTED}


_STARTED = round(time.time(), 3)


def _wait_from_env(name: str) -> float:
    raw = os.environ.get(name)
    try:
        wait = float(raw) if raw else LOCK_WAIT
    except ValueError:
        wait = LOCK_WAIT
    return wait if 0 <= wait < float("inf") else LOCK_WAIT
