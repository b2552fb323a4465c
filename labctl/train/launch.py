"""Carry a LaunchSpec out over SSH: preflight, start torchrun on every host, stream, stop, verify.

Attached runs: each host's torchrun runs under the transport's watchdog (transport/wrap.py),
in its own process group, so it dies when labctl dies or the SSH session drops. Ctrl-C or a
failed host cancels every host (SIGTERM to the group, SIGKILL after `stop_grace`), and then
every host is asked for processes still carrying the run's id and those are stopped too: the
run ends with a list of what remains, which should be empty. A host that failed says why in the
trainer's words (a fatal error's reason, agent/train/fatal.py; else the rank and its error line,
train/failure.py), never with torchrun's traceback.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from labctl.agent.core import paths
from labctl.agent.train.events import SAMPLES_FILE
from labctl.agent.train.fatal import EXIT_FATAL
from labctl.hosts.agent_ship import agent_dir, agent_zip, call_agent
from labctl.hosts.context import Context
from labctl.hosts.fanout import HostResult, HostRun, fan_out
from labctl.inventory.model import Host
from labctl.output.errors import HostError, InputError
from labctl.output.progress import QUIET, Progress
from labctl.train.failure import TorchrunText, failure_line, fatal_event, fatal_line
from labctl.train.phases import Settings
from labctl.train.plan import Problem, plan_run
from labctl.train.spec import RUN_ENV, LaunchSpec, NodeSpec
from labctl.transport.shell import quote

RANK_LINE = re.compile(r"^\[rank(\d+)\]:(.*)$")
PREFLIGHT_TIMEOUT_S = 240.0


class PreflightFailed(HostError):
    def __init__(self, problems: list[Problem]) -> None:
        lines = "\n  ".join(p.line() for p in problems)
        n = len(problems)
        super().__init__(
            f"Preflight found {n} problem{'s' if n != 1 else ''}; nothing was launched:\n  {lines}",
            "Fix them and run again; `--check` repeats the checks without launching.",
        )
        self.problems = problems


def host_log_dir(host: Host, run_id: str) -> str:
    return paths.runs_dir(root=host.user == "root", run_id=run_id)


def agent_path(host: Host) -> str:
    _, digest = agent_zip()
    return f"{agent_dir(host)}/agent-{digest}.pyz"


def ask_agents(
    ctx: Context,
    hosts: list[Host],
    command: str,
    args_for: Callable[[Host], dict[str, Any]],
    *,
    timeout: float,
    label: str,
) -> list[HostResult]:
    """The agent's `command` on every host at once; each answer is its HostResult's data."""

    def step(run: HostRun) -> HostResult:
        answer = call_agent(run, command, args_for(run.host), timeout=timeout)
        return HostResult(run.host.name, "ok", data=answer)

    return fan_out(ctx, hosts, step, label=label)


def linux_hosts(hosts: list[Host]) -> list[Host]:
    windows = [h.name for h in hosts if h.is_windows]
    if windows:
        raise InputError(
            f"Cannot train on {', '.join(windows)}: torchrun over SSH needs Linux hosts.",
            "Leave them out with --limit (e.g. --limit 'role:train,!workstation').",
        )
    return hosts


def preflight(
    ctx: Context,
    hosts: list[Host],
    settings: Settings,
    phase: int,
    python: str | None,
    orchestra_hosts: list[Host],
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Every host's preflight answer (one agent round trip each), and the orchestra hosts'."""
    train_names = {h.name for h in hosts}
    everyone = hosts + [h for h in orchestra_hosts if h.name not in train_names]
    orchestra_names = {h.name for h in orchestra_hosts}

    def args_for(host: Host) -> dict[str, Any]:
        args: dict[str, Any] = {
            "python": python or settings.python,
            "address": host.address,
            "checkpoint_dir": settings.checkpoint_path(phase),
            "orchestra": host.name in orchestra_names,
            # Where phase 3's trainers learn which models to ask (the rotation keeps it current).
            "endpoints": bool(settings.requires_orchestra) and host.name in train_names,
            # ...and where the sandbox service runs their code (`labctl sandbox serve` writes it).
            "sandbox": bool(settings.requires_sandbox) and host.name in train_names,
        }
        if host.name == hosts[0].name:
            args["port"] = settings.port
        return args

    results = ask_agents(
        ctx, everyone, "train.preflight", args_for, timeout=PREFLIGHT_TIMEOUT_S, label="preflight"
    )
    failed = [r for r in results if not r.ok]
    if failed:
        problems = [
            Problem(r.host, r.error or r.status, r.hint or "check the host (labctl facts).") for r in failed
        ]
        raise PreflightFailed(problems)
    by_name = {r.host: r.data for r in results}
    return (
        {h.name: by_name[h.name] for h in hosts},
        {h.name: by_name[h.name] for h in orchestra_hosts},
    )


