"""What the steps of one rotation share: its options and result (JSON-ready, for `--json` and
`bench rotation`), each host's warm list as it changes, and the one call that reaches an agent."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from labctl.cache.targets import resolve_target
from labctl.hosts.agent_ship import call_agent
from labctl.hosts.fanout import on_host
from labctl.orchestra.endpoints import consumers
from labctl.output.progress import QUIET, Progress

if TYPE_CHECKING:
    from labctl.cache.targets import Target
    from labctl.hosts.context import Context
    from labctl.inventory.model import Host
    from labctl.orchestra.decide import RotationPlan
    from labctl.orchestra.hoststate import HostView
    from labctl.orchestra.spec import Orchestra


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
    # What the rotation says as it goes: "starting", "health", "stopping", "syncing",
    # "repaired", "not published", and HostLock's "waiting" (labctl.orchestra.render shows them).
    progress: Progress = QUIET


class Rotation:
    """One plan being carried out; keeps each host's warm list in step with what answers."""

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
        self.consumers = consumers(ctx.inventory)
        # model → (seconds of the cache sync it shared, whether it was cached already)
        self.cache_times: dict[str, tuple[float, bool]] = {}

    @property
    def progress(self) -> Progress:
        return self.opts.progress

    def call(self, host: str, command: str, args: dict[str, Any], timeout: float = 120.0, **kw: Any) -> Any:
        """`command` on `host`'s agent, tagged with the lab and the host: the agent tags servers with them."""
        args = {"lab": self.ctx.inventory.lab, "host": host, **args}
        h = self.hosts.get(host) or self.retired[host]
        return on_host(self.ctx, h, lambda run: call_agent(run, command, args, timeout=timeout, **kw))
