"""The controller's side of a network transaction (the host's side: labctl/agent/network/txn.py).

`transact` hands a change to the host's keeper, which applies it detached from this session
and reverts it by itself after `revert_after` seconds unless confirmed. labctl then opens a
fresh SSH connection (one made after the change took effect: the old one proves nothing),
verifies the host through it and only then commits. If it cannot get back in, or the
verification fails, it leaves (or asks for) the revert, waits for it, reconnects and reports
whether the host is back on its old config. Hosts are changed one at a time: a wrong change
on two hosts at once could cut labctl off from both, and a person from the lab.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from labctl.hosts.agent_ship import AgentFailed, call_agent
from labctl.hosts.fanout import HostRun
from labctl.output.errors import LabctlError
from labctl.output.progress import QUIET, Progress

if TYPE_CHECKING:
    from labctl.inventory.model import Host
    from labctl.transport.base import Connection

# One network change at a time in this labctl process, whatever the fan_out's parallelism.
NETWORK_CHANGES = threading.Lock()
DEFAULT_REVERT_AFTER = 90.0
REVERT_GRACE = 60.0  # how long after the host's deadline labctl keeps trying to see it back
POLL_S = 0.3
FINAL = ("committed", "reverted", "revert_incomplete")

Verify = Callable[["FreshRun", float], list[str]]


@dataclass
class NetChange:
    """What to change: files to write (path -> text; None removes), commands to run after,
    and the commands that re-apply the restored files when the change is reverted."""

    label: str
    files: dict[str, str | None] = field(default_factory=dict)
    commands: list[list[str]] = field(default_factory=list)
    reapply: list[list[str]] = field(default_factory=list)
    file_mode: int = 0o600
    command_timeout: float | None = (
        None  # per command on the host; default half of revert_after, at most 60 s
    )

    def agent_args(self, txn_id: str, revert_after: float, apply_delay: float) -> dict[str, Any]:
        args: dict[str, Any] = {
            "id": txn_id,
            "label": self.label,
            "revert_after": revert_after,
            "apply_delay": apply_delay,
            "files": {
                p: (None if t is None else {"text": t, "mode": self.file_mode}) for p, t in self.files.items()
            },
            "commands": self.commands,
            "reapply": self.reapply,
        }
        if self.command_timeout is not None:
            args["command_timeout"] = self.command_timeout
        return args


class FreshRun(HostRun):
    """A HostRun over a connection this transaction opened itself, never the pooled one."""

    def __init__(self, run: HostRun, conn: Connection, cancel: threading.Event | None = None) -> None:
        super().__init__(run.ctx, run.host, cancel if cancel is not None else run.cancel)
        self._conn = conn

    @property
    def conn(self) -> Connection:
        return self._conn


@dataclass
class TxnReport:
    host: str
    label: str
    id: str
    revert_after: float
    outcome: str = "unknown"  # committed | reverted | refused | unknown
    seen: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    apply: dict[str, Any] | None = None
    revert: dict[str, Any] | None = None
    differences: list[str] | None = None
    error: str | None = None
    seconds: float = 0.0
    conn: Any = None  # the fresh connection that confirmed the change (not in the JSON)

    @property
    def ok(self) -> bool:
        return self.outcome == "committed"

    @property
    def back(self) -> bool | None:
        """Whether the host was seen back on its old config (None: not seen at all)."""
        return None if self.differences is None else not self.differences

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "label": self.label,
            "id": self.id,
            "outcome": self.outcome,
            "revert_after": self.revert_after,
            "seen": self.seen,
            "problems": self.problems,
            "apply": self.apply,
            "revert": self.revert,
            "back_on_old_config": self.back,
            "differences": self.differences,
            "error": self.error,
            "seconds": round(self.seconds, 3),
        }

    def message(self) -> str:
        """One paragraph for a person: what happened, and where the host is now."""
        h = self.host
        if self.outcome == "committed":
            return f"{h}: {self.label}: applied, confirmed over a fresh connection and committed."
        if self.outcome == "refused":
            return f"{h}: {self.label}: not started: {self.error}"
        why = self.error or "; ".join(self.problems) or "the change was not confirmed"
        failed_step = _failed_step(self.apply)
        if failed_step:
            why = f"the change failed on the host: {failed_step}"
        if self.outcome == "reverted":
            undone = ", ".join((self.revert or {}).get("ran") or []) or "no live change to undo"
            files = ", ".join((self.revert or {}).get("files") or [])
            where = (
                "it is back on its old config (links, addresses and routes match the snapshot taken before)"
            )
            if self.differences:
                where = "it still differs from before: " + "; ".join(self.differences)
            return (
                f"{h}: {self.label}: {why}. The host reverted by itself "
                f"({(self.revert or {}).get('reason', '?')}): {undone}{'; ' + files if files else ''}; {where}."
            )
        return (
            f"{h}: {self.label}: {why}. labctl could not see the host again within "
            f"{self.revert_after + REVERT_GRACE:g} s; its keeper reverts the change at {self.revert_after:g} s "
            "after it started, with no help from labctl."
        )

    def hint(self, again: str) -> str | None:
        """What to do next when the transaction was refused or its end was not seen; `again`
        is how to retry ("run again", "run provision again")."""
        if self.outcome == "refused":
            return (
                f"Wait for the open transaction to end (it reverts by itself at its deadline), then {again}."
            )
        if self.outcome == "unknown":
            from labctl.agent.core.paths import NET_DIR

            return (
                f"Look at {self.host} from its console; the keeper's record is {NET_DIR}/{self.id}/txn.json."
            )
        return None


def _failed_step(apply: dict[str, Any] | None) -> str | None:
    if not apply or apply.get("ok", True):
        return None
    for step in apply.get("steps") or []:
        if step.get("error"):
            return f"{step.get('file')}: {step['error']}"
        if "rc" in step and step["rc"] != 0:
            tail = (step.get("output") or "").strip().splitlines()[-3:]
            cmd = " ".join(step.get("argv") or [])
            return f"`{cmd}` exited {step.get('rc')}" + (f" ({' / '.join(tail)})" if tail else "")
    return "a step failed"


def keep_connection(run: HostRun, report: TxnReport) -> None:
    """After a commit, keep using the pooled connection if it still answers, else the fresh
    one that confirmed the change (a change that moved the host's address kills the old)."""
    fresh = report.conn
    report.conn = None
    if fresh is None:
        return
    try:
        alive = run.conn.run("true", timeout=5.0).rc == 0
    except LabctlError:
        alive = False
    if alive:
        _close(fresh)
    else:
        run.ctx.pool.replace(run.host.name, fresh)


def connect_fresh(host: Host, timeout: float) -> Connection:
    """A new connection to `host`, never the pooled one."""
    from labctl.transport.pool import open_connection

    return open_connection(host, timeout)


def _close(conn: Connection | None) -> None:
    if conn is not None:
        try:
            conn.close()
        except Exception:
            pass


def transact(
    run: HostRun,
    change: NetChange,
    *,
    revert_after: float = DEFAULT_REVERT_AFTER,
    verify: Verify | None = None,
    progress: Progress = QUIET,
    apply_delay: float = 1.0,
) -> TxnReport:
    """Carry `change` out on `run.host` in a transaction; the report says how it ended.
    `progress` hears "seen" (what) as each step happens: the words the report's `seen` keeps.

    Raises only for what happens before the host is touched (it cannot be reached, the agent
    fails); every outcome after the keeper started is in the report.
    """
    with NETWORK_CHANGES:
        return _Transaction(run, change, revert_after, verify, progress, apply_delay).carry_out()


class _Transaction:
    def __init__(
        self,
        run: HostRun,
        change: NetChange,
        revert_after: float,
        verify: Verify | None,
        progress: Progress,
        apply_delay: float,
    ) -> None:
        self.run = run
        self.host = run.host
        self.change = change
        self.verify = verify
        self.progress = progress
        self.apply_delay = apply_delay
        self.id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
        self.report = TxnReport(self.host.name, change.label, self.id, revert_after)
        self.t0 = time.monotonic()
        self.deadline = self.t0 + revert_after
        # Commit only with room left: a commit that lands after the keeper started reverting
        # loses, and the report would have to say so.
        self.margin = max(2.0, min(10.0, revert_after * 0.15))
        # A slow host gets its own connect_timeout, but every try must leave room for the next.
        self.connect_timeout = min(self.host.connect_timeout, max(1.0, revert_after / 6))
        self.lost_said = False

    def saw(self, what: str) -> None:
        self.report.seen.append(f"+{time.monotonic() - self.t0:.1f}s {what}")
        self.progress.event("seen", what=what)

    def left(self) -> float:
        return self.deadline - self.margin - time.monotonic()

    def carry_out(self) -> TxnReport:
        try:
            return self._carry_out()
        finally:
            self.report.seconds = time.monotonic() - self.t0

    def _carry_out(self) -> TxnReport:
        r = self.report
        try:
            call_agent(
                self.run,
                "network.txn_begin",
                self.change.agent_args(self.id, r.revert_after, self.apply_delay),
                timeout=60,
            )
        except AgentFailed as e:
            if e.kind == "busy":
                r.outcome, r.error = "refused", e.message
                return r
            raise
        at = time.strftime("%H:%M:%S", time.localtime(time.time() + r.revert_after))
        self.saw(f"armed: the host reverts by itself at {at} ({r.revert_after:g} s) unless labctl confirms")
        status = self._wait_applied()
        if status is None:
            if not self.run.cancel.is_set():
                r.error = (
                    f"labctl lost contact with {self.host.name} after the change and could not get back in "
                    f"within {r.revert_after - self.margin:.0f} s"
                )
            return self._await_revert(aborted=False)
        r.apply = status.get("apply")
        if status.get("state") != "applied":
            # The keeper gave up on a change that failed and is reverting already: look now,
            # rather than wait out a deadline that no longer applies.
            self.saw(f"the change failed on the host, which reverts it now ({status.get('state')})")
            return self._await_revert(aborted=True)
        self.saw("applied on the host")
        conn = self._reconnect()
        if conn is None:
            if not self.run.cancel.is_set():
                r.error = (
                    f"the change was applied, but labctl could not open a new connection to {self.host.name} "
                    f"within {r.revert_after - self.margin:.0f} s"
                )
            return self._await_revert(aborted=False)
        fresh = FreshRun(self.run, conn)
        try:
            problems = self.verify(fresh, max(1.0, self.left())) if self.verify else []
        except LabctlError as e:
            problems = [f"verification could not run: {e.message}"]
        if self.run.cancel.is_set():
            _close(conn)
            return self._await_revert(aborted=False)
        if problems or self.left() <= 0:
            r.problems = problems or ["verification took past the commit margin"]
            self.saw("verification failed: " + "; ".join(r.problems))
            self._abort(fresh, "; ".join(r.problems))
            _close(conn)
            return self._await_revert(aborted=True)
        try:
            answer = call_agent(
                fresh, "network.txn_commit", {"id": self.id}, timeout=max(1.0, self.left() + self.margin / 2)
            )
        except LabctlError as e:
            # The commit may or may not have landed: the host's record says which.
            self.saw(f"commit unanswered ({e.message}); asking the host what happened")
            _close(conn)
            return self._await_revert(aborted=False, maybe_committed=True)
        if answer.get("committed"):
            r.outcome = "committed"
            r.conn = conn
            self.saw("verified and committed")
            return r
        self.saw(f"commit refused: the host's transaction is {answer.get('state')}")
        _close(conn)
        return self._await_revert(aborted=False)

    def _status(self, conn: Connection, compare: bool = False) -> dict[str, Any]:
        fresh = FreshRun(self.run, conn)
        return dict(
            call_agent(
                fresh,
                "network.txn_status",
                {"id": self.id, "compare": compare},
                timeout=max(2.0, self.connect_timeout * 2),
            )
        )

    def _try_connect(self) -> Connection | None:
        try:
            return connect_fresh(self.host, self.connect_timeout)
        except LabctlError as e:
            if not self.lost_said:
                self.saw(f"cannot reach the host: {e.message}")
                self.lost_said = True
            return None

    def _wait_applied(self) -> dict[str, Any] | None:
        """Poll the host's record (each time over a new connection, once the old one is in
        doubt) until the keeper has applied the change or given up on it."""
        conn: Connection | None = None
        try:
            while self.left() > 0 and not self.run.cancel.is_set():
                if conn is None:
                    conn = self._try_connect()
                    if conn is None:
                        time.sleep(POLL_S)
                        continue
                try:
                    status = self._status(conn)
                except LabctlError as e:
                    if not self.lost_said:
                        self.saw(f"lost contact: {e.message}")
                        self.lost_said = True
                    _close(conn)
                    conn = None
                    continue
                if status.get("state") not in ("armed", "applying"):
                    return status
                time.sleep(POLL_S)
            return None
        finally:
            _close(conn)

    def _reconnect(self) -> Connection | None:
        """A connection opened after the change: the one the verification and commit use."""
        while self.left() > 0 and not self.run.cancel.is_set():
            conn = self._try_connect()
            if conn is not None:
                try:
                    status = self._status(conn)
                except LabctlError:
                    _close(conn)
                    continue
                if status.get("state") == "applied":
                    self.saw("reconnected over a fresh SSH connection")
                    return conn
                _close(conn)
                return None
            time.sleep(POLL_S)
        return None

    def _abort(self, fresh: FreshRun, reason: str) -> None:
        try:
            call_agent(fresh, "network.txn_abort", {"id": self.id, "reason": reason}, timeout=10)
            self.saw("asked the host to revert now")
        except LabctlError as e:
            self.saw(f"could not ask for the revert ({e.message}); the keeper reverts at its deadline")

    def _await_revert(self, aborted: bool, maybe_committed: bool = False) -> TxnReport:
        """Wait for the keeper to finish (at its deadline, sooner when aborted), then look."""
        r = self.report
        if self.run.cancel.is_set():
            conn = self._try_connect()
            if conn is not None:
                self._abort(FreshRun(self.run, conn, threading.Event()), "labctl was interrupted")
                _close(conn)
            r.error = "interrupted; the host's keeper reverts the change by itself"
            self.saw(r.error)
            return r
        if not aborted and not maybe_committed:
            self.saw(f"waiting for the host to revert by itself (at {r.revert_after:g} s)")
        end = self.deadline + REVERT_GRACE
        self.lost_said = False
        while time.monotonic() < end:
            if not aborted and not maybe_committed and time.monotonic() < self.deadline:
                time.sleep(min(1.0, max(0.0, self.deadline - time.monotonic())))
                continue
            conn = self._try_connect()
            if conn is None:
                time.sleep(1.0)
                continue
            try:
                status = self._status(conn, compare=True)
            except LabctlError:
                _close(conn)
                time.sleep(1.0)
                continue
            state = status.get("state")
            if state == "committed":
                r.outcome, r.conn = "committed", conn
                self.saw("the host had committed the change")
                return r
            if state in FINAL:
                _close(conn)
                r.outcome = "reverted"
                r.apply = status.get("apply") or r.apply
                r.revert = status.get("revert")
                r.differences = list(status.get("differences") or [])
                self.saw(
                    "reconnected after the revert: "
                    + ("back on its old config" if not r.differences else "; ".join(r.differences))
                )
                return r
            _close(conn)
            time.sleep(1.0)
        r.outcome = "unknown"
        self.saw("the host did not come back")
        return r
