"""What each serving host says about its orchestra, and what a killed rotation left behind.

`read_views` asks every serving host once (`orchestra.state`: warm.json, the history, the servers
that are really running and whether they answer, the GPUs it detects). `find_repair` (pure)
compares what warm.json claims with what answers: a server nobody recorded (a rotation killed
after it started a joiner) is an orphan to stop; a recorded model whose server is gone or does
not answer is lost. The rotation repairs both before it plans, so warm.json always ends up
matching what really answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from labctl.output.errors import HostError

if TYPE_CHECKING:
    from labctl.agent.orchestra.answers import StateAnswer
    from labctl.hosts.context import Context
    from labctl.inventory.model import Host


@dataclass
class HostView:
    host: str
    warm: dict[str, Any] | None
    warm_error: str | None
    servers: list[dict[str, Any]]
    history: list[dict[str, Any]]
    gpus: list[dict[str, Any]] | None = None  # detected by the host; None: none detected
    # Servers on the machine that another lab (or another name for it) started: never touched.
    others: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_answer(cls, host: str, answer: StateAnswer) -> HostView:
        # Kept as plain dicts: repair and status read keys the agent adds beyond the declaration
        # (a server's `healthy`), which the checker allows.
        detected = cast("list[dict[str, Any]] | None", answer.get("gpus") or None)
        warm = answer.get("warm")
        return cls(
            host,
            cast("dict[str, Any]", warm) if isinstance(warm, dict) else None,
            answer.get("warm_error"),
            cast("list[dict[str, Any]]", list(answer["servers"])),
            list(answer.get("history") or []),
            detected,
            [o for o in answer.get("others") or [] if isinstance(o, dict)],
        )

    def others_note(self) -> str | None:
        if not self.others:
            return None
        whose = sorted({f"{o.get('lab') or '?'}/{o.get('host') or '?'}" for o in self.others})
        models = ", ".join(sorted({str(o.get("model")) for o in self.others}))
        return (
            f"{self.host}: {len(self.others)} server(s) started by another lab or host name "
            f"({', '.join(whose)}: {models}) run on this machine; left alone"
        )

    @property
    def warm_models(self) -> list[dict[str, Any]]:
        return [m for m in (self.warm or {}).get("models") or [] if isinstance(m, dict) and m.get("name")]


@dataclass
class Repair:
    """One host's difference between warm.json and what runs."""

    host: str
    current: list[dict[str, Any]] = field(default_factory=list)  # recorded and answering
    orphans: list[dict[str, Any]] = field(default_factory=list)  # running, not recorded (or not answering)
    lost: list[dict[str, Any]] = field(default_factory=list)  # recorded, nothing answers for it
    damaged: str | None = None  # warm.json could not be read

    @property
    def needed(self) -> bool:
        return bool(self.orphans or self.lost or self.damaged)

    def notes(self) -> list[str]:
        out = []
        if self.damaged:
            out.append(f"{self.host}: warm.json was unreadable ({self.damaged}); rebuilt from what answers")
        for s in self.orphans:
            why = (
                "not answering"
                if s.get("recorded")
                else "not in warm.json (started by hand, or by a rotation stopped half-way)"
            )
            out.append(f"{self.host}: stopped {s['model']} (pid {s['pid']}, port {s.get('port')}): {why}")
        for m in self.lost:
            out.append(
                f"{self.host}: {m['name']} was recorded as loaded but no server answers for it; dropped"
            )
        return out


def find_repair(view: HostView) -> Repair:
    """Which recorded models really answer, which servers run unrecorded, which are lost.

    A server counts as the recorded one only with the recorded pid: a second server of the same
    model (a restart a killed rotation began) is an orphan even while the first one answers.
    """
    rep = Repair(view.host, damaged=view.warm_error)
    by_pid = {int(s["pid"]): s for s in view.servers if s.get("pid") is not None}
    claimed: set[int] = set()
    for m in view.warm_models:
        pid = m.get("pid")
        s = by_pid.get(int(pid)) if isinstance(pid, int) else None
        if s is not None and s.get("model") == m["name"] and s.get("healthy"):
            # The GPU the server was started on (its tag) wins over what warm.json says.
            gpu = s["gpu"] if "gpu" in s else m.get("gpu")
            rep.current.append({**m, "gpu": gpu, "port": s.get("port", m.get("port")), "state": "loaded"})
            claimed.add(int(s["pid"]))
        else:
            rep.lost.append(m)
            if s is not None and s.get("model") == m["name"]:
                claimed.discard(int(s["pid"]))
    for pid, s in sorted(by_pid.items()):
        if pid not in claimed:
            recorded = any(m.get("pid") == pid for m in view.warm_models)
            rep.orphans.append({**s, "recorded": recorded})
    return rep


