"""`labctl sandbox serve`: the sandbox service on the sandbox host, and its address and token
on every host that trains.

The service (labctl/agent/sandbox/service.py) runs each language the inventory gives the host,
with the limits this controller decides (limits.py), on the host's inventory address: the lab
network the trainers reach it on. Its token is made on the sandbox host; this module reads it
from that host's agent and writes it into a 0600 file on each training host (the bytes on the
SSH channel's stdin, the file created 0600: never a command line), then
tells those hosts' agents where the service is (client.json). The token is never printed,
logged or put in a command line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from labctl.output.errors import HostError, InputError
from labctl.sandbox.api import (
    DEFAULT_CONCURRENCY,
    build_hint,
    declared,
    host_failure,
    lang_spec,
    ready_hosts,
    sandbox_hosts,
)
from labctl.sandbox.limits import Limits

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.inventory.model import Host

DEFAULT_PORT = 8790
START_TIMEOUT_S = 120.0


def _one_host(ctx: Context, host: str | None) -> Host:
    hosts = sandbox_hosts(ctx, host)
    if len(hosts) != 1:
        names = ", ".join(h.name for h in hosts)
        raise InputError(
            f"{len(hosts)} hosts could serve sandboxes ({names}); the service runs on one.",
            f"Name it: --host {hosts[0].name}.",
        )
    return hosts[0]


def url_of(host: Host, port: int) -> str:
    address = f"[{host.address}]" if ":" in host.address else host.address
    return f"http://{address}:{port}"


def _trainers(ctx: Context) -> list[Host]:
    from labctl.orchestra.endpoints import consumers

    return consumers(ctx.inventory)


def serve(ctx: Context, host: str | None, port: int, concurrency: int | None = None) -> dict[str, Any]:
    """Start the service (or leave it running when its config is unchanged), then hand its
    address and token to the training hosts. {host, url, state, pid, langs, trainers}."""
    from labctl.hosts.agent_ship import ask_agent

    target = _one_host(ctx, host)
    langs = declared(target)
    ready_hosts(ctx, [target], langs)
    limits = Limits()
    pool = target.sandbox.pool if target.sandbox is not None else 4
    args = {
        "lab": ctx.inventory.lab,
        "host": target.name,
        "bind": target.address,
        "port": port,
        "langs": {lang: lang_spec(lang, limits) for lang in langs},
        "limits": limits.as_dict(),
        "pool": pool,
        "concurrency": concurrency or DEFAULT_CONCURRENCY,
    }
    try:
        started = ask_agent(ctx, target, "sandbox.serve", args, timeout=START_TIMEOUT_S)
    except HostError as e:
        raise host_failure(ctx, target, langs, e) from None
    url = url_of(target, int(started["port"]))
    served = [lang for lang, state in started["langs"].items() if state == "ready"]
    trainers = hand_out(ctx, target, {"url": url, "host": target.name, "langs": served})
    unbuilt = sorted(lang for lang, state in started["langs"].items() if state.startswith("no image"))
    return {
        "host": target.name,
        "url": url,
        "state": started["state"],
        "pid": started["pid"],
        "langs": started["langs"],
        "token_made": started["token_made"],
        "trainers": trainers,
        # Languages the inventory gives the host whose images are not built: the command that builds them.
        "build": build_hint(ctx, target, unbuilt) if unbuilt else None,
    }


def hand_out(ctx: Context, sandbox_host: Host, service: dict[str, Any]) -> dict[str, str]:
    """The token (a file created 0600, its bytes on stdin) and client.json on every training host: {host: "ok" | why not}.
    A host that cannot be reached is named, not fatal: the service runs either way."""
    from labctl.agent.core import paths
    from labctl.hosts.agent_ship import ask_agent, call_agent
    from labctl.hosts.fanout import HostResult, HostRun, fan_out

    trainers = _trainers(ctx)
    if not trainers:
        return {}
    token = ask_agent(ctx, sandbox_host, "sandbox.token", {})["token"].encode() + b"\n"

    def step(run: HostRun) -> HostResult:
        run.conn.put_bytes(token, paths.SANDBOX_CLIENT_TOKEN, mode=0o600, dir_mode=0o755)
        answer = call_agent(run, "sandbox.client", {"service": service})
        return HostResult(run.host.name, "ok", data=answer)

    results = fan_out(ctx, trainers, step, label="handing out the sandbox token", progress=False)
    return {r.host: "ok" if r.ok else str(r.error) for r in results}


def stop(ctx: Context, host: str | None) -> dict[str, Any]:
    """Stop the service (its batches in flight finish) and take its address off the trainers."""
    from labctl.hosts.agent_ship import ask_agent, call_agent
    from labctl.hosts.fanout import HostResult, HostRun, fan_out

    target = _one_host(ctx, host)
    answer = ask_agent(ctx, target, "sandbox.serve_stop", {"lab": ctx.inventory.lab, "host": target.name})

    def step(run: HostRun) -> HostResult:
        return HostResult(run.host.name, "ok", data=call_agent(run, "sandbox.client_remove", {}))

    trainers = _trainers(ctx)
    results = (
        fan_out(ctx, trainers, step, label="removing the sandbox address", progress=False) if trainers else []
    )
    return {
        "host": target.name,
        "stopped": answer["stopped"],
        "trainers": {r.host: "ok" if r.ok else str(r.error) for r in results},
    }


def state(ctx: Context, host: str | None) -> dict[str, Any]:
    from labctl.hosts.agent_ship import ask_agent

    target = _one_host(ctx, host)
    answer = ask_agent(
        ctx, target, "sandbox.serve_state", {"lab": ctx.inventory.lab, "host": target.name}, read_only=True
    )
    doc = {"host": target.name, **answer}
    if answer.get("port"):
        doc["url"] = url_of(target, int(answer["port"]))
    return doc