def prepare(
    ctx: Context,
    *,
    settings: Settings,
    phase: int,
    run_id: str,
    hosts: list[Host],
    device: str | None,
    python: str | None,
    script: str | None,
    script_args: tuple[str, ...],
    time_limit_s: int | None = None,
) -> LaunchSpec:
    """Preflight every host and plan the run; raises PreflightFailed with every problem found."""
    inv = ctx.inventory
    orchestra = (
        [h for h in inv.hosts.values() if "inference" in h.roles] if settings.requires_orchestra else []
    )
    probes, orchestra_probes = preflight(ctx, hosts, settings, phase, python, orchestra)
    log_dir = host_log_dir(hosts[0], run_id)
    remote_script = f"{log_dir}/{Path(script).name}" if script else None
    spec, problems = plan_run(
        settings=settings,
        phase=phase,
        run_id=run_id,
        hosts=hosts,
        probes=probes,
        device_override=device,
        log_dir=log_dir,
        pythonpath={h.name: agent_path(h) for h in hosts},
        script=remote_script,
        script_args=script_args,
        orchestra_probes=orchestra_probes,
        time_limit_s=time_limit_s,
    )
    if problems or spec is None:
        raise PreflightFailed(problems)
    return spec


def ship_script(ctx: Context, spec: LaunchSpec, hosts: list[Host], script: Path) -> None:
    """Copy the user's script into the run's folder on every host."""
    data = script.read_bytes()

    def step(run: HostRun) -> HostResult:
        mk = run.conn.run(f"mkdir -p {quote(spec.log_dir)}", timeout=30)
        if mk.rc != 0:
            raise HostError(f"{run.host.name}: cannot create {spec.log_dir}: {mk.stderr.strip()}")
        run.conn.put_bytes(data, str(spec.script), mode=0o600)
        return HostResult(run.host.name, "ok")

    results = fan_out(ctx, hosts, step, label="copying the script")
    bad = [r for r in results if not r.ok]
    if bad:
        raise HostError(
            "Could not copy the script to " + ", ".join(f"{r.host} ({r.error})" for r in bad) + ".",
            "Check the hosts' disks and permissions; nothing was launched.",
        )


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(float(value), fmt)


def _phase3_part(event: dict[str, Any], run_id: str | None = None) -> str:
    """Phase 3's figures of a step event: reward, code that ran, the slowest model's p95; a
    reward of 0 says whether any program ran, and where the step's sample shows why."""
    latency = event.get("orchestra_ms") or {}
    slowest = max((m["p95"] for m in latency.values()), default=None)
    part = f"  reward {_num(event.get('reward'), '.3f')}"
    if event.get("policy_loss") is not None:  # the RL term ran: some try's reward left its baseline
        part += f" (baseline {_num(event.get('baseline'), '.3f')}, policy loss {event['policy_loss']:+.4f})"
    part += (
        f"  code ran {_num(event.get('exec_success_rate'), '.0%')}"
        f"  {len(latency)} models p95 {_num(slowest, ',.0f')} ms"
    )
    part += zero_reward_hint(event, run_id)
    if event.get("rotation_wait_s"):
        part += f"  rotation wait {event['rotation_wait_s']:.2f} s"
    if event.get("answers_failed"):
        part += f"  {event['answers_failed']} answers failed"
    spend = event.get("remote_spend_usd")
    total = sum(v for v in spend.values() if isinstance(v, (int, float))) if isinstance(spend, dict) else 0
    if total > 0:
        part += f"  remote ${total:.4f}"
    skipped = event.get("remote_skipped")
    for tier, why in sorted(skipped.items()) if isinstance(skipped, dict) else []:
        part += f"  {tier} not asked: {why}"
    return part


