"""What the hosts that train are told to ask: the warm set's addresses and the remote tiers.

Every rotation (and `orchestra start`/`stop`) rewrites the endpoints file (paths.ORCHESTRA_ENDPOINTS)
on each host with the `train` role; the trainer's client reads it per batch of calls
(`labctl.agent.orchestra.client.load_endpoints`), so discovery follows the rotation. A model
that leaves is taken out of the file before its server is stopped (the drain), and a joiner is
added once its health check passed. The file holds addresses and the names of key variables:
the keys stay in the trainer's environment.

Beside its address each model carries what the trainer needs to ask it and to check its budget
before a run (client.check_budget): `api` (completions or chat), `timeout_s`, and, for a warm
model, `engine`, `max_tokens` (the most one request may ask: labctl's server's cap; null: up to
the context) and `context` (the tokens it is served with, as its start computed them); a remote
tier, its `share` of phase 3's tries and its `budget_per_month` (agent/orchestra/spend.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from labctl.inventory.model import Host, Inventory
    from labctl.orchestra.spec import Orchestra, RemoteTier


def consumers(inventory: Inventory) -> list[Host]:
    """The hosts that train (role train), which phase 3's trainers run on: where the file goes."""
    return [h for h in inventory.hosts.values() if "train" in h.roles and not h.is_windows]


def serving_facts(
    orch: Orchestra, files: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """{model: {api, timeout_s, engine, max_tokens, context}} for each model of the library:
    its orchestra entry, its engine's cap, and the context rotate.start_args serves it with
    (`files`: what modelload.describe read of each, which caps the context at the model's own)."""
    from labctl.orchestra.engines import engine
    from labctl.orchestra.sizes import served_context

    out: dict[str, dict[str, Any]] = {}
    for m in orch.models:
        eng = engine(orch.engine_name(m.name))
        # A server.command template is given no context: what it serves is its own affair.
        context = (
            None
            if eng.name == "command"
            else served_context(m.context, orch.context, (files or {}).get(m.name))
        )
        out[m.name] = {
            "api": m.api,
            "timeout_s": m.timeout_s,
            "engine": eng.name,
            "max_tokens": eng.max_tokens,
            "context": context,
        }
    return out


def endpoints_doc(
    lab: str,
    hosts: Mapping[str, Host],
    warm: Mapping[str, Sequence[Mapping[str, Any]]],
    remote: Sequence[RemoteTier],
    without: Mapping[str, Collection[str]] | None = None,
    facts: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The file's document: each warm model's API on its host's inventory address (less the
    models in `without`, which are draining), with its `facts.collect` (serving_facts; a model without
    them is asked with completions and the client's timeout, its budget unchecked), then the
    remote tiers."""
    leaving = without or {}
    known = facts or {}
    models = [
        {
            "name": m["name"],
            "model": m["name"],  # labctl's server (and vLLM with --served-model-name {name}) holds it so
            "base_url": f"http://{_url_host(hosts[host].address)}:{int(m['port'])}/v1",
            "host": host,
            "api": "completions",
            **known.get(m["name"], {}),
        }
        for host in sorted(warm)
        if host in hosts
        for m in warm[host]
        if m.get("port") and m["name"] not in leaving.get(host, ())
    ]
    return {
        "lab": lab,
        "models": models,
        "remote": [
            {
                "name": r.name,
                "model": r.model,
                "base_url": r.base_url,
                "api_key_env": r.api_key_env,
                "concurrency": r.concurrency,
                "timeout_s": r.timeout_s,
                "price_per_mtok": {"input": r.price_per_mtok.input, "output": r.price_per_mtok.output},
                "api": r.api,
                "max_tokens": r.max_tokens,
                "context": r.context,
                "share": r.share,
                "budget_per_month": r.budget_per_month,
            }
            for r in remote
        ],
    }


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address
