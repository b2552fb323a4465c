"""Carrying out a rotation (and `orchestra start`/`stop`): lock, repair, cache, start, wait, stop.

The decision is pure data (`labctl/orchestra/decide.py`: who leaves, who joins, where, in which
order); this module only carries it out on the serving hosts, in the plan's order:
- every serving host's rotation lock is taken first (sorted by name, so two rotations never
  deadlock), before its state is read: a second rotation waits for the first, then plans from
  what it left;
- what a killed rotation left is repaired (orphan servers stopped, lost models dropped) and
  warm.json rewritten to match what answers, before anything else happens;
- joining models missing from the host's RAM cache are synced, evicting only cold models;
- joiners start (make-before-break where memory allows), their health checks are awaited, and
  warm.json is written after each batch that succeeded and after each batch of stops, so at any
  moment it lists exactly the servers that answer;
- a joiner that fails is stopped (no half-started server is left) and the error names its log.
Every stage is timed; the result is JSON-ready (`to_json`) for `--json` and `bench rotation`.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from labctl.agent.core import paths
from labctl.hosts.hostlock import LockKind
from labctl.orchestra.hoststate import HostView, Repair, find_repair, gone_hosts, leftovers, read_views
from labctl.output.errors import HostError, InputError, LabctlError

if TYPE_CHECKING:
    from labctl.cache.targets import Target
    from labctl.hosts.context import Context
    from labctl.hosts.fanout import HostRun
    from labctl.inventory.model import Host
    from labctl.orchestra.decide import RotationPlan
    from labctl.orchestra.spec import Orchestra

ROTATION = LockKind(
    "labctl rotate",
    "is rotating the orchestra here",
    "is in the middle of another rotation",
    "Let that rotation finish (`labctl orchestra status` shows it), then run again; "
    "--wait SECONDS waits longer, --dry-run takes no lock.",
    "LABCTL_ROTATE_LOCK_WAIT",
    paths.ORCHESTRA_LOCK,
)
HISTORY_KEEP = 50

Report = Callable[[str], None]


@dataclass
class Timing:
    """One model's stages, in seconds."""

    model: str
    host: str
    cache: float = 0.0
    cache_hit: bool = True
    start: float = 0.0  # orchestra.start: the process spawned
    load: float = 0.0  # the server's own figure: files → device
    warmup: float = 0.0  # the server's own figure: the first forward pass
    health: float = 0.0  # waiting for /health beyond load and warm-up (interpreter start, polling)
    stop: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


@dataclass
class RotationResult:
    kind: str
    plan: RotationPlan
    dry_run: bool
    repairs: list[str] = field(default_factory=list)
    joined: list[Timing] = field(default_factory=list)
    left: list[Timing] = field(default_factory=list)
    seconds: float = 0.0
    waited_for_lock: float = 0.0
    warm: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # host → models now
    # Servers on hosts that served the orchestra and are no longer in the inventory: labctl cannot
    # reach them, so they are named with the command that stops them.
    left_behind: list[dict[str, Any]] = field(default_factory=list)
    # Each rewrite of the trainers' endpoints.json: {at, why, models, hosts: {host: "ok" | error}}.
    published: list[dict[str, Any]] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.joined or self.left or self.repairs)

    def stages(self) -> dict[str, float]:
        """Sum of each stage over the rotation's models (what `bench rotation` shows)."""
        out = {"cache": 0.0, "start": 0.0, "load": 0.0, "warmup": 0.0, "health": 0.0, "stop": 0.0}
        for t in [*self.joined, *self.left]:
            for k in out:
                out[k] += getattr(t, k)
        return {k: round(v, 3) for k, v in out.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "dry_run": self.dry_run,
            "changed": self.changed,
            "plan": self.plan.to_json(),
            "repairs": self.repairs,
            "joined": [t.to_json() for t in self.joined],
            "left": [t.to_json() for t in self.left],
            "stages": self.stages(),
            "seconds": round(self.seconds, 3),
            "waited_for_lock": round(self.waited_for_lock, 3),
            "warm": self.warm,
            "left_behind": self.left_behind,
            "published": self.published,
        }


@dataclass
class Options:
    kind: str = "rotate"  # rotate | start | stop
    out: Sequence[str] = ()
    in_: Sequence[str] = ()
    dry_run: bool = False
    python: str | None = None
    lock_wait: float | None = None
    report: Report | None = None