def zero_reward_hint(event: dict[str, Any], run_id: str | None) -> str:
    """Why a reward is 0: no program ran (every test exited non-zero or timed out: a syntax
    error, a missing import), or they ran and printed the wrong thing."""
    if event.get("reward") != 0 or not event.get("programs_run"):
        return ""
    see = f"see `labctl train show {run_id or 'RUN'} --samples`"
    n = event["programs_run"]
    if event.get("exec_success_rate") == 0:
        return f"  (0 of {n} program{'s' if n != 1 else ''} ran: {see})"
    return f"  (no test passed: {see})"


def format_event(event: dict[str, Any], run_id: str | None = None) -> str:
    """One event as a line; `run_id` names the run in what a phase-3 step tells to run next."""
    kind = event.get("event")
    if kind == "step":
        return (
            f"step {event.get('step')}/{event.get('steps')}  loss {_num(event.get('loss'), '.4f')}  "
            f"lr {_num(event.get('lr'), '.2e')}  {_num(event.get('tokens_per_s'), ',.0f')} tok/s"
            + (f"  restart {event['restart']}" if event.get("restart") else "")
            + (_phase3_part(event, run_id) if "reward" in event else "")
        )
    if kind == "start":
        resumed = event.get("resumed_from")
        return (
            f"start: {event.get('world_size')} processes on {event.get('device')} ({event.get('precision')}), "
            f"{int(event.get('params') or 0):,} parameters, "
            + (f"resumed from step {resumed}" if resumed is not None else "from scratch")
            + (f", restart {event['restart']}" if event.get("restart") else "")
        )
    if kind == "checkpoint":
        return f"checkpoint at step {event.get('step')}: {event.get('path')} ({_num(event.get('seconds'), '.2f')} s)"
    if kind == "done":
        return f"done at step {event.get('step')}, loss {_num(event.get('loss'), '.4f')}"
    if kind == "paused":
        return (
            f"paused at step {event.get('step')} (time limit {_num(event.get('time_limit'), '.0f')} s, "
            f"{_num(event.get('seconds'), '.0f')} s used): resumable at step {event.get('resume_step')}"
        )
    if kind == "batch_resize":
        return (
            f"batch resized at step {event.get('step')}: {event.get('previous_batch_size')} → "
            f"{event.get('batch_size')} x {event.get('accumulation_steps')} ({event.get('reason')})"
        )
    return json.dumps(event)


def format_sample(sample: dict[str, Any]) -> str:
    """Phase 3's sample of a step as a person reads it: who wrote what, and how it ran."""
    head = f"step {sample.get('step')}: {sample.get('task')} by {sample.get('model')}"
    if sample.get("rank"):
        head += f" (rank {sample['rank']})"
    lines = [head]
    if sample.get("error") and "program" not in sample:
        return "\n".join([*lines, f"  the answer failed: {sample['error']}"])
    if sample.get("error"):
        lines.append(f"  the sandbox could not run it: {sample['error']}")
    else:
        how = f"  passed {sample.get('passed')} of {sample.get('total')} tests"
        if sample.get("stage") == "compile":
            how += "; it did not compile"
        if sample.get("timed_out"):
            how += f"; the first {'compile' if sample.get('stage') == 'compile' else 'test'} timed out"
        elif "exit_code" in sample:
            what = "the compiler" if sample.get("stage") == "compile" else "the first test"
            how += f"; {what} exited {sample['exit_code']}"
        lines.append(how)
    size = f"{sample.get('program_bytes')} bytes" + (", cut at answer_tokens" if sample.get("cut") else "")
    lines.append(f"  program ({size}):")
    lines += [f"    {ln}" for ln in str(sample.get("program") or "").splitlines() or ["(empty)"]]
    for key in ("stderr", "stdout"):
        text = str(sample.get(key) or "")
        if text.strip():
            lines.append(f"  {key}:")
            lines += [f"    {ln}" for ln in text.splitlines()]
    return "\n".join(lines)


