"""Carry a playbook out on hosts: probe once, plan each resource, apply, verify.

Per host, every resource's state is read in one agent round trip; a resource whose plan
is empty costs nothing more. A changed resource is applied by the agent (one round trip)
and verified by reading it again: the plan must then be empty. Hosts run in parallel,
resources in playbook order; a failure stops that host's remaining resources, never the
other hosts. `check` plans and reports and changes nothing anywhere.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from labctl.hosts.agent_ship import call_agent
from labctl.hosts.fanout import HostResult, HostRun, fan_out
from labctl.hosts.hostlock import HostLock
from labctl.inventory.model import Host, Inventory
from labctl.output.errors import LabctlError
from labctl.output.progress import QUIET, Progress
from labctl.provision.playbook import Entry, Playbook, check_tags, play_members
from labctl.provision.resource import Change, NotApplicable, PlanError, Resource, resource_class

if TYPE_CHECKING:
    from labctl.hosts.context import Context


@dataclass
class ResourceResult:
    host: str
    resource: str
    type: str
    status: str  # ok | changed | failed | skipped
    changed: bool = False
    summary: list[str] = field(default_factory=list)
    diff: str = ""
    error: str | None = None
    hint: str | None = None
    seconds: float = 0.0
    events: list[dict[str, Any]] = field(default_factory=list)  # progress of a long apply

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def wanted(entry: Entry, tags: set[str], skip: set[str]) -> bool:
    names = {entry.type_name, *entry.tags}
    if tags and not names & tags:
        return False
    return not names & skip


def entries_for_hosts(
    hosts: Sequence[Host], playbook: Playbook, inventory: Inventory, tags: set[str], skip: set[str]
) -> dict[str, list[Entry]]:
    """Each of `hosts`' entries in playbook order; a play outside `hosts` (--limit) adds nothing.

    A play whose `hosts:` has a term that matches nothing in `inventory` is a DocumentError
    (exit 2), unless the term is a role labctl knows that this lab lacks (the play adds
    nothing; `skipped_plays` says why); so is a tag that names no resource of the playbook
    (InputError).
    """
    check_tags(playbook, tags, "--tags")
    check_tags(playbook, skip, "--skip-tags")
    out: dict[str, list[Entry]] = {h.name: [] for h in hosts}
    for play, members in zip(playbook.plays, play_members(playbook, inventory), strict=True):
        for h in hosts:
            if h.name in members:
                out[h.name] += [e for e in play.entries if wanted(e, tags, skip)]
    return out


def _build(host: Host, entry: Entry) -> Resource:
    cls = resource_class(entry.type_name)
    try:
        return cls.from_playbook(host, entry.params)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise PlanError(f"{entry.type_name}: {where}: {first['msg']} (playbook line {entry.line}).") from None


def _probe(run: HostRun, probes: dict[str, dict[str, Any]], check: bool = False) -> dict[str, Any]:
    # --check must leave hosts byte-for-byte as they were: not even the agent is cached.
    answer = call_agent(run, "provision.probe", {"probes": probes}, read_only=check)
    return dict(answer.get("results", {}))


def _state_of(results: dict[str, Any], index: int, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    return {k: results.get(f"{index}/{k}", {"error": "not probed"}) for k in keys}


def _read(run: HostRun, res: Resource) -> dict[str, dict[str, Any]]:
    """One resource's state, read again (after an earlier change, or to verify its own)."""
    probes = res.probes()
    return _state_of(_probe(run, {f"0/{k}": v for k, v in probes.items()}), 0, list(probes))


def provision_host(
    run: HostRun, entries: Sequence[Entry], check: bool, progress: Progress = QUIET
) -> list[ResourceResult]:
    host = run.host
    results: list[ResourceResult] = []

    def emit(r: ResourceResult) -> None:
        results.append(r)
        progress.event("resource", result=r)

    resources: list[tuple[Entry, Resource | None, str | None]] = []
    for e in entries:
        cls = resource_class(e.type_name)
        if host.is_windows and cls.linux_only:
            resources.append((e, None, "skipped: windows"))
            continue
        try:
            resources.append((e, _build(host, e), None))
        except NotApplicable as reason:
            resources.append((e, None, f"skipped: {reason}"))
        except PlanError as err:
            resources.append((e, None, f"failed: {err.message}"))
    live = [(i, r) for i, (_, r, _) in enumerate(resources) if r is not None]
    probes = {f"{i}/{k}": v for i, r in live for k, v in r.probes().items()}
    found = _probe(run, probes, check) if probes else {}
    touched = failed = False
    for i, (entry, res, note) in enumerate(resources):
        start = time.monotonic()
        label = res.label() if res else entry.type_name
        if note is not None or res is None:
            status, _, why = (note or "skipped: ").partition(": ")
            emit(ResourceResult(host.name, label, entry.type_name, status, error=why or None))
            failed = failed or status == "failed"
            continue
        if failed:
            emit(
                ResourceResult(
                    host.name,
                    label,
                    entry.type_name,
                    "skipped",
                    error="an earlier resource failed on this host",
                )
            )
            continue
        keys = list(res.probes())
        try:
            state = _read(run, res) if touched else _state_of(found, i, keys)
            # What an earlier resource changed may change this one's state: read it again.
            change = res.plan(state)
            if change.changed and not check:
                res.apply(run, change)
                touched = True
                after: Change = res.plan(_read(run, res))
                if after.changed:
                    raise PlanError(
                        f"{label} did not converge: after applying, it still plans: {'; '.join(after.summary)}.",
                        "Something on the host undoes the change; look at it by hand.",
                    )
        except LabctlError as err:
            failed = True
            emit(
                ResourceResult(
                    host.name,
                    label,
                    entry.type_name,
                    "failed",
                    error=err.message,
                    hint=err.hint or None,
                    seconds=time.monotonic() - start,
                    events=res.events,
                )
            )
            continue
        emit(
            ResourceResult(
                host.name,
                label,
                entry.type_name,
                "changed" if change.changed else "ok",
                changed=change.changed,
                summary=change.summary,
                diff="".join(change.diffs),
                seconds=time.monotonic() - start,
                events=res.events,
            )
        )
    return results


def provision(
    ctx: Context,
    playbook: Playbook,
    hosts: Sequence[Host],
    *,
    tags: set[str] | None = None,
    skip_tags: set[str] | None = None,
    check: bool = False,
    progress: Progress = QUIET,
) -> tuple[list[ResourceResult], list[HostResult]]:
    """`progress` hears "resource" (result=ResourceResult) as each resource finishes, and
    "waiting" (HostLock's fields) while another provision holds a host."""
    plan = entries_for_hosts(hosts, playbook, ctx.inventory, tags or set(), skip_tags or set())
    chosen = [h for h in hosts if plan[h.name]]

    def step(run: HostRun) -> HostResult:
        if check or run.host.is_windows:  # --check changes nothing; the lock is a POSIX flock
            res = provision_host(run, plan[run.host.name], check, progress)
        else:
            # Held from before the host's state is read: a run that waited plans from what the
            # other one left.
            with HostLock(run, progress=progress):
                res = provision_host(run, plan[run.host.name], check, progress)
        counts = {s: sum(r.status == s for r in res) for s in ("ok", "changed", "failed", "skipped")}
        status = "failed" if counts["failed"] else ("changed" if counts["changed"] else "ok")
        return HostResult(run.host.name, status, data=res, extra=counts)

    host_results = fan_out(ctx, chosen, step, label="provision --check" if check else "provision")
    resource_results = [r for hr in host_results for r in (hr.data or [])]
    return resource_results, host_results