def read_views(
    ctx: Context, hosts: Sequence[Host], health_path: str, *, gpus: bool = True
) -> dict[str, HostView]:
    """One `orchestra.state` round trip per serving host, all at once; a host that does not answer
    is a HostError naming it (the rotation cannot plan around a host it cannot see)."""
    from labctl.hosts.agent_ship import call_agent
    from labctl.hosts.fanout import HostResult, HostRun, fan_out

    def step(run: HostRun) -> HostResult:
        answer: StateAnswer = call_agent(
            run,
            "orchestra.state",
            {"lab": ctx.inventory.lab, "host": run.host.name, "health_path": health_path, "gpus": gpus},
            read_only=False,
        )
        return HostResult(run.host.name, "ok", data=answer)

    results = fan_out(ctx, list(hosts), step, label="orchestra state", progress=False)
    failed = [r for r in results if not r.ok]
    if failed:
        lines = "; ".join(f"{r.host}: {r.error}" for r in failed)
        raise HostError(
            f"The orchestra cannot read its serving hosts: {lines}",
            failed[0].hint or "Check the hosts with `labctl facts`, then run again.",
        )
    return {r.host: HostView.from_answer(r.host, r.data) for r in results}


def gone_hosts(views: Mapping[str, HostView], serving: Sequence[str], lab: str) -> dict[str, dict[str, Any]]:
    """The hosts that served this orchestra at the last commit (warm.json's `hosts` and `peers`
    on any serving host) and serve it no more: {name: its record ({"address", "user", "port",
    "models"}; {} where warm.json kept only its name)}. The newest warm.json wins; one another
    lab wrote (two labs on one machine) names none of this lab's hosts."""
    out: dict[str, dict[str, Any]] = {}
    for view in sorted(views.values(), key=lambda v: float((v.warm or {}).get("updated") or 0)):
        warm = view.warm or {}
        if warm.get("lab", lab) != lab:
            continue
        names = warm.get("hosts")
        peers = warm.get("peers")
        names = names if isinstance(names, list) else []
        peers = peers if isinstance(peers, dict) else {}
        for name in names:
            if isinstance(name, str) and name not in serving:
                out.setdefault(name, {})
        for name, record in peers.items():
            if isinstance(name, str) and name not in serving and isinstance(record, dict):
                out[name] = dict(record)
    return out


@dataclass(frozen=True)
class Leftover:
    """One way the hosts differ from the plan once it was carried out."""

    host: str
    text: str
    pid: int | None = None  # a server that still runs and should not


def leftovers(views: Mapping[str, HostView], after: Mapping[str, tuple[str, int]]) -> list[Leftover]:
    """Pure: the state read again after a rotation, start or stop, against the plan's warm set
    (`after`: model -> (host, GPU)). Empty when exactly the planned servers run, each on its
    planned GPU, answering and recorded in warm.json; else one Leftover for each difference."""
    out: list[Leftover] = []
    running: dict[str, tuple[str, dict[str, Any]]] = {}
    for host, view in sorted(views.items()):
        rep = find_repair(view)
        for s in rep.orphans:
            why = "not answering" if s.get("recorded") else "not in warm.json"
            out.append(
                Leftover(
                    host,
                    f"{host}: {s['model']} (pid {s['pid']}, port {s.get('port')}) runs, {why}",
                    int(s["pid"]),
                )
            )
        for m in rep.lost:
            out.append(Leftover(host, f"{host}: warm.json records {m['name']} but no server answers for it"))
        for m in rep.current:
            name, pid = str(m["name"]), m.get("pid")
            if name in running:
                out.append(
                    Leftover(
                        host,
                        f"{host}: {name} (pid {pid}) runs a second time (also on {running[name][0]})",
                        pid,
                    )
                )
                continue
            running[name] = (host, m)
    for name, (host, m) in sorted(running.items()):
        pid, gpu = m.get("pid"), m.get("gpu")
        want = after.get(name)
        if want is None:
            out.append(
                Leftover(
                    host,
                    f"{host}: {name} (pid {pid}, port {m.get('port')}) still runs on GPU {gpu}; the plan stops it",
                    pid,
                )
            )
        elif (host, gpu) != tuple(want):
            out.append(
                Leftover(
                    host,
                    f"{host}: {name} (pid {pid}) runs on GPU {gpu}, the plan put it on {want[0]} GPU {want[1]}",
                    pid,
                )
            )
    for name, (host, gpu) in sorted(after.items()):
        if name not in running:
            out.append(Leftover(host, f"{host}: {name} does not answer on GPU {gpu}, where the plan put it"))
    return out
