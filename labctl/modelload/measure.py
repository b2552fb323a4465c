"""Orchestrating `labctl bench model-load` across the storage host and the loading host."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labctl.agent_ship import ask_agent
from labctl.cache.targets import Target, load_host, resolve_target, this_machine
from labctl.errors import HostError, InputError
from labctl.fanout import HostRun, on_host
from labctl.inventory.model import Host
from labctl.modelload.stages import STAGES, Stage, attach_seed, link_gbps, make_stage, speedup_ram_vs_network

if TYPE_CHECKING:
    from rich.console import Console

    from labctl.context import Context


def torch_python(ctx: Context, host: Host, given: str | None) -> str:
    """The interpreter with torch on `host`: --python, else its provisioned torch_env."""
    if given:
        return given
    facts = ask_agent(ctx, host, "facts", {"sections": ["torch_env"], "torch": False})
    env = facts.get("torch_env") or {}
    if env.get("provisioned") and env.get("python"):
        return str(env["python"])
    if host.connection == "local" and host.python == sys.executable and importlib.util.find_spec("torch"):
        return sys.executable  # this machine: labctl's own interpreter has torch
    raise InputError(
        f"{host.name} has no torch environment labctl knows of.",
        f"Provision one (labctl provision --tags torch_env --limit {host.name}) or pass --python PATH_WITH_TORCH.",
    )


def measure_model_load(
    ctx: Context, *, host: str | None, model: str | None, file: str | None, device: str, python: str | None
) -> dict[str, Any]:
    if bool(model) == bool(file):
        raise InputError("Give exactly one of --model NAME or --file PATH.", "e.g. --model tinylm-1g")
    # A file with no host is on this machine: no inventory needed.
    h = this_machine() if file and not host else load_host(ctx.inventory, host)
    measured: dict[str, dict[str, Any]] = {}
    bonded = False
    net_ceiling: tuple[float | None, str] = (None, "")
    if model:
        target = resolve_target(ctx.inventory, h.name)
        stored = target.stored(model)
        path = target.cached(model)
        measured["network"] = network_stage(ctx, target, model)
        measured["storage_cold"] = ask_agent(ctx, target.source, "read_cold", {"path": stored}, timeout=3600)
        if measured["storage_cold"].get("fstype") == "tmpfs":
            measured["storage_cold"] = {
                "skipped": f"{stored} is on tmpfs on {target.source.name}: no device to read cold"
            }
        facts = ask_agent(ctx, h, "facts", {"sections": ["nics"], "torch": False})
        declared = [n.speed_mbps for n in h.nics if n.speed_mbps]
        net_ceiling = link_gbps(facts, declared)
        bonded = net_ceiling[1].startswith("bond ")  # an active bond, not "no bond up"
    else:
        assert file is not None
        path = file
        for name in ("network", "storage_cold"):
            measured[name] = {"skipped": "--file: the model is already on the host"}
    py = torch_python(ctx, h, python)
    # The same host (and pooled connection) with the interpreter that has torch.
    with_torch = h.model_copy(update={"python": py})
    loaded = ask_agent(ctx, with_torch, "load_stages", {"path": path, "device": device}, timeout=3600)
    measured.update(loaded["stages"])
    nbytes = int(loaded["stages"]["ram_cache"]["bytes"])
    ceilings = {
        "network": net_ceiling,
        "ram_cache": (loaded.get("memcpy_gbps"), "memcpy, same run"),
        "h2d": (loaded.get("h2d_pinned_gbps"), "pinned H2D, same run"),
    }
    stages = [make_stage(n, measured.get(n), *ceilings.get(n, (None, None))) for n in STAGES]
    attach_seed(stages, nbytes, bonded)
    return {
        "host": h.name,
        "model": model or file,
        "path": path,
        "device": device,
        "bytes": nbytes,
        "torch": loaded.get("torch"),
        "stages": [s.to_json() for s in stages],
        "speedup_ram_vs_network": speedup_ram_vs_network(stages),
        "memcpy_gbps": loaded.get("memcpy_gbps"),
        "h2d_pinned_gbps": loaded.get("h2d_pinned_gbps"),
    }


def network_stage(ctx: Context, target: Target, model: str) -> dict[str, Any]:
    """A fresh `cache sync` of the model from the storage host: the network path, measured.

    A model already cached is evicted first so the transfer really happens (it is cached
    again at the end); a pinned one is left alone and the stage says so.
    """
    from labctl.cache.ops import evict
    from labctl.cache.sync import sync

    host = target.host.name

    def stage(run: HostRun) -> dict[str, Any]:
        if evict(run, target.cache, [model]).get("pinned"):
            return {"skipped": f"{model} is pinned in {host}'s cache; unpin it to measure the network path"}
        result = sync(run, target, [model])
        fetched = int(result.get("fetched_bytes") or 0)
        if not fetched:
            raise HostError(
                f"the network stage moved no bytes of {model} to {host}.", "Run `labctl cache status`."
            )
        return {"bytes": fetched, "seconds": float(result["seconds"]), "streams": result.get("streams")}

    return on_host(ctx, target.host, stage)


def render_table(console: Console, result: dict[str, Any]) -> None:
    from rich.table import Table

    t = Table(
        title=f"model load: {result['model']} ({result['bytes'] / 1e9:.2f} GB) on {result['host']} {result['device']}",
        title_justify="left",
    )
    for col in ("stage", "seconds", "GB/s", "ceiling GB/s", "% of ceiling", "seed, scaled", "note"):
        t.add_column(col, justify="left" if col in ("stage", "note") else "right")
    for s in result["stages"]:
        st = Stage(**s)
        if st.skipped:
            t.add_row(st.name, "-", "-", "-", "-", _f(st.seed_seconds, "s"), f"[dim]skipped: {st.skipped}[/]")
            continue
        t.add_row(
            st.name,
            _f(st.seconds, ""),
            _f(st.gbps, ""),
            _f(st.ceiling_gbps, ""),
            f"{st.pct_of_ceiling:.0f}%" if st.pct_of_ceiling is not None else "-",
            _f(st.seed_seconds, "s"),
            st.ceiling or "",
        )
    console.print(t)
    sp = result.get("speedup_ram_vs_network")
    if sp:
        console.print(
            f"RAM cache path vs network transfer: [bold]{sp:.1f}x[/] faster "
            "(seed: 384 s over 1 Gb against ~6 s from RAM to GPU; 14x for the whole load with init)"
        )


def _f(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}{unit}" if v < 10 else f"{v:.1f}{unit}"


def write_plot(result: dict[str, Any], path: Path) -> None:
    """A stacked bar of the measured stages beside the seed's scaled figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s["name"] for s in result["stages"]]
    measured = [s["seconds"] or 0.0 for s in result["stages"]]
    seed = [s["seed_seconds"] or 0.0 for s in result["stages"]]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colours = [plt.get_cmap("tab10")(i) for i in range(10)]
    for col, series in enumerate((measured, seed)):
        bottom = 0.0
        for i, v in enumerate(series):
            ax.barh(col, v, left=bottom, color=colours[i % 10], label=names[i] if col == 0 else None)
            bottom += v
    ax.set_yticks([0, 1], ["measured", "seed (scaled)"])
    ax.set_xlabel("seconds")
    ax.set_title(f"{result['model']} ({result['bytes'] / 1e9:.2f} GB) on {result['host']} {result['device']}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
