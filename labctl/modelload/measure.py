"""Orchestrating `labctl bench model-load` across the storage host and the loading host."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labctl.cache.targets import Target, load_host, resolve_target, this_machine
from labctl.hosts.agent_ship import ask_agent
from labctl.hosts.fanout import HostRun, on_host
from labctl.inventory.model import Host
from labctl.modelload.stages import STAGES, attach_seed, link_gbps, make_stage, speedup_ram_vs_network
from labctl.output.errors import HostError, InputError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from labctl.hosts.context import Context


def torch_python(ctx: Context, host: Host, given: str | None) -> str:
    """The interpreter with torch on `host`: --python, else its provisioned torch_env."""
    if given:
        return given
    facts = ask_agent(ctx, host, "facts.collect", {"sections": ["torch_env"], "torch": False})
    env = facts.get("torch_env") or {}
    if env.get("provisioned") and env.get("python"):
        return str(env["python"])
    if host.connection == "local" and host.python == sys.executable and importlib.util.find_spec("torch"):
        return sys.executable  # this machine: labctl's own interpreter has torch
    from labctl.provision.hint import provision_fix

    raise InputError(
        f"{host.name} has no torch environment labctl knows of.",
        f"Provision one ({provision_fix(ctx.inventory, host.name, 'torch_env')}) or pass --python PATH_WITH_TORCH.",
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
        measured["storage_cold"] = ask_agent(
            ctx, target.source, "modelload.read_cold", {"path": stored}, timeout=3600
        )
        if measured["storage_cold"].get("fstype") == "tmpfs":
            measured["storage_cold"] = {
                "skipped": f"{stored} is on tmpfs on {target.source.name}: no device to read cold"
            }
        facts = ask_agent(ctx, h, "facts.collect", {"sections": ["nics"], "torch": False})
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
    loaded = ask_agent(
        ctx, with_torch, "modelload.load_stages", {"path": path, "device": device}, timeout=3600
    )
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


# The chart's rows: the two ways the weights reach the device, each with only its own source stage
# (h2d follows either, so it is in both), what follows either way, and the storage host's cold read
# (inside the network transfer, shown for reference, never added to it).
PLOT_ROWS = [
    ("network", "from the network\n(network + h2d)", ["network", "h2d"]),
    ("ram_cache", "from the RAM cache\n(ram_cache + h2d)", ["ram_cache", "h2d"]),
    ("common", "either way, then\n(cuda_init, warmup, forward)", ["cuda_init", "warmup", "forward"]),
    ("storage_cold", "storage host, cold read\n(reference, part of network)", ["storage_cold"]),
]


def plot_figure(result: dict[str, Any], now: datetime | None = None) -> Figure:
    """The chart as a Figure (Agg, no pyplot state), for write_plot and for tests to inspect.

    Measured segments carry gid "<row>:<stage>", the seed's "seed:<row>:<stage>"; `now` is the
    measurement's time for the title.
    """
    # matplotlib is optional (the `plot` extra) and slow to import: only here, headless.
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    when = now or datetime.now()
    by = {s["name"]: s for s in result["stages"]}
    tab10 = colormaps["tab10"]
    colour = {name: tab10(i % 10) for i, name in enumerate(STAGES)}
    fig = Figure(figsize=(10, 5.5), layout="constrained")
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ends: list[tuple[int, float, str]] = []  # row, where its text starts, the text
    top = 1e-3  # the longest bar, seconds
    for row, (key, _label, names) in enumerate(PLOT_ROWS):
        measured = [n for n in names if n in by and not by[n]["skipped"]]  # in the table's order
        skipped = [n for n in names if n not in measured]
        seed_left = 0.0
        for n in names:
            seed = by[n]["seed_seconds"] if n in by else None
            if seed:
                ax.barh(
                    row + 0.27,
                    seed,
                    left=seed_left,
                    height=0.2,
                    color=colour[n],
                    alpha=0.45,
                    hatch="///",
                    edgecolor="white",
                    linewidth=0,
                    gid=f"seed:{key}:{n}",
                )
                seed_left += seed
        top = max(top, seed_left)
        # A path without its own stage measures nothing: say why instead of drawing the rest.
        own = names[0] if key != "common" else None
        if own in skipped or not measured:
            gone = [own] if own else names
            why = "; ".join(dict.fromkeys(by[n]["skipped"] if n in by else "not measured" for n in gone))
            ends.append((row, 0.0, "\n".join(textwrap.wrap(f"{', '.join(gone)} skipped: {why}", 70))))
            continue
        left = 0.0
        for n in measured:
            ax.barh(
                row - 0.08,
                by[n]["seconds"],
                left=left,
                height=0.45,
                color=colour[n],
                edgecolor="black",
                linewidth=0.5,
                gid=f"{key}:{n}",
            )
            left += by[n]["seconds"]
        top = max(top, left)
        text = f"{left:.3g} s"
        if key == "ram_cache" and result.get("speedup_ram_vs_network"):
            text += f": {result['speedup_ram_vs_network']:.1f}x faster than the network"
        if skipped:
            text += f" ({', '.join(skipped)} skipped)"
        ends.append((row, left, text))
    ax.set_yticks(range(len(PLOT_ROWS)), [label for _k, label, _n in PLOT_ROWS])
    ax.set_ylim(len(PLOT_ROWS) - 0.5, -0.5)  # the network on top
    ax.set_xlabel("seconds (thick: measured here; thin, hatched: the seed's figure scaled to this model)")
    ax.set_title(
        f"Loading {result['model']} ({result['bytes'] / 1e9:.2f} GB) on {result['host']} {result['device']}, "
        f"{when:%Y-%m-%d %H:%M}",
        fontsize=11,
    )
    unmeasured = {n for n in STAGES if n not in by or by[n]["skipped"]}
    handles = [
        Patch(
            facecolor="none" if n in unmeasured else colour[n],
            edgecolor=colour[n],
            hatch="xx" if n in unmeasured else None,
            label=f"{n} (skipped)" if n in unmeasured else n,
        )
        for n in STAGES
    ]
    ax.legend(
        handles=handles,
        title="stage",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize="small",
        borderaxespad=0,
    )
    reasons: dict[str, list[str]] = {}
    for n in STAGES:
        if n in by and by[n]["skipped"]:
            reasons.setdefault(by[n]["skipped"], []).append(n)
    notes = []
    if result.get("speedup_ram_vs_network"):
        notes.append("Speedup as in the table: network ÷ (ram_cache + h2d).")
    if reasons:
        notes.append(
            "Skipped, not measured: " + "; ".join(f"{', '.join(ns)}: {r}" for r, ns in reasons.items()) + "."
        )
    if notes:
        fig.supxlabel("\n".join(line for n in notes for line in textwrap.wrap(n, 140)), fontsize=8)
    ax.set_xlim(0, top * 1.05)
    # Bar-end texts are measured where they will be drawn: lay the figure out once, freeze it,
    # then widen the x axis until every text ends inside it.
    canvas.draw()
    fig.set_layout_engine("none")
    renderer = canvas.get_renderer()
    width = ax.get_window_extent(renderer).width
    right = top * 1.05
    for row, x, text in ends:
        drawn = ax.annotate(
            text, (x, row - 0.08), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8
        )
        share = (drawn.get_window_extent(renderer).width + 12) / width  # of the axes, offset and margin
        right = max(right, x / max(1 - share, 0.05))
    ax.set_xlim(0, right)
    return fig


def write_plot(result: dict[str, Any], path: Path, now: datetime | None = None) -> None:
    from labctl.output.files import save_figure

    save_figure(plot_figure(result, now), path, dpi=120)
