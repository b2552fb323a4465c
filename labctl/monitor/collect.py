"""One `monitor.status` sample from every host, with its alerts: what `labctl status` (also `--watch`),
`labctl metrics` and `labctl doctor` show.

One agent call per host through fan_out on the context's pool: the connections stay open
between calls on the same context, so a `--watch` refresh costs one round trip per host, not
a new SSH handshake. A host that fails is reported (reachable=False, its error and hint) and
never raises; its pooled connection is dropped, so the next round connects afresh (a host
that went down and came back is seen again). A Windows host is not sampled: reachable, no
sample, and an error that starts with "skipped:".
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from labctl.hosts.fanout import HostResult, HostRun, Skipped, fan_out
from labctl.monitor.alerts import Alert, AlertRules, evaluate

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.inventory.model import Host

STATUS_TIMEOUT_S = 30.0


@dataclass
class HostStatus:
    host: str
    reachable: bool
    sample: Optional[dict[str, Any]]
    alerts: list[Alert] = field(default_factory=list)
    error: Optional[str] = None
    hint: Optional[str] = None
    seconds: float = 0.0
    # fan_out's word for the host: "ok", "skipped", or why there is no sample ("unreachable",
    # "timeout", "failed" for a host that answered what labctl cannot read, ...).
    status: str = ""

    def __post_init__(self) -> None:
        if not self.status:
            self.status = "ok" if self.sample is not None else "skipped" if self.reachable else "unreachable"

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "status": self.status,
            "reachable": self.reachable,
            "sample": self.sample,
            "alerts": [a.to_json() for a in self.alerts],
            "error": self.error,
            "hint": self.hint,
            "seconds": round(self.seconds, 3),
        }


def status_args(host: Host, record: bool = True) -> dict[str, Any]:
    """The agent's `monitor.status` arguments for `host`: its model cache, and its name (hosts of the
    simulated lab share one kernel, so a run's processes are told apart by LABCTL_HOST)."""
    cache = host.model_cache.path if host.model_cache is not None else None
    return {"cache_path": str(cache) if cache else None, "record": record, "host": host.name}


_declaration_read = threading.Event()


def _read_declaration_meanwhile() -> None:
    """Read monitor.status's declared answer on a thread of its own while the hosts work.

    call_agent checks each answer against it where it arrives, and reading it imports the
    agent's command table and handler module (~50 ms of CPU): done by the first answer, that
    import held every host's result back; done now, it overlaps the round trips. Once a process."""
    if _declaration_read.is_set():
        return
    _declaration_read.set()

    def read() -> None:
        try:
            from labctl.agent.commands import declared

            declared("monitor.status")
        except Exception:  # only a head start: call_agent reads it again and reports what fails
            pass

    threading.Thread(target=read, name="status-declaration", daemon=True).start()


def collect(ctx: Context, hosts: Sequence[Host], rules: AlertRules, record: bool = True) -> list[HostStatus]:
    """A HostStatus per host, in `hosts` order; never raises for a host's failure."""
    from labctl.hosts.agent_ship import call_agent

    def step(run: HostRun) -> HostResult:
        if run.host.is_windows:
            raise Skipped("skipped: windows (the status agent is Linux-only)")
        data = call_agent(run, "monitor.status", status_args(run.host, record), timeout=STATUS_TIMEOUT_S)
        # Judged here, in the host's own step: whatever its sample holds stays that host's problem.
        return HostResult(
            run.host.name, "ok", data=data, extra={"alerts": evaluate(run.host.name, data, rules)}
        )

    _read_declaration_meanwhile()
    results = fan_out(ctx, hosts, step, label="status", progress=False)
    out = []
    for r in results:
        if r.status == "ok" and isinstance(r.data, dict):
            out.append(HostStatus(r.host, True, r.data, r.extra["alerts"], None, None, r.seconds, "ok"))
            continue
        if r.status != "skipped":
            # A half-broken connection (a host that rebooted, a channel that timed out) must
            # not be reused by the next round.
            ctx.pool.drop(r.host)
        out.append(HostStatus(r.host, r.status == "skipped", None, [], r.error, r.hint, r.seconds, r.status))
    return out
