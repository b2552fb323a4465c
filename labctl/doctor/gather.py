"""What doctor asks the hosts, through the agent commands that already exist.

One round per host (fan_out): a clock read (`ping`, timed on this side too), `facts.collect` with
torch, labctl's scheduled jobs (`cron.list`: what is installed and whether a daemon runs it),
and `sandbox.images` where the host runs sandboxes. Then one short `bench network`
between two of the hosts for bandwidth and latency. Nothing here judges what came back.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labctl.output.errors import LabctlError

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.hosts.fanout import HostRun
    from labctl.inventory.model import Host
    from labctl.monitor.alerts import Alert, AlertRules

PROBE_SECONDS = 1.0  # long enough for a rate on a 1 Gbit link, short enough to run every time


@dataclass
class Clock:
    """The host's time.time() read between two reads of this machine's clock."""

    before: float
    host: float
    after: float


@dataclass
class HostFound:
    host: Host
    facts: dict[str, Any] | None = None
    clock: Clock | None = None
    images: list[dict[str, Any]] | None = None
    images_error: str | None = None
    alerts: list[Alert] | None = None  # seed 004's alerts firing on this host (None: not sampled)
    alerts_error: str | None = None
    cron: dict[str, Any] | None = None  # cron.list's answer: labctl's jobs and the daemons running
    cron_error: str | None = None
    error: str | None = None  # the host could not be asked at all
    hint: str | None = None
    skipped: str | None = None
    # The provision commands that fix this host ("sandbox", "cache", "bond"), read off the lab's
    # playbooks by gather_hosts; a check without them words its own.
    fixes: dict[str, str] = field(default_factory=dict)


@dataclass
class NetworkProbe:
    sender: str
    receiver: str
    report: dict[str, Any] | None = None
    error: str | None = None
    hint: str | None = None


@dataclass
class Gathered:
    hosts: list[HostFound]
    network: NetworkProbe | None = None
    network_skipped: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def runs_sandboxes(host: Host) -> bool:
    return host.has_role("sandbox") or host.sandbox is not None


def _step(run: HostRun, rules: AlertRules | None) -> Any:
    from labctl.hosts.agent_ship import call_agent
    from labctl.hosts.fanout import HostResult, Skipped

    host = run.host
    if host.is_windows:
        raise Skipped("windows (labctl's agent is Linux-only)")
    before = time.time()
    ping = call_agent(run, "ping", {})
    after = time.time()
    facts = call_agent(run, "facts.collect", {"torch": True})
    found: dict[str, Any] = {"facts": facts}
    if isinstance(ping, dict) and isinstance(ping.get("time"), (int, float)):
        found["clock"] = Clock(before, float(ping["time"]), after)
    try:
        found["cron"] = call_agent(run, "cron.list", {}, read_only=True)
    except LabctlError as e:
        found["cron_error"] = e.message
    if runs_sandboxes(host):
        try:
            found["images"] = list(call_agent(run, "sandbox.images", {}).get("images") or [])
        except LabctlError as e:
            found["images_error"] = e.message
    if rules is not None:
        from labctl.monitor.alerts import evaluate
        from labctl.monitor.collect import status_args

        try:
            sample = call_agent(run, "monitor.status", status_args(host))
            found["alerts"] = evaluate(host.name, sample, rules)
        except LabctlError as e:
            found["alerts_error"] = e.message
    return HostResult(host.name, "ok", data=found)


def provision_fixes(ctx: Context, host: Host) -> dict[str, str]:
    """What `labctl provision` command puts the host's cache, sandboxes and bond right, as the
    playbooks beside the inventory really apply them (a play may leave the host out)."""
    from labctl.provision.hint import provision_fix
    from labctl.sandbox.api import build_hint

    out = {"cache": provision_fix(ctx.inventory, host.name, "model_cache")}
    if runs_sandboxes(host):
        out["sandbox"] = build_hint(ctx, host, host.sandbox.languages if host.sandbox else ["python"])
    if host.bond is not None:
        out["bond"] = provision_fix(ctx.inventory, host.name, "bond", Path("playbooks/network.yaml"))
    return out


def gather_hosts(ctx: Context, hosts: Sequence[Host], rules: AlertRules | None = None) -> list[HostFound]:
    from labctl.hosts.fanout import fan_out

    by_name = {h.name: h for h in hosts}
    out = []
    for r in fan_out(ctx, hosts, lambda run: _step(run, rules), label="doctor"):
        f = HostFound(by_name[r.host], fixes=provision_fixes(ctx, by_name[r.host]))
        if r.status == "skipped":
            f.skipped = r.error or "skipped"
        elif not r.ok or not isinstance(r.data, dict):
            f.error, f.hint = r.error or r.status, r.hint
        else:
            f.facts = r.data.get("facts")
            f.clock = r.data.get("clock")
            f.images = r.data.get("images")
            f.images_error = r.data.get("images_error")
            f.alerts = r.data.get("alerts")
            f.alerts_error = r.data.get("alerts_error")
            f.cron = r.data.get("cron")
            f.cron_error = r.data.get("cron_error")
        out.append(f)
    return out


def probe_pair(found: list[HostFound]) -> tuple[Host, Host] | None:
    """Two hosts that answered, training hosts first: the path training traffic takes."""
    ready = [f.host for f in found if f.facts is not None]
    ready.sort(key=lambda h: not h.has_role("train"))
    return (ready[1], ready[0]) if len(ready) >= 2 else None


def probe_network(ctx: Context, sender: Host, receiver: Host) -> NetworkProbe:
    from labctl.netbench.measure import measure_network

    probe = NetworkProbe(sender.name, receiver.name)
    try:
        probe.report = measure_network(ctx, sender, receiver, [1], PROBE_SECONDS)
    except LabctlError as e:
        probe.error, probe.hint = e.message, e.hint
    return probe


def gather(
    ctx: Context, hosts: Sequence[Host], network: bool = True, rules: AlertRules | None = None
) -> Gathered:
    """`rules`: also sample each host's status and judge seed 004's alerts (None: no alerts)."""
    found = gather_hosts(ctx, hosts, rules)
    g = Gathered(found)
    pair = probe_pair(found)
    if not network:
        g.network_skipped = "not asked for"
    elif pair is None:
        g.network_skipped = "needs two Linux hosts that answered"
    else:
        g.network = probe_network(ctx, *pair)
    return g
