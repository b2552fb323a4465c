"""What the hosts that train are told to ask: the warm set's addresses and the remote tiers.

Every rotation (and `orchestra start`/`stop`) rewrites the endpoints file (paths.ORCHESTRA_ENDPOINTS)
on each host with the `train` role; the trainer's client reads it per batch of calls
(`labctl.agent.orchestra.client.load_endpoints`), so discovery follows the rotation. A model
that leaves is taken out of the file before its server is stopped (the drain), and a joiner is
added once its health check passed. The file holds addresses and the names of key variables:
the keys stay in the trainer's environment.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from labctl.inventory.model import Host, Inventory
    from labctl.orchestra.spec import RemoteTier


def consumers(inventory: Inventory) -> list[Host]:
    """The hosts that train (role train), which phase 3's trainers run on: where the file goes."""
    return [h for h in inventory.hosts.values() if "train" in h.roles and not h.is_windows]


def endpoints_doc(
    lab: str,
    hosts: Mapping[str, Host],
    warm: Mapping[str, Sequence[Mapping[str, Any]]],
    remote: Sequence[RemoteTier],
    without: Mapping[str, Collection[str]] | None = None,
) -> dict[str, Any]:
    """The file's document: each warm model's completions API on its host's inventory address
    (less the models in `without`, which are draining), then the remote tiers."""
    leaving = without or {}
    models = [
        {
            "name": m["name"],
            "model": m["name"],  # labctl's server (and vLLM with --served-model-name {name}) holds it so
            "base_url": f"http://{_url_host(hosts[host].address)}:{int(m['port'])}/v1",
            "host": host,
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
            }
            for r in remote
        ],
    }


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address
