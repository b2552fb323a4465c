"""What `labctl cache` asks a cache host's agent directly: the cache's state, evict, pin.

Each is one agent call on a host handle (a fan_out step's, or fanout.on_host's), with the
agent's failures turned into what a person can act on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from labctl.output.errors import HostError

if TYPE_CHECKING:
    from labctl.hosts.fanout import HostRun
    from labctl.inventory.model import ModelCache


def cache_state(run: HostRun, mc: ModelCache) -> dict[str, Any]:
    from labctl.hosts.agent_ship import call_agent

    state: dict[str, Any] = call_agent(run, "cache.state", {"cache": mc.path, "size_gb": mc.size_gb})
    if not state.get("exists"):
        raise HostError(
            f"{run.host.name} has no folder at its model_cache path {mc.path}.",
            f"Create and mount it with `labctl provision --tags model_cache --limit {run.host.name}`.",
        )
    return state


def evict(run: HostRun, mc: ModelCache, models: Sequence[str], force: bool = False) -> dict[str, Any]:
    """Remove `models` (and their partial copies); pinned ones only with `force`.

    Returns the agent's answer: `evicted` [{name, bytes, partial?}], `not_cached`, and
    `pinned` (left in place).
    """
    from labctl.hosts.agent_ship import call_agent

    answer: dict[str, Any] = call_agent(
        run, "cache.evict", {"cache": mc.path, "models": list(models), "force": force}
    )
    return answer


def pin(run: HostRun, mc: ModelCache, model: str, pinned: bool) -> dict[str, Any]:
    """Pin or unpin a cached model; `changed` says whether it was not so already."""
    from labctl.hosts.agent_ship import AgentFailed, call_agent

    try:
        answer: dict[str, Any] = call_agent(
            run, "cache.pin", {"cache": mc.path, "model": model, "pinned": pinned}
        )
    except AgentFailed as e:
        if e.kind != "not_cached":
            raise
        raise HostError(
            f"{run.host.name}: {model} is not in its cache {mc.path}.",
            f"Sync it first: labctl cache sync {model} --host {run.host.name}.",
        ) from None
    return answer
