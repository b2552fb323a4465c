"""`labctl orchestra ask PROMPT`: every warm model, and each remote tier whose key is set here,
asked at once through the trainer's own client; one answer per model with its latency.

The warm set is read from the serving hosts (what answers now, as `rotate` would see it), not
from a trainer's endpoints file, so it works from any controller. The cycle's wall time is shown
beside the sum of the latencies. That sum is not what asking them one after another would cost:
models sharing a machine slow each other down when asked at once (bench/orchestra_cycle.py
measures both ways).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from labctl.output.errors import InputError

if TYPE_CHECKING:
    from labctl.agent.orchestra.client import Answer, Endpoint
    from labctl.hosts.context import Context
    from labctl.orchestra.spec import Orchestra, RemoteTier


@dataclass
class AskResult:
    prompt: str
    answers: list[Answer]
    cycle_s: float
    skipped: list[str] = field(default_factory=list)  # remote tiers whose key is not set here

    @property
    def ok(self) -> bool:
        return all(a.ok for a in self.answers)

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "cycle_s": round(self.cycle_s, 4),
            "sum_s": round(sum(a.latency_s for a in self.answers), 4),
            "answers": [{**a.as_dict(), "latency_s": round(a.latency_s, 4)} for a in self.answers],
            "skipped": self.skipped,
        }


def warm_endpoints(
    ctx: Context, orch: Orchestra, remote: Sequence[RemoteTier] = (), environ: Mapping[str, str] | None = None
) -> tuple[list[Endpoint], dict[str, Any]]:
    """The endpoints to ask (the warm set as the serving hosts report it, then each of `remote`
    whose key variable is set in `environ`) and the endpoints document they came from."""
    from labctl.agent.orchestra.client import from_doc
    from labctl.orchestra.endpoints import endpoints_doc, serving_facts
    from labctl.orchestra.hoststate import find_repair, read_views
    from labctl.orchestra.rotate import serving_hosts

    hosts = serving_hosts(ctx, orch)
    views = read_views(ctx, hosts, orch.server.health, gpus=False)
    warm = {name: find_repair(v).current for name, v in views.items()}
    # Each model asked as the trainers ask it: its API, timeout, cap and context.
    doc = endpoints_doc(
        ctx.inventory.lab, {h.name: h for h in hosts}, warm, remote, facts=serving_facts(orch)
    )
    return from_doc(doc, {} if environ is None else environ), doc


def ask(
    ctx: Context, orch: Orchestra, prompt: str, max_tokens: int, temperature: float, remote: bool
) -> AskResult:
    from labctl.agent.orchestra.client import ask_all

    endpoints, doc = warm_endpoints(ctx, orch, orch.remote if remote else [], os.environ)
    asked = {e.name for e in endpoints}
    skipped = [r["name"] for r in doc["remote"] if r["name"] not in asked]
    if not endpoints:
        raise InputError(
            "No model is warm on the orchestra's hosts"
            + (f", and no remote tier has its key set here ({', '.join(skipped)})." if skipped else "."),
            "Load the warm set with `labctl orchestra start`, then ask again.",
        )
    start = time.perf_counter()
    answers = ask_all(endpoints, prompt, max_tokens=max_tokens, temperature=temperature)
    return AskResult(prompt, answers, time.perf_counter() - start, skipped)