@dataclass
class Stream:
    """Routes every host's lines: all to per-host files, rank 0's events to metrics, chosen ranks to the screen."""

    folder: Path
    ranks: Collection[int] | None  # None: every rank
    progress: Progress = QUIET  # "line" (label: host/rank or host/torchrun, text, stream)
    events: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    files: dict[str, IO[str]] = field(default_factory=dict)
    first_step_at: float | None = None
    samples: IO[str] | None = None  # opened by the first sample: only phase 3 writes them
    fatal: dict[str, str] = field(default_factory=dict)  # host -> the trainer's reason (fatal.py)
    torchrun_text: dict[str, TorchrunText] = field(default_factory=dict)  # host -> its traceback filter

    def open(self, hosts: list[str]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        for h in hosts:
            self.files[h] = open(self.folder / f"{h}.log", "a", buffering=1)  # noqa: SIM115 (closed in close())
        self.metrics = open(self.folder / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        if hasattr(self, "metrics"):
            self.metrics.close()
        if self.samples is not None:
            self.samples.close()

    def line(self, host: str, stream: str, text: str) -> None:
        m = RANK_LINE.match(text)
        rank = int(m.group(1)) if m else None
        body = m.group(2) if m else text
        event = None
        if rank == 0 and body.startswith("{"):
            try:
                parsed = json.loads(body)
                event = parsed if isinstance(parsed, dict) and "event" in parsed else None
            except ValueError:
                event = None
        # Any rank may stop the run for good; only rank 0 prints the other events.
        reason = fatal_event(body.strip()) if rank is not None else None
        with self.lock:
            self.files[host].write(text + "\n")
            if reason is not None:
                self.fatal.setdefault(host, reason)
                self.progress.event("line", label=f"{host}/{rank}", text=fatal_line(reason), stream="stderr")
                return
            if event is not None and event.get("event") == "sample":
                # Phase 3's sample of a step: `train show RUN --samples` reads it; too long to show.
                if self.samples is None:
                    self.samples = open(self.folder / SAMPLES_FILE, "a", buffering=1)  # noqa: SIM115
                self.samples.write(json.dumps({**event, "host": host}) + "\n")
                return
            if event is not None:
                event = {**event, "host": host}
                self.events.append(event)
                self.metrics.write(json.dumps(event) + "\n")
                if event.get("event") == "step" and self.first_step_at is None:
                    self.first_step_at = time.monotonic()
            if self.progress is QUIET:  # the torchrun filter below keeps state for the screen only
                return
            if rank is None:
                # torchrun's own lines: restarts, rendezvous and failures matter; its INFO chatter
                # does not, nor its traceback (the trainer's own line says what went wrong).
                if not self.torchrun_text.setdefault(host, TorchrunText()).keep(text):
                    return
                if any(
                    w in text
                    for w in ("ERROR", "Traceback", "Error", "WARNING", "restart", "Restart", "failed")
                ):
                    self.progress.event("line", label=f"{host}/torchrun", text=text, stream="stderr")
                return
            if self.ranks is None or rank in self.ranks:
                shown = format_event(event, self.folder.name) if event else body
                self.progress.event("line", label=f"{host}/{rank}", text=shown, stream=stream)


@dataclass
class Outcome:
    results: list[HostResult]
    events: list[dict[str, Any]]
    remaining: dict[str, list[dict[str, Any]]]
    interrupted: bool = False
    failed_host: str | None = None
    first_step_seconds: float | None = None
    fatal: str | None = None  # the trainer's reason when a fatal error ended the run (fatal.py)


def _command(spec: LaunchSpec, node: NodeSpec) -> str:
    return f"mkdir -p {quote(spec.log_dir)} && cd {quote(spec.log_dir)} && exec {spec.shell_line(node)}"


def run_attached(
    ctx: Context,
    spec: LaunchSpec,
    hosts: list[Host],
    stream: Stream,
    grace: int,
    timeout: float | None = None,
) -> Outcome:
    by_name = {h.name: h for h in hosts}
    nodes = {n.host: n for n in spec.nodes}
    abort = threading.Event()
    failed: list[str] = []
    started = time.monotonic()

    def step(run: HostRun) -> HostResult:
        name = run.host.name

        # fan_out's cancel (Ctrl-C) and another host's failure both stop this host.
        def relay() -> None:
            run.cancel.wait()
            abort.set()

        threading.Thread(target=relay, daemon=True).start()
        res = run.conn.run(
            _command(spec, nodes[name]),
            timeout=timeout,
            cancel=abort,
            on_line=lambda s, t: stream.line(name, s, t),
            grace=grace,  # the run's own grace period between SIGTERM and SIGKILL
        )
        if res.rc not in (0, None) and not abort.is_set():
            failed.append(name)
            abort.set()
        if res.cancelled:
            why = (
                f"stopped because {failed[0]} failed" if failed and failed[0] != name else "stopped by Ctrl-C"
            )
            return HostResult(name, "cancelled", error=why, rc=None)
        if res.timed_out:
            return HostResult(name, "timeout", error=f"stopped after {timeout:g} s")
        if res.rc == 0:
            return HostResult(name, "ok", rc=0)
        lines = (res.stdout or "").splitlines() + (res.stderr or "").splitlines()
        return HostResult(name, "failed", rc=res.rc, error=failure_line(res.rc, lines))

    interrupted = False
    try:
        results = fan_out(ctx, [by_name[n.host] for n in spec.nodes], step, label="training", progress=False)
    except KeyboardInterrupt:
        abort.set()
        interrupted = True
        results = []
    checked = _ps_everywhere(ctx, spec.run_id, [by_name[n.host] for n in spec.nodes], grace, spec.log_dir)
    # The fatal file outlives a line torchrun stopped copying before it was read.
    fatal = {**{r.host: r.data["fatal"] for r in checked if r.ok and r.data.get("fatal")}, **stream.fatal}
    results = [_with_reason(r, fatal.get(r.host)) for r in results]
    first = stream.first_step_at - started if stream.first_step_at else None
    reason = fatal.get(failed[0]) if failed and failed[0] in fatal else next(iter(fatal.values()), None)
    return Outcome(
        results, stream.events, _remaining(checked), interrupted, failed[0] if failed else None, first, reason
    )


def _with_reason(result: HostResult, reason: str | None) -> HostResult:
    """A failed host's row says the trainer's reason when it gave one, not torchrun's words."""
    if reason is None or result.status != "failed":
        return result
    # torchrun's own exit code says only that it was ended; the trainer's says why.
    return dataclasses.replace(result, error=fatal_line(reason), rc=EXIT_FATAL)


def stop_everywhere(
    ctx: Context, run_id: str, hosts: list[Host], grace: int, log_dir: str | None = None
) -> dict[str, list[dict[str, Any]]]:
    """SIGTERM, then SIGKILL after `grace`, every process of the run on every host; what is left."""
    return _remaining(_ps_everywhere(ctx, run_id, hosts, grace, log_dir))


def _ps_everywhere(
    ctx: Context, run_id: str, hosts: list[Host], grace: int, log_dir: str | None
) -> list[HostResult]:
    return ask_agents(
        ctx,
        hosts,
        "train.ps",
        lambda h: {"run_id": run_id, "host": h.name, "stop": True, "grace": grace, "log_dir": log_dir},
        timeout=grace + 60,
        label="checking no process of the run remains",
    )


def _remaining(results: list[HostResult]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if r.ok:
            out[r.host] = list(r.data.get("remaining") or [])
        else:
            out[r.host] = [{"pid": None, "cmd": f"could not check: {r.error}"}]
    return out


def run_detached(ctx: Context, spec: LaunchSpec, hosts: list[Host]) -> list[HostResult]:
    by_name = {h.name: h for h in hosts}
    nodes = {n.host: n for n in spec.nodes}
    return ask_agents(
        ctx,
        [by_name[n.host] for n in spec.nodes],
        "train.spawn",
        lambda h: {
            "line": spec.shell_line(nodes[h.name]),
            "log_dir": spec.log_dir,
            "env": {RUN_ENV: spec.run_id, "LABCTL_HOST": h.name},
        },
        timeout=60,
        label="starting",
    )


def host_status(ctx: Context, record: dict[str, Any], hosts: list[Host]) -> list[HostResult]:
    return ask_agents(
        ctx,
        hosts,
        "train.status",
        lambda h: {"run_id": record["run_id"], "host": h.name, "log_dir": record["log_dir"]},
        timeout=60,
        label="asking the hosts",
    )


def record_hosts(ctx: Context, record: dict[str, Any]) -> list[Host]:
    """The hosts of a recorded run that the inventory still has."""
    return [ctx.inventory.hosts[h] for h in record["hosts"] if h in ctx.inventory.hosts]
