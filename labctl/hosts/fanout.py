"""Run one step on many hosts at once and collect a result per host.

A host that fails never stops the others. Ctrl-C cancels every host's step (their remote
commands die with their channels, see transport/wrap.py) and is re-raised so the CLI
exits 130. Every command that touches hosts goes through `fan_out`, or `on_host` for a call
on one host whose value (or error) the caller needs itself.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from labctl.inventory.model import Host
from labctl.output.errors import LabctlError
from labctl.transport.base import TransportError
from labctl.transport.localfiles import check_local_files

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.transport.base import Connection

OK_STATUSES = frozenset({"ok", "changed", "skipped"})
T = TypeVar("T")


@dataclass
class HostResult:
    host: str
    status: str
    seconds: float = 0.0
    rc: int | None = None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    hint: str | None = None
    data: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status in OK_STATUSES

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        extra = d.pop("extra")
        d.update(extra)
        return d


class Skipped(Exception):
    """Raised by a step to report `skipped` with a reason (e.g. "windows")."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a fan_out, with the results the hosts had reached (the CLI's message uses them)."""

    def __init__(self, results: Sequence[HostResult]) -> None:
        super().__init__()
        self.results = list(results)

    @property
    def may_still_run(self) -> list[str]:
        """Hosts where closing the session may not have stopped the command (see CommandResult)."""
        return [r.host for r in self.results if r.extra.get("may_still_run")]


class HostRun:
    """What a step gets: its host, a lazily opened connection, and the cancel flag."""

    def __init__(self, ctx: Context, host: Host, cancel: threading.Event) -> None:
        self.ctx = ctx
        self.host = host
        self.cancel = cancel

    @property
    def conn(self) -> Connection:
        return self.ctx.pool.get(self.host)


Step = Callable[[HostRun], HostResult]


def on_host(ctx: Context, host: Host, fn: Callable[[HostRun], T], cancel: threading.Event | None = None) -> T:
    """`fn` on one host, in this thread: its value, or its LabctlError raised as it is.

    `fn` gets what a fan_out step gets: the host's pooled connection and a cancel flag (`cancel`,
    e.g. the calling step's own, or a new one). A connection that failed leaves the pool, so
    the next call on that host connects again.
    """
    try:
        return fn(HostRun(ctx, host, cancel if cancel is not None else threading.Event()))
    except TransportError:
        ctx.pool.drop(host.name)
        raise
    except LabctlError:
        raise
    except Exception as e:
        named = _named(host, e)
        if named is None:
            raise
        if named.status == "unreachable":
            ctx.pool.drop(host.name)
        raise named from None


def _run_one(ctx: Context, host: Host, step: Step, cancel: threading.Event) -> HostResult:
    start = time.monotonic()
    try:
        result = on_host(ctx, host, step, cancel)
    except Skipped as e:
        result = HostResult(host.name, "skipped", error=str(e))
    except TransportError as e:
        result = HostResult(host.name, e.status, error=e.message, hint=e.hint)
    except LabctlError as e:
        result = HostResult(host.name, "failed", error=e.message, hint=e.hint)
    except Exception as e:  # a bug in a step must not take the other hosts down with it
        detail = traceback.format_exc() if ctx.verbose else ""
        result = HostResult(
            host.name,
            "failed",
            error=f"internal error: {type(e).__name__}: {e}",
            hint=detail or "Re-run with -v for the traceback and report it.",
        )
    return _finish(result, cancel, start)


def _finish(result: HostResult, cancel: threading.Event, start: float) -> HostResult:
    if cancel.is_set() and result.status not in OK_STATUSES:
        result.status = "cancelled"
    result.seconds = time.monotonic() - start
    return result


def _named(host: Host, e: Exception) -> TransportError | None:
    """What an exception that escaped a step means, when it can be named: a lost connection
    (a socket or paramiko error, EOF), or a full or read-only disk on this machine."""
    import errno

    from labctl.output.errors import DISK_FULL, NOT_WRITABLE
    from labctl.transport.base import ConnectionLost

    name = errno.errorcode.get(getattr(e, "errno", None) or 0, "")
    if isinstance(e, OSError) and (name in DISK_FULL or name in NOT_WRITABLE):
        return TransportError(
            f"{host.name}: {'disk full' if name in DISK_FULL else 'not writable'} on this machine, "
            f"writing {e.filename or 'a file'} ({e.strerror}).",
            "Free space or fix that folder's permissions on this machine, then run the command again.",
        )
    # paramiko's "Socket is closed" is a bare OSError with no errno.
    lost = isinstance(e, (ConnectionError, TimeoutError, EOFError)) or (
        type(e) is OSError and e.errno is None
    )
    if lost or type(e).__module__.startswith("paramiko"):
        reason = (e.strerror if isinstance(e, OSError) else None) or str(e) or type(e).__name__
        return ConnectionLost(
            f"connection to {host.name} ({host.address}:{host.port}) lost: {reason}.",
            "Check that the host is up and on the network, then run the command again.",
        )
    return None


def fan_out(
    ctx: Context,
    hosts: Sequence[Host],
    step: Step,
    *,
    max_workers: int | None = None,
    label: str = "working",
    progress: bool = True,
) -> list[HostResult]:
    """Run `step` on every host in parallel; results come back in `hosts` order."""
    cancel = threading.Event()
    results: dict[str, HostResult] = {}
    limit = threading.Semaphore(max_workers or max(1, min(len(hosts), 64)))
    done = threading.Event()
    lock = threading.Lock()

    def worker(h: Host) -> None:
        with limit:
            try:
                r = (
                    HostResult(h.name, "cancelled", error="cancelled before it started")
                    if cancel.is_set()
                    else _run_one(ctx, h, step, cancel)
                )
            except BaseException as e:
                # SystemExit (rich raises it on a broken pipe) would end this thread silently,
                # and fan_out would wait for its result for ever.
                r = HostResult(h.name, "failed", error=f"internal error: {type(e).__name__}: {e}")
        with lock:
            results[h.name] = r
            if len(results) == len(hosts):
                done.set()

    if not hosts:
        return []
    # A bad ssh_key or known_hosts is the user's input: said once (exit 2), before any host is contacted.
    check_local_files(hosts)
    # Daemon threads: a host stuck in a connect cannot hold the process after Ctrl-C.
    threads = [threading.Thread(target=worker, args=(h,), daemon=True, name=f"host-{h.name}") for h in hosts]
    show = progress and ctx.console.is_terminal
    try:
        for t in threads:
            t.start()
        if show:
            _wait_with_progress(ctx, hosts, results, done, lock, label)
        else:
            while not done.wait(0.1):
                pass
    except KeyboardInterrupt:
        cancel.set()
        deadline = time.monotonic() + 5
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with lock:
            so_far = [results[h.name] for h in hosts if h.name in results]
        raise Interrupted(so_far) from None
    return [results[h.name] for h in hosts]


def _wait_with_progress(
    ctx: Context,
    hosts: Sequence[Host],
    results: dict[str, HostResult],
    done: threading.Event,
    lock: threading.Lock,
    label: str,
) -> None:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=ctx.console,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=len(hosts))
        while not done.wait(0.1):
            with lock:
                waiting = [h.name for h in hosts if h.name not in results]
                n = len(results)
            bar.update(
                task,
                completed=n,
                description=f"{label} ({', '.join(waiting[:4])}{'…' if len(waiting) > 4 else ''})",
            )


def exit_code(results: Sequence[HostResult]) -> int:
    return 0 if all(r.ok for r in results) else 1