def start_args(orch: Orchestra, model: str, gpu: int | None, files: dict[str, Any] | None) -> dict[str, Any]:
    """What orchestra.start and orchestra.health need of `model`'s engine (engines/base.py's contract)."""
    from labctl.orchestra.engines import engine
    from labctl.orchestra.sizes import served_context

    eng = engine(orch.engine_name(model))
    args = eng.start_args(model, served_context(orch.model(model).context, orch.context, files), gpu)
    if eng.name == "command":
        args["command"] = orch.server.command
        args["health_path"] = orch.server.health
    if eng.name == "labctl":
        # labctl's server says its own state on the file's health path (default /health).
        args["health_path"] = orch.server.health
    args["binary"] = orch.server.binaries.get(eng.name) or eng.binary
    return args


def serving_hosts(ctx: Context, orch: Orchestra) -> list[Host]:
    """The orchestra's hosts (its `hosts:` expression), each with a model cache to serve from."""
    from labctl.cache.targets import has_cache
    from labctl.orchestra import spec

    hosts = [h for h in spec.serving_hosts(orch, ctx.inventory) if not h.is_windows]
    if not hosts:
        raise InputError(
            f"The orchestra's hosts ({orch.hosts}) are all Windows hosts; the orchestra serves from Linux hosts.",
            "Set `hosts:` in the orchestra file to the inference hosts (default role:inference).",
        )
    bare = [h.name for h in hosts if not has_cache(h)]
    if bare:
        from labctl.provision.hint import provision_fix

        raise InputError(
            f"The orchestra serves models from each host's RAM cache, but {', '.join(bare)} "
            f"{'has' if len(bare) == 1 else 'have'} no model_cache in the inventory.",
            "Give each serving host a model_cache (path, size_gb, source) and provision it "
            f"({provision_fix(ctx.inventory, bare[0], 'model_cache')}), or leave it out of the orchestra's `hosts:`.",
        )
    return hosts


def rotate(ctx: Context, orch: Orchestra, opts: Options) -> RotationResult:
    """Decide, then (unless dry-run) carry out one rotation, `orchestra start` or `stop`."""
    from labctl.hosts.fanout import HostRun
    from labctl.hosts.hostlock import HostLock
    from labctl.orchestra.decide import decide

    t0 = time.monotonic()
    hosts = serving_hosts(ctx, orch)
    by_name = {h.name: h for h in hosts}
    with ExitStack() as locks:

        def lock(chosen: Sequence[Host]) -> None:
            if not opts.dry_run:
                for h in sorted(chosen, key=lambda h: h.name):
                    locks.enter_context(
                        HostLock(HostRun(ctx, h, _cancel()), opts.lock_wait, opts.report, ROTATION)
                    )

        lock(hosts)
        waited = time.monotonic() - t0
        views = read_views(ctx, hosts, orch.server.health)
        # Hosts that served at the last commit and serve no more: those still in the inventory
        # are reached and emptied; the others (and one that does not answer) can only be named.
        gone = gone_hosts(views, list(by_name), ctx.inventory.lab)
        retired: dict[str, Host] = {}
        retired_views: dict[str, HostView] = {}
        unreachable: dict[str, str] = {}
        for name in sorted(gone):
            h = ctx.inventory.hosts.get(name)
            if h is None or h.is_windows:
                continue
            try:
                lock([h])
                retired_views.update(read_views(ctx, [h], orch.server.health, gpus=False))
                retired[name] = h
            except HostError as e:
                unreachable[name] = e.message
        repairs = {name: find_repair(v) for name, v in views.items()}
        files: dict[str, dict[str, Any]] = {}
        if opts.kind != "stop":
            from labctl.orchestra.files import read_files

            files, _ = read_files(ctx, orch, hosts)
        plan = decide(ctx.inventory, orch, hosts, views, repairs, opts.kind, opts.out, opts.in_, files)
        result = RotationResult(opts.kind, plan, opts.dry_run, waited_for_lock=waited)
        removed = {n: r for n, r in gone.items() if n not in retired}
        result.left_behind = left_behind(removed, ctx.inventory.lab, unreachable)
        if opts.dry_run:
            result.repairs = [n for r in repairs.values() for n in r.notes()]
            result.repairs += [retire_note(h, v, orch, dry_run=True) for h, v in retired_views.items()]
            result.repairs += [lb["note"] for lb in result.left_behind]
            result.warm = {h: [dict(m) for m in r.current] for h, r in repairs.items()}
            result.seconds = time.monotonic() - t0
            return result
        result.repairs += [lb["note"] for lb in result.left_behind if not lb["command"]]
        ex = _Executor(ctx, orch, opts, by_name, views, plan, result, retired, files)
        ex.repair(repairs)
        ex.retire(retired_views)
        ex.run()
        if opts.kind == "stop":
            ex.stop_rest()
        ex.verify()
    result.seconds = time.monotonic() - t0
    return result


