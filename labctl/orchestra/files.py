"""What the orchestra's models are, read from their files on the storage hosts.

One `modelload.describe` round trip per storage host (labctl/agent/modelload/formats.py reads
config.json, safetensors headers and GGUF headers; no weights): format, parameters, weight
bytes, context and the KV-cache geometry of each model of the library. A storage host that does
not answer, or a model it does not hold, leaves that model to what the orchestra file types:
planning never fails for want of files, and says what it could not read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.inventory.model import Host
    from labctl.orchestra.spec import Orchestra


def read_files(
    ctx: Context, orch: Orchestra, hosts: Sequence[Host]
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """({model name: modelload.describe's answer}, [notes on what could not be read])."""
    from labctl.cache.targets import resolve_target
    from labctl.hosts.agent_ship import call_agent
    from labctl.hosts.fanout import HostResult, HostRun, fan_out
    from labctl.output.errors import LabctlError

    # storage host -> {path: the model names} (two entries may serve the same files)
    wanted: dict[str, dict[str, list[str]]] = {}
    storage: dict[str, Host] = {}
    for host in hosts:
        try:
            target = resolve_target(ctx.inventory, host.name)
        except LabctlError:
            continue  # the rotation refuses such a host with its own words
        storage[target.source.name] = target.source
        for m in orch.models:
            names = wanted.setdefault(target.source.name, {}).setdefault(target.stored(m.folder), [])
            if m.name not in names:
                names.append(m.name)
    if not wanted:
        return {}, []

    def step(run: HostRun) -> HostResult:
        paths = sorted(wanted[run.host.name])
        answer = call_agent(run, "modelload.describe", {"paths": paths}, read_only=True)
        return HostResult(run.host.name, "ok", data=answer)

    results = fan_out(ctx, [storage[n] for n in sorted(wanted)], step, label="model files", progress=False)
    out: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for r in results:
        if not r.ok:
            notes.append(f"{r.host} did not say what the models are ({r.error}); sizes are the file's")
            continue
        for path, desc in ((r.data or {}).get("models") or {}).items():
            named = wanted[r.host].get(path) or []
            if not named or not isinstance(desc, dict):
                continue
            if desc.get("error"):
                continue  # not on the storage host (yet): the typed size stands
            for name in named:
                out.setdefault(name, dict(desc, storage=r.host, path=path))
    return out, notes
