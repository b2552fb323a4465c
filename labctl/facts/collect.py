"""Gathering facts: the agent's `facts.collect` on each host, checked against the inventory."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from labctl.facts.compare import compare_declared
from labctl.hosts.agent_ship import call_agent
from labctl.hosts.fanout import HostResult, HostRun, Skipped, fan_out
from labctl.inventory.model import Host

if TYPE_CHECKING:
    from labctl.hosts.context import Context


def facts_step(torch: bool = True) -> Any:
    def step(run: HostRun) -> HostResult:
        if run.host.is_windows:
            raise Skipped("windows (the facts agent is Linux-only)")
        facts = call_agent(run, "facts.collect", {"torch": torch})
        return HostResult(run.host.name, "ok", data=facts, extra={"mismatches": mismatches(run.host, facts)})

    return step


def mismatches(host: Host, facts: dict[str, Any]) -> list[str]:
    declared = [g.model_dump() for g in host.gpus]
    return compare_declared(declared, host.ram_gb, facts)


def gather_facts(ctx: Context, hosts: Sequence[Host], torch: bool = True) -> list[HostResult]:
    return fan_out(ctx, hosts, facts_step(torch), label="facts")
