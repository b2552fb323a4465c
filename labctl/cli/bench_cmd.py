"""`labctl bench`: measure what the lab does, each stage against its ceiling and the seed's figures."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from labctl.cli.common import InventoryOpt, JsonOpt, VerboseOpt, positive
from labctl.cli.orchestra_cmd import bench_rotation
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context

app = typer.Typer(
    help="Measure model loading, the network between hosts and the orchestra's rotation (and make models to measure with).",
    no_args_is_help=True,
)
app.command("rotation")(bench_rotation)


@app.command("make-model")
def make_model(
    ctx: typer.Context,
    size_gb: Annotated[
        float, typer.Option("--size-gb", callback=positive, help="Approximate size of the weights in GB.")
    ] = 1.0,
    name: Annotated[Optional[str], typer.Option("--name", help="Folder name (default tinylm-SIZEg).")] = None,
    host: Annotated[
        Optional[str], typer.Option("--host", help="Where to write it (default: the storage host).")
    ] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="bf16, fp16 or fp32.")] = "bf16",
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Write a safetensors checkpoint of a real small transformer on a host's model folder.

    The weights are written on the host itself by labctl's agent (no torch needed there,
    nothing crosses the network), as `storage.models/NAME/` with `config.json`, so
    `bench model-load` can build the model and run real forward passes.

    Example: labctl bench make-model --size-gb 2 --host irina
    """
    from labctl.cache.targets import check_models, library_root, storage_host
    from labctl.hosts.agent_ship import call_agent
    from labctl.hosts.fanout import HostResult, HostRun, fan_out
    from labctl.hosts.recap import print_recap

    if name is not None:
        check_models(
            [name], "make-model", "For example: labctl bench make-model --name tinylm-2g --size-gb 2."
        )
    folder = name or f"tinylm-{size_gb:g}g"

    def work(c: Context) -> Outcome:
        target = storage_host(c.inventory, host)
        library = library_root(target)

        def step(run: HostRun) -> HostResult:
            args = {"models": library, "name": folder, "size_gb": size_gb, "dtype": dtype}
            ans = call_agent(run, "make_model", args, timeout=3600)
            return HostResult(run.host.name, "changed", data=ans)

        results = fan_out(c, [target], step, label=f"writing {size_gb:g} GB model")
        r = results[0]

        def render() -> None:
            if r.ok:
                d = r.data
                c.console.print(
                    f"[green]wrote[/] {target.name}:{d['path']} ({d['bytes'] / 1e9:.2f} GB in {d['seconds']:.1f} s)"
                )
            else:
                print_recap(c.console, results, title="make-model")

        return Outcome(r.to_json() | {"model": folder}, render, 0 if r.ok else 1)

    run_command(ctx, work, inventory, json_out, verbose)


@app.command("model-load")
def model_load(
    ctx: typer.Context,
    host: Annotated[
        Optional[str],
        typer.Option(
            "--host",
            help="Host to load on (default: the first with a model_cache; with --file, this machine).",
        ),
    ] = None,
    model: Annotated[
        Optional[str], typer.Option("--model", "-m", help="Model name in the storage host's model folder.")
    ] = None,
    file: Annotated[
        Optional[str],
        typer.Option(
            "--file",
            help="A .safetensors file or model folder already on the host (this machine without --host).",
        ),
    ] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda:N.")] = "cpu",
    python: Annotated[
        Optional[str],
        typer.Option(
            "--python", help="Interpreter with torch on the host (default: its provisioned torch_env)."
        ),
    ] = None,
    plot: Annotated[
        Optional[Path], typer.Option("--plot", help="Write a stacked-bar PNG of the stages here.")
    ] = None,
    out: Annotated[
        Optional[Path], typer.Option("--out", help="Also write the JSON result to this file.")
    ] = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Measure every stage of loading a model onto a device, each against its ceiling.

    Stages: network (storage host → RAM cache, labctl's cache sync), storage_cold (a read
    with the file's pages dropped), ram_cache (cache → host memory), h2d (pinned host →
    GPU), cuda_init, warmup (build the model, first forward pass) and forward (steady).
    Each shows seconds, GB/s, the ceiling measured or known for it and the share reached,
    beside the seed's figures (48 GB: 384 s over 1 Gb, 192 s bonded, ~15 s from RAM, ~40 s
    warm-up) scaled to this model. Stages that cannot run (no GPU) say why.

    Examples:

        labctl bench model-load --host m5 --model tinylm-1g --device cuda:0 --plot load.png

        labctl bench model-load --file /mnt/model-cache/tinylm-1g --json
    """
    from labctl.modelload.measure import measure_model_load, render_table, write_plot

    def work(c: Context) -> Outcome:
        result = measure_model_load(c, host=host, model=model, file=file, device=device, python=python)
        if out:
            import json

            from labctl.output.files import write_output

            write_output(out, json.dumps(result, indent=2))
        if plot:
            write_plot(result, plot)

        def render() -> None:
            render_table(c.console, result)
            if plot:
                c.console.print(f"chart: {plot}")

        return Outcome(result, render)

    run_command(ctx, work, inventory, json_out, verbose)


@app.command("network")
def network(
    ctx: typer.Context,
    sender: Annotated[Optional[str], typer.Option("--from", help="The host that sends.")] = None,
    receiver: Annotated[Optional[str], typer.Option("--to", help="The host that receives.")] = None,
    streams: Annotated[
        str, typer.Option("--streams", help="Stream counts to measure, comma-separated, e.g. 1,2,4.")
    ] = "1,2,4",
    seconds: Annotated[float, typer.Option("--seconds", help="How long each stream count sends.")] = 5.0,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Measure TCP throughput from one host to another with one and several streams.

    labctl's agent runs both ends: the receiver counts what arrives, the sender sends from
    memory, host to host (never through this machine). Each stream count shows Mbit/s and
    its share of the link (an up bond's speed from facts, else the slower end's NIC speed,
    else the inventory's nics[].speed_mbps), a line on why (802.3ad with layer3+4 hashing
    keeps one stream on one member, so only several streams reach the sum; balance-rr
    spreads one stream; no bond: one link), and the time a 48 GB model takes at the best rate,
    beside the lab's plan: 384 s over one 1 Gb link, 192 s over the 2 Gb bond.

    Example: labctl bench network --from irina --to m5 --streams 1,2,4 --seconds 5
    """
    from labctl.netbench.measure import measure_network
    from labctl.netbench.plan import check_seconds, parse_streams, pick_hosts
    from labctl.netbench.render import render_network

    counts = parse_streams(streams)
    check_seconds(seconds)

    def work(c: Context) -> Outcome:
        a, b = pick_hosts(c.inventory, sender, receiver)
        say = None if c.json_mode else (lambda text: c.console.print(f"[dim]{text}[/]", soft_wrap=True))
        report = measure_network(c, a, b, counts, seconds, say)
        return Outcome(report, lambda: render_network(c.console, report))

    run_command(ctx, work, inventory, json_out, verbose)
