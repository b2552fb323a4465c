"""`labctl cron install|list|remove` against a lab: the generated playbooks carried out by the
provision engine, and every host's labctl jobs read back in one agent round trip per host."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labctl.cron import plan
from labctl.cron.jobs import JOBS, ORCHESTRA_COPY, companions, get_job
from labctl.hosts.agent_ship import ask_agent, call_agent
from labctl.hosts.fanout import HostResult, HostRun, fan_out
from labctl.output.errors import InputError
from labctl.output.progress import QUIET, Progress
from labctl.provision.engine import ResourceResult, provision

if TYPE_CHECKING:
    from labctl.hosts.context import Context


@dataclass
class Outcome:
    results: list[ResourceResult] = field(default_factory=list)
    hosts: list[HostResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def add(self, results: list[ResourceResult], hosts: list[HostResult]) -> None:
        self.results += results
        by = {h.host: h for h in self.hosts}
        for h in hosts:
            old = by.get(h.host)
            if old is None:
                self.hosts.append(h)
                by[h.host] = h
                continue
            for k in ("ok", "changed", "failed", "skipped"):
                old.extra[k] = old.extra.get(k, 0) + h.extra.get(k, 0)
            old.seconds += h.seconds
            if RANK.get(h.status, 9) > RANK.get(old.status, 9):
                old.status, old.error, old.hint = h.status, h.error, h.hint


# A host's status over two runs is the worse of the two.
RANK = {"ok": 0, "skipped": 0, "changed": 1, "failed": 2}


def public_key(ctx: Context, orch: Any) -> str | None:
    """The orchestrator's public key, read without changing anything there; None if not made yet."""
    probe = {"pub": {"kind": "file", "path": plan.KEY + ".pub"}}
    found = ask_agent(ctx, orch, "provision.probe", {"probes": probe}, read_only=True)["results"]["pub"]
    text = found.get("text") if found.get("exists") else None
    return " ".join(str(text).split()[:2]) if text else None


class _Only:
    """`progress` less the resources that are not news (the keypair's second look)."""

    def __init__(self, progress: Progress, news: Callable[[ResourceResult], bool]) -> None:
        self.progress, self.news = progress, news

    def event(self, name: str, /, **fields: Any) -> None:
        if name != "resource" or self.news(fields["result"]):
            self.progress.event(name, **fields)


def install(
    ctx: Context,
    job_name: str,
    schedule: str,
    host_name: str | None,
    check: bool,
    progress: Progress = QUIET,
    orchestra_file: Path | None = None,
) -> Outcome:
    """`orchestra_file`: the file the rotate job rotates by, copied into the lab copy in place
    of whatever orchestra.yaml the playbooks folder beside the inventory holds. The caller
    names it (the CLI: -f, else the orchestra's default beside the inventory): scheduling
    knows no feature's files."""
    import yaml

    job = get_job(job_name)
    inv = ctx.inventory
    orch = plan.orchestrator(inv, host_name)
    hosts = plan.driven_hosts(inv)
    out = Outcome()
    out.info = {"job": job.name, "host": orch.name, "schedule": schedule, "command": plan.job_command(job)}
    playbooks = plan.lab_playbooks(ctx.inventory_path, orchestra_file)
    if orchestra_file is not None:
        out.info["orchestra_file"] = str(orchestra_file.absolute())
        out.info["orchestra_copy"] = ORCHESTRA_COPY
    out.info["companions"] = [
        {"job": j.name, "schedule": when, "command": plan.job_command(j)} for j, when in companions(job)
    ]
    left = [n for n in inv.hosts if n not in {h.name for h in hosts}]
    if left:
        out.notes.append(
            f"Not authorised for {orch.name}'s key (Windows or not reached over SSH): {', '.join(left)}; "
            "the job cannot drive them from there."
        )
    key = public_key(ctx, orch)
    if key is None and not check:
        out.add(*provision(ctx, plan.keypair_playbook(orch), [orch], progress=progress))
        if any(r.status == "failed" for r in out.results):
            return out
        key = public_key(ctx, orch)
    if key is None:
        out.notes.append(
            f"{orch.name} has no key of its own yet: the install makes one there and authorises it on "
            + ", ".join(h.name for h in hosts)
            + "."
        )
    book = plan.install_playbook(
        job,
        orch,
        hosts,
        yaml.safe_load(ctx.inventory_path.read_text()),
        plan.known_hosts_copy([orch, *hosts]),
        playbooks,
        key,
    )
    made_first = bool(out.results)

    def news(r: ResourceResult) -> bool:  # the key made first: its second look (ok) is not news
        return not (made_first and r.host == orch.name and r.type == "ssh_keypair")

    targets = [orch, *(h for h in hosts if h.name != orch.name)]
    results, host_results = provision(ctx, book, targets, check=check, progress=_Only(progress, news))
    for hr in host_results:
        hr.extra["ok"] = hr.extra.get("ok", 0) - sum(not news(r) for r in hr.data or [])
    out.add([r for r in results if news(r)], host_results)
    # The entry comes last, once everything it runs with is in place on every host: an install
    # that failed somewhere leaves no schedule that would fail on each run.
    if any(not h.ok for h in host_results):
        out.notes.append(
            f"The {job.name} entry was not installed on {orch.name}: fix what failed, then run again."
        )
        return out
    out.add(*provision(ctx, plan.cron_playbook(job, schedule, orch), [orch], check=check, progress=progress))
    return out


