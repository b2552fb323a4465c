"""The trainers' endpoints.json rewritten (orchestra.publish) on every host that trains."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from labctl.hosts.agent_ship import call_agent
from labctl.hosts.fanout import HostResult, fan_out
from labctl.orchestra.endpoints import endpoints_doc, serving_facts
from labctl.orchestra.steps.state import Rotation

if TYPE_CHECKING:
    from labctl.hosts.fanout import HostRun


def publish(rot: Rotation, why: str, without: dict[str, list[str]] | None = None) -> None:
    """The trainers' endpoints.json rewritten on every host that trains, all at once. A
    host that cannot be reached is noted, never fatal: its trainer keeps the last file, and
    its client asks another model for any that has left."""
    if not rot.consumers:
        return
    facts = serving_facts(rot.orch, rot.files)
    doc = endpoints_doc(rot.ctx.inventory.lab, rot.hosts, rot.warm, rot.orch.remote, without, facts)

    def step(run: HostRun) -> HostResult:
        answer = call_agent(run, "orchestra.publish", {"endpoints": doc}, read_only=False)
        return HostResult(run.host.name, "ok", data=answer)

    results = fan_out(rot.ctx, rot.consumers, step, label="publishing endpoints", progress=False)
    for r in results:
        if not r.ok:
            rot.progress.event("not published", host=r.host, error=r.error)
    rot.result.published.append(
        {
            "at": round(time.time(), 3),
            "why": why,
            "models": [m["name"] for m in doc["models"]],
            "hosts": {r.host: "ok" if r.ok else str(r.error) for r in results},
        }
    )