def retire_note(host: str, view: HostView, orch: Orchestra, dry_run: bool = False) -> str:
    servers = ", ".join(f"{s['model']} (pid {s['pid']}, port {s.get('port')})" for s in view.servers)
    what = (
        f"{'would stop' if dry_run else 'stopped'} its servers: {servers}"
        if servers
        else "none of its servers run"
    )
    return (
        f"{host}: no longer one of the orchestra's hosts (hosts: {orch.hosts}), but its warm.json was "
        f"this orchestra's; {what}, warm.json emptied"
    )


def left_behind(
    removed: dict[str, dict[str, Any]], lab: str, unreachable: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Pure: for each host the last commit named that labctl cannot reach now (gone from the
    inventory, or in `unreachable`: {name: why}), what it ran by warm.json's record and the
    command that stops it there."""
    import shlex

    unreachable = unreachable or {}
    out: list[dict[str, Any]] = []
    for name, record in sorted(removed.items()):
        models = [
            m for m in record.get("models") or [] if isinstance(m, dict) and isinstance(m.get("pid"), int)
        ]
        if record and not models:
            continue  # it ran nothing of this orchestra at the last commit
        if name in unreachable:
            where = f"{name}: no longer one of the orchestra's hosts and labctl cannot reach it ({unreachable[name]})"
            kill = "kill -TERM " + " ".join(f"-{int(m['pid'])}" for m in models)
            command = f"labctl exec -l {name} -- {kill}"
        else:
            where = f"{name}: no longer in the inventory, so labctl cannot reach it"
            address, user, port = (
                record.get("address"),
                record.get("user") or "root",
                record.get("port") or 22,
            )
            target = f"{user}@{address}" if address else name
            kill = shlex.quote("kill -TERM " + " ".join(f"-{int(m['pid'])}" for m in models))
            command = f"ssh {'' if port == 22 else f'-p {int(port)} '}{target} {kill}"
        if models:
            listed = ", ".join(f"{m.get('name')} (pid {m['pid']}, port {m.get('port')})" for m in models)
            note = (
                f"{where}, but it ran servers of lab {lab} at the last rotation: {listed}; left behind. "
                f"Stop them there: `{command}`"
            )
            out.append({"host": name, "models": models, "command": command, "note": note})
        else:
            note = f"{where}; it served the orchestra before: if servers of lab {lab} still run there, stop them on the host"
            out.append({"host": name, "models": [], "command": None, "note": note})
    return out


def lacks_torch(text: str) -> bool:
    """Whether a server's error or log says its interpreter has no torch."""
    return "torch is not installed" in text or "No module named 'torch'" in text


def failed_start_hint(kind: str, host: str, model: str, made_room: bool, torch_fix: str | None = None) -> str:
    """The hint of a joiner that did not become healthy: what was undone, the fix, and the
    command that was run (`kind`), to run again. `torch_fix`: where the server's interpreter
    lacks torch, the provision command that installs it (provision_fix's text)."""
    command = "labctl rotate" if kind == "rotate" else f"labctl orchestra {kind}"
    undone = (
        "Nothing was left half-started: the joining servers were stopped and the warm set is as it was"
        + (" minus the models stopped to make room" if made_room else "")
        + "."
    )
    log = f"{paths.ORCHESTRA_LOGS}/{model}.log"
    if torch_fix is not None:
        fix = (
            f"labctl's model server ran with a Python that has no torch on {host}: name one that has it "
            f"with `{command} --python PATH` or `server.python: PATH` in the orchestra file, or install "
            f"the torch environment with {torch_fix}; then run `{command}` again."
        )
    else:
        fix = f"Read {log} on {host}, fix the model or the server command, and run `{command}` again."
    return f"{undone} {fix}"


def _cancel() -> Any:
    import threading

    return threading.Event()


class _Executor:
    """Carries out one plan; keeps each host's warm list in step with what answers."""

    def __init__(
        self,
        ctx: Context,
        orch: Orchestra,
        opts: Options,
        hosts: dict[str, Host],
        views: dict[str, HostView],
        plan: RotationPlan,
        result: RotationResult,
        retired: dict[str, Host] | None = None,
        files: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        from labctl.cache.targets import resolve_target

        self.ctx, self.orch, self.opts, self.hosts, self.plan, self.result = (
            ctx,
            orch,
            opts,
            hosts,
            plan,
            result,
        )
        self.views = views
        self.files = dict(files or {})
        self.retired = dict(retired or {})
        self.targets: dict[str, Target] = {h: resolve_target(ctx.inventory, h) for h in hosts}
        self.warm: dict[str, list[dict[str, Any]]] = {h: [] for h in [*hosts, *self.retired]}
        self.cursor = plan.cursor
        self.started = time.time()
        from labctl.orchestra.endpoints import consumers

        self.consumers = consumers(ctx.inventory)

    # -- plumbing --------------------------------------------------------------------------

    def _say(self, text: str) -> None:
        if self.opts.report is not None:
            self.opts.report(text)

    def _call(self, host: str, command: str, args: dict[str, Any], timeout: float = 120.0, **kw: Any) -> Any:
        from labctl.hosts.agent_ship import call_agent
        from labctl.hosts.fanout import on_host

        args = {"lab": self.ctx.inventory.lab, "host": host, **args}
        h = self.hosts.get(host) or self.retired[host]
        return on_host(self.ctx, h, lambda run: call_agent(run, command, args, timeout=timeout, **kw))

    def _commit(self, host: str, entry: dict[str, Any] | None = None) -> None:
        # `peers`: every serving host's address and servers, so that a host later removed from
        # the inventory can still be named with what it ran and how to stop it.
        peers = {
            name: {
                "address": h.address,
                "user": h.user,
                "port": h.port,
                "models": [
                    {"name": m["name"], "pid": m.get("pid"), "port": m.get("port")} for m in self.warm[name]
                ],
            }
            for name, h in sorted(self.hosts.items())
        }
        warm = {
            "lab": self.ctx.inventory.lab,
            "host": host,
            "models": self.warm[host],
            "warm_size": self.orch.warm,
            "hosts": sorted(self.hosts),
            "peers": peers,
            "cursor": self.cursor,
        }
        self._call(host, "orchestra.commit", {"warm": warm, "history": entry})

    def _publish(self, why: str, without: dict[str, list[str]] | None = None) -> None:
        """The trainers' endpoints.json rewritten on every host that trains, all at once. A
        host that cannot be reached is noted, never fatal: its trainer keeps the last file, and
        its client asks another model for any that has left."""
        if not self.consumers:
            return
        from labctl.hosts.agent_ship import call_agent
        from labctl.hosts.fanout import HostResult, fan_out
        from labctl.orchestra.endpoints import endpoints_doc, serving_facts

        facts = serving_facts(self.orch, self.files)
        doc = endpoints_doc(self.ctx.inventory.lab, self.hosts, self.warm, self.orch.remote, without, facts)

        def step(run: HostRun) -> HostResult:
            answer = call_agent(run, "orchestra.publish", {"endpoints": doc}, read_only=False)
            return HostResult(run.host.name, "ok", data=answer)

        results = fan_out(self.ctx, self.consumers, step, label="publishing endpoints", progress=False)
        for r in results:
            if not r.ok:
                self._say(f"{r.host}: the trainers' endpoints could not be rewritten: {r.error}")
        self.result.published.append(
            {
                "at": round(time.time(), 3),
                "why": why,
                "models": [m["name"] for m in doc["models"]],
                "hosts": {r.host: "ok" if r.ok else str(r.error) for r in results},
            }
        )

    # -- the stages ------------------------------------------------------------------------

    def repair(self, repairs: dict[str, Repair]) -> None:
        for host, rep in repairs.items():
            self.warm[host] = [dict(m) for m in rep.current]
            if rep.orphans:
                self._stop(host, [], pids=[int(s["pid"]) for s in rep.orphans])
            if rep.needed:
                notes = rep.notes()
                self.result.repairs += notes
                for n in notes:
                    self._say(f"repaired {n}")
                self._commit(host, {"at": time.time(), "kind": "repair", "notes": notes, "ok": True})

    def retire(self, views: dict[str, HostView]) -> None:
        """Hosts that no longer serve the orchestra: every server of this lab there stopped, their
        warm.json emptied (phase 3 reads it), what was done noted."""
        for host, view in sorted(views.items()):
            if not view.servers and not view.warm_models:
                continue
            if view.servers:
                self._stop(host, [], ())
            note = retire_note(host, view, self.orch)
            self.result.repairs.append(note)
            self._say(f"repaired {note}")
            self._commit(host, {"at": time.time(), "kind": "repair", "notes": [note], "ok": True})

    def stop_rest(self) -> None:
        """`orchestra stop`: whatever of this lab still runs on a serving host (recorded or not)
        is stopped too, not only what warm.json listed."""
        for host in sorted(self.hosts):
            answer = self._call(
                host,
                "orchestra.stop",
                {"models": None, "pids": None, "grace": self.orch.server.stop_grace},
                timeout=self.orch.server.stop_grace + 60,
            )
            stopped = answer.get("stopped") or []
            if stopped:
                listed = ", ".join(f"{s.get('model')} (pid {s.get('pid')})" for s in stopped)
                note = f"{host}: stopped {listed}: running, but not in warm.json"
                self.result.repairs.append(note)
                self._say(f"repaired {note}")
            self.warm[host] = []
            self._commit(host)
        self._publish("stopped")

    def verify(self) -> None:
        """Plan again: read every host's state afresh and compare it with the plan's warm set;
        exit 1 naming whatever differs, and the hosts removed from the inventory that still ran
        servers at the last commit."""
        hosts = [*self.hosts.values(), *self.retired.values()]
        views = read_views(self.ctx, hosts, self.orch.server.health, gpus=False)
        after = self.plan.after.assignment()
        left = leftovers(views, after)
        stranded = [lb for lb in self.result.left_behind if lb["command"]]
        if not left and not stranded:
            return
        what = "rotate" if self.opts.kind == "rotate" else f"orchestra {self.opts.kind}"
        lines = [x.text for x in left] + [lb["note"] for lb in stranded]
        pids: dict[str, list[int]] = {}
        for x in left:
            if x.pid is not None:
                pids.setdefault(x.host, []).append(x.pid)
        kills = [
            f"`labctl exec -l {h} -- kill -TERM {' '.join(f'-{p}' for p in sorted(ps))}`"
            for h, ps in sorted(pids.items())
        ]
        if kills:
            hint = (
                f"Stop what is left by hand ({', '.join(kills)}: each server is a process group; "
                "-KILL for one that ignores TERM), then check with `labctl orchestra status`. A server that "
                "outlives SIGKILL is stuck in the kernel (a GPU driver): check the host."
            )
        elif left:
            hint = f"Run `labctl {what}` again: it repairs warm.json from what answers (`labctl orchestra status` shows it)."
        else:
            hint = "Stop the servers named above on their hosts (labctl no longer tracks them), or put the host back in the inventory."
        raise HostError(
            f"`labctl {what}` carried out its plan, but the hosts do not run what it planned: "
            + "; ".join(lines)
            + ".",
            hint,
        )

    def run(self) -> None:
        """The plan's steps in order: consecutive starts on one host form a batch whose health
        checks are awaited together; warm.json is written after each batch."""
        steps = list(self.plan.steps)
        joining = [s for s in steps if s.action == "start"]
        self._cache(joining)
        i = 0
        while i < len(steps):
            s = steps[i]
            batch = [s]
            while (
                i + len(batch) < len(steps)
                and steps[i + len(batch)].action == s.action
                and steps[i + len(batch)].host == s.host
            ):
                batch.append(steps[i + len(batch)])
            i += len(batch)
            if s.action == "start":
                self._start_batch(s.host, batch)
                self._publish("joined")
            else:
                leaving = [b.model for b in batch]
                if self.consumers:
                    # The drain: trainers stop sending new requests first; what is in flight
                    # finishes within stop_grace, as the server stops gracefully.
                    self._publish("draining", {s.host: leaving})
                    time.sleep(self.orch.server.drain_s)
                timings = self._stop(s.host, leaving)
                self.result.left += timings
                self._commit(s.host)
        entry = self._history_entry()
        for host in sorted(self.hosts):
            self._commit(host, entry)
        self.result.warm = {h: list(ms) for h, ms in self.warm.items()}
        self._publish("committed")

    def _history_entry(self) -> dict[str, Any]:
        return {
            "started": round(self.started, 3),
            "at": time.time(),
            "kind": self.opts.kind,
            "joined": [t.model for t in self.result.joined],
            "left": [t.model for t in self.result.left],
            "modes": sorted({s.mode for s in self.plan.steps if s.mode}),
            "cache_hits": [t.model for t in self.result.joined if t.cache_hit],
            "cache_misses": [t.model for t in self.result.joined if not t.cache_hit],
            "stages": self.result.stages(),
            "seconds": round(sum(self.result.stages().values()), 3),
            "ok": True,
            # Who rotated: `orchestra status` tells a scheduled copy on a host the inventory no
            # longer has (its cron entry left behind) from this lab's own runs.
            "by": {"controller": socket.gethostname(), "inventory": str(self.ctx.inventory_path)},
        }

    def _cache(self, joining: Sequence[Any]) -> None:
        """Joining models missing from their host's RAM cache are synced first; the warm ones
        are protected from eviction."""
        from labctl.hosts.fanout import on_host

        self.cache_times: dict[str, tuple[float, bool]] = {}
        by_host: dict[str, list[str]] = {}
        for s in joining:
            by_host.setdefault(s.host, []).append(s.model)
        for host, models in by_host.items():
            # Once per folder: two models may serve the same files (a second server of one model).
            folders = list(dict.fromkeys(self.orch.model(m).folder for m in models))
            got = on_host(self.ctx, self.hosts[host], partial(self._sync_missing, folders=folders))
            for m in models:
                hit = self.orch.model(m).folder not in got["missing"]
                share = got["seconds"] / max(1, len(got["missing"])) if not hit else 0.0
                self.cache_times[m] = (share, hit)

    def _sync_missing(self, run: HostRun, folders: list[str]) -> dict[str, Any]:
        from labctl.cache.ops import cache_state
        from labctl.cache.sync import sync

        host, target = run.host.name, self.targets[run.host.name]
        state = cache_state(run, target.cache)
        cached = {n for n, e in (state.get("models") or {}).items() if e.get("present", True)}
        missing = [f for f in folders if f not in cached]
        if not missing:
            return {"missing": [], "seconds": 0.0}
        self._say(f"{host}: syncing {', '.join(missing)} into the RAM cache from {target.source.name}")
        t = time.monotonic()
        names = set(self.orch.names)
        warm = {self.orch.model(m["name"]).folder for m in self.warm[host] if m["name"] in names}
        sync(run, target, missing, protect=warm)
        return {"missing": missing, "seconds": time.monotonic() - t}

    def _start_batch(self, host: str, batch: Sequence[Any]) -> None:
        target = self.targets[host]
        started: list[dict[str, Any]] = []
        timings: dict[str, Timing] = {}
        try:
            for s in batch:
                spec = self.orch.model(s.model)
                t = time.monotonic()
                self._say(f"{host}: starting {s.model} on GPU {s.gpu if s.gpu is not None else '-'}")
                info = self._call(
                    host,
                    "orchestra.start",
                    {
                        "model": s.model,
                        "gpu": s.gpu,
                        "path": target.cached(spec.folder),
                        "python": self.opts.python or self.orch.server.python,
                        **start_args(self.orch, s.model, s.gpu, self.files.get(s.model)),
                    },
                )
                cache_s, hit = self.cache_times.get(s.model, (0.0, True))
                timings[s.model] = Timing(
                    s.model, host, cache=cache_s, cache_hit=hit, start=time.monotonic() - t
                )
                engine_args = start_args(self.orch, s.model, s.gpu, self.files.get(s.model))
                started.append(
                    {
                        "model": s.model,
                        "port": info["port"],
                        "pid": info["pid"],
                        "step": s,
                        "since": time.time(),
                        "health_path": engine_args["health_path"],
                        "loading_words": engine_args["loading_words"],
                        "ready_by_completion": engine_args["ready_by_completion"],
                    }
                )
            t = time.monotonic()
            answer = self._call(
                host,
                "orchestra.health",
                {
                    "servers": [
                        {
                            "model": x["model"],
                            "port": x["port"],
                            "pid": x["pid"],
                            "health_path": x["health_path"],
                            "loading_words": x["loading_words"],
                            "ready_by_completion": x["ready_by_completion"],
                        }
                        for x in started
                    ],
                    "timeout": self.orch.server.start_timeout,
                    "health_path": self.orch.server.health,
                },
                timeout=self.orch.server.start_timeout + 60,
                on_line=self._health_line(host),
            )
        except BaseException:
            # Nothing half-started stays behind: whatever of this batch runs is stopped.
            if started:
                self._stop_quietly(host, [int(x["pid"]) for x in started])
            raise
        waited = time.monotonic() - t
        results = {r["model"]: r for r in answer.get("results") or []}
        bad = [r for r in results.values() if not r.get("healthy")]
        if bad or len(results) < len(started):
            self._stop_quietly(host, [int(x["pid"]) for x in started])
            self._commit(host)
            r = bad[0] if bad else {"model": "?", "error": "no answer"}
            tail = (r.get("log_tail") or "").strip()[-600:]
            error = str(r.get("error") or "no health answer")
            torch_fix = None
            if lacks_torch(f"{error}\n{tail}"):
                from labctl.provision.hint import provision_fix

                torch_fix = provision_fix(self.ctx.inventory, host, "torch_env")
            raise HostError(
                f"{host}: {r['model']} did not become healthy: {error}."
                + (f" Its log ends:\n{tail}" if tail else ""),
                failed_start_hint(
                    self.opts.kind,
                    host,
                    str(r["model"]),
                    any(s.mode == "break-before-make" for s in batch),
                    torch_fix,
                ),
            )
        for x in started:
            r = results[x["model"]]
            doc = r.get("health") or {}
            tm = timings[x["model"]]
            tm.load = float(doc.get("load_s") or 0.0)
            tm.warmup = float(doc.get("warmup_s") or 0.0)
            tm.health = max(0.0, float(r.get("seconds") or waited) - tm.load - tm.warmup)
            s = x["step"]
            self.warm[host].append(
                {
                    "name": x["model"],
                    "gpu": s.gpu,
                    "gpu_model": s.gpu_model,
                    "gpu_source": s.gpu_source,
                    "port": x["port"],
                    "pid": x["pid"],
                    "state": "loaded",
                    "since": round(x["since"], 3),
                    "memory_gb": s.memory_gb,
                }
            )
            self.cursor = x["model"]
            self.result.joined.append(tm)
        self._commit(host)

    def _health_line(self, host: str) -> Callable[[str, str], None]:
        from labctl.hosts.agent_ship import agent_event

        def on_line(stream: str, line: str) -> None:
            ev = agent_event(stream, line, "health")
            if ev is not None and ev.get("state") in ("ready", "loading", "warming", "failed"):
                self._say(f"{host}: {ev.get('model')} {ev.get('state')}")

        return on_line

    def _stop(self, host: str, models: Sequence[str], pids: Sequence[int] = ()) -> list[Timing]:
        t = time.monotonic()
        if models:
            self._say(f"{host}: stopping {', '.join(models)}")
        answer = self._call(
            host,
            "orchestra.stop",
            {
                "models": list(models) if models else None,
                "pids": list(pids) or None,
                "grace": self.orch.server.stop_grace,
            },
            timeout=self.orch.server.stop_grace + 60,
        )
        if answer.get("remaining"):
            left = ", ".join(f"{r.get('model')} (pid {r.get('pid')})" for r in answer["remaining"])
            raise HostError(
                f"{host}: servers still run after SIGKILL: {left}.",
                "Check the host (a process stuck in the kernel, e.g. on a GPU driver) and run again.",
            )
        gone = set(models)
        self.warm[host] = [m for m in self.warm[host] if m["name"] not in gone]
        each = (time.monotonic() - t) / max(1, len(models))
        return [Timing(m, host, stop=each) for m in models]

    def _stop_quietly(self, host: str, pids: Sequence[int]) -> None:
        try:
            self._call(
                host,
                "orchestra.stop",
                {"models": None, "pids": list(pids), "grace": self.orch.server.stop_grace},
                timeout=self.orch.server.stop_grace + 60,
            )
        except LabctlError:
            pass  # the next rotation's repair finds what is left