def list_jobs(ctx: Context) -> list[HostResult]:
    """Every labctl job on every Linux host of the lab, with its last run."""

    def step(run: HostRun) -> HostResult:
        answer = call_agent(run, "cron.list", {}, read_only=True)
        daemons = answer.get("daemons") or {}
        return HostResult(run.host.name, "ok", data=answer.get("jobs", []), extra={"daemons": daemons})

    return fan_out(ctx, plan.driven_hosts(ctx.inventory), step, label="cron list")


def idle_jobs(jobs: list[dict[str, Any]]) -> list[str]:
    """The jobs of one host that nothing there runs: cron.d files with no cron daemon, timers
    with no systemd."""
    return [str(j.get("name")) for j in jobs if j.get("daemon_running") is False]


def idle_text(host: str, jobs: list[dict[str, Any]]) -> tuple[str, str]:
    """What to say about a host whose jobs never run, and how to fix it (cron list, doctor)."""
    names = idle_jobs(jobs)
    if any(j.get("backend") == "systemd" for j in jobs if j.get("name") in names):
        return (
            f"systemd is not running on {host}, so its labctl timers ({', '.join(names)}) never fire",
            f"Install the jobs again (`labctl cron install {names[0]} ...`): where systemd does not run, "
            f"they go to /etc/cron.d; then start cron on {host}.",
        )
    return (
        f"no cron daemon runs on {host} (no cron or crond process reads its /etc/cron.d), so its "
        f"labctl jobs ({', '.join(names)}) never run",
        f"Start cron on {host} and enable it at boot: `systemctl enable --now cron` (Debian, Ubuntu; "
        "`crond` with cronie on Fedora, RHEL), or `service cron start` where systemd does not run.",
    )


def remove(
    ctx: Context, name: str, host_name: str | None, purge: bool, check: bool, progress: Progress = QUIET
) -> Outcome:
    orch = plan.orchestrator(ctx.inventory, host_name)
    hosts = plan.driven_hosts(ctx.inventory)
    jobs = ask_agent(ctx, orch, "cron.list", {}, read_only=True).get("jobs", [])
    names = [j["name"] for j in jobs]
    if name not in names:
        raise InputError(
            f"{orch.name} has no labctl job '{name}'.",
            f"Its jobs: {', '.join(names) or 'none'} (`labctl cron list` shows every host's).",
        )
    going = {name, *(c for c, _ in (JOBS[name].companions if name in JOBS else ()))}
    others = [
        j["name"]
        for j in jobs
        if j["name"] not in going and plan.BIN in str(j.get("command") or j.get("line"))
    ]
    if purge and others:
        # A companion goes with the job that brought it; each removal keeps the copy (no --purge:
        # the others would refuse it too), and this command, run again, takes the copy last.
        brought = {c for o in others if o in JOBS for c, _ in JOBS[o].companions}
        first = [o for o in others if o not in brought] or others
        host = f" --host {orch.name}" if host_name else ""
        steps = ", ".join(f"`labctl cron remove {shlex.quote(o)}{host}`" for o in first)
        raise InputError(
            f"--purge would remove the labctl copy that {orch.name}'s other jobs run ({', '.join(others)}).",
            f"Remove them first ({steps}), then run this again; or leave out --purge.",
        )
    out = Outcome(info={"job": name, "host": orch.name, "purge": purge})
    targets = [orch, *(h for h in hosts if h.name != orch.name)] if purge else [orch]
    out.add(
        *provision(
            ctx, plan.remove_playbook(name, orch, hosts, purge), targets, check=check, progress=progress
        )
    )
    return out
