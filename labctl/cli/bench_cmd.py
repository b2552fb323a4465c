"""`labctl bench`: measure what the lab does, each stage against its ceiling and the seed's figures."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from labctl.cli.common import InventoryOpt, JsonOpt, VerboseOpt, positive
from labctl.cli.orchestra_cmd import FileOpt, PythonOpt, bench_rotation
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context

app = typer.Typer(
    help="Measure model loading, the network between hosts, the orchestra's rotation and phase 3 (and make models to measure with).",
    no_args_is_help=True,
)
app.command("rotation")(bench_rotation)


@app.command("phase3")
def phase3(
    ctx: typer.Context,
    file: FileOpt = None,
    python: PythonOpt = None,
    train_set: Annotated[
        Optional[list[str]],
        typer.Option("--set", "-s", help="A phase-3 setting for the measured run (as `labctl train --set`)."),
    ] = None,
    profile: Annotated[
        Optional[str],
        typer.Option(
            "--profile", help="Settings for the measured run by name, e.g. cpu-demo (as `labctl train`)."
        ),
    ] = None,
    limit: Annotated[
        Optional[str], typer.Option("--limit", "-l", help="Train on these hosts (as `labctl train`).")
    ] = None,
    device: Annotated[
        Optional[str], typer.Option("--device", help="cuda or cpu for the measured run.")
    ] = None,
    train_python: Annotated[
        Optional[str], typer.Option("--train-python", help="The interpreter with torch for the measured run.")
    ] = None,
    rotate_at: Annotated[
        int, typer.Option("--rotate-at", min=1, help="Rotate once the run logged this step.")
    ] = 3,
    rounds: Annotated[int, typer.Option("--rounds", min=1, max=100, help="Orchestra cycles per k.")] = 5,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, max=4096, help="Tokens per answer.")] = 32,
    programs: Annotated[int, typer.Option("--programs", min=1, max=56, help="Tasks per sandbox batch.")] = 16,
    batches: Annotated[int, typer.Option("--batches", min=1, max=100, help="Sandbox batches measured.")] = 3,
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, max=64, help="For the sandbox's peers.")
    ] = 4,
    only: Annotated[
        Optional[str],
        typer.Option(
            "--only", help="Comma list of cycle, sandbox, training, learning (default the first three)."
        ),
    ] = None,
    learn: Annotated[
        bool,
        typer.Option(
            "--learn",
            help="Measure learning alone (--only learning): the reward per step against a warm coder "
            "model whose hint matters.",
        ),
    ] = False,
    learn_steps: Annotated[
        int, typer.Option("--learn-steps", min=2, max=10000, help="Steps of the learning run.")
    ] = 100,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Phase 3's three figures on the lab as it runs: the orchestra cycle for k warm models (asked at
    once against one after another), sandbox executions per second through `labctl sandbox serve`
    against `docker run --rm`, and training steps per second inside a rotation's window against
    outside it, with the failed steps.

    Needs the warm set (`labctl orchestra start`) and the sandbox service (`labctl sandbox serve`);
    the training figure runs `labctl train --phase 3` with --profile/--set/--limit/--device and
    rotates once.

    --learn: does phase 3 learn? A run of --learn-steps steps against a warm coder model whose
    hint matters (`labctl bench make-model --kind coder --hint-matters`: it solves a task only when
    the CET's context holds the task's tag), on the tasks it was trained on; the reward of every
    step, and its mean over the first and last 10 steps. --set wins over the run's settings, and
    they over --profile.

    Examples (the simulated lab; `labctl init` writes the example files):

        labctl bench phase3 -f inventory/examples/orchestra-sim.yaml --limit m5 --device cpu --profile cpu-demo --set steps=10

        labctl bench phase3 -f inventory/examples/orchestra-learn.yaml --learn --limit m5 --device cpu --profile cpu-demo
    """
    from labctl.output.errors import InputError
    from labctl.output.progress import shown
    from labctl.phase3 import bench as pb
    from labctl.phase3.render import PHASE3_PROGRESS, render_phase3

    if learn and only:
        raise InputError(
            "--learn and --only both choose what to measure.", "Give one: --learn is --only learning."
        )
    parts = [
        p.strip() for p in ("learning" if learn else only or "cycle,sandbox,training").split(",") if p.strip()
    ]
    unknown = sorted(set(parts) - {"cycle", "sandbox", "training", "learning"})
    if unknown or not parts:
        raise InputError(
            f"--only {only!r} names {unknown or 'nothing'}.",
            "Use a comma list of cycle, sandbox, training, learning.",
        )
    args: list[str] = ["--profile", profile] if profile else []
    for item in train_set or []:
        args += ["--set", item]
    if limit:
        args += ["--limit", limit]
    if device:
        args += ["--device", device]
    if train_python:
        args += ["--python", train_python]

    def work(c: Context) -> Outcome:
        from labctl.cli.orchestra_cmd import load

        progress = shown(c, PHASE3_PROGRESS)
        orch = load(c, file)
        doc: dict[str, Any] = {}
        if "cycle" in parts:
            progress.event("measuring", part="cycle")
            doc["cycle"] = pb.cycle_figure(c, orch, rounds, max_tokens)
        if "sandbox" in parts:
            progress.event("measuring", part="sandbox")
            doc["sandbox"] = pb.sandbox_figure(c, programs, batches, concurrency)
        if "training" in parts:
            progress.event("measuring", part="training")
            doc["training"] = pb.training_figure(c, orch, args, python, rotate_at, progress)
        if "learning" in parts:
            from labctl.phase3.learn import learning_figure

            progress.event("measuring", part="learning")
            doc["learning"] = learning_figure(c, orch, args, learn_steps, progress)
        failed = bool(doc.get("training", {}).get("failed_steps"))
        return Outcome(doc, lambda: render_phase3(c.console, doc), 1 if failed else 0)

    run_command(ctx, work, inventory, json_out, verbose)


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
    fmt: Annotated[
        Optional[str],
        typer.Option(
            "--format",
            help="tinylm (labctl's own, any --size-gb, no torch needed), hf (a tiny Llama-architecture "
            "Hugging Face model with a BPE tokenizer and a chat template) or gguf (the same model as a GGUF file). "
            "Default tinylm, or hf with --kind coder.",
            show_default=False,
        ),
    ] = None,
    kind: Annotated[
        str,
        typer.Option(
            "--kind",
            help="random (fresh weights) or coder (hf/gguf: trained on the host's CPU for about a minute "
            "to write the reference programs of the first phase-3 tasks, so phase 3's reward is above zero).",
        ),
    ] = "random",
    hint_matters: Annotated[
        bool,
        typer.Option(
            "--hint-matters",
            help="coder: write a task's program only when the hint (the CET's context) holds the task's tag "
            "letter, and a program that passes no test otherwise, so the CET has something to learn.",
        ),
    ] = False,
    tasks: Annotated[
        int,
        typer.Option(
            "--tasks",
            min=1,
            max=40,
            help="coder: how many phase-3 tasks it learns (the first whose solution fits 64 tokens).",
        ),
    ] = 8,
    seed: Annotated[
        Optional[int],
        typer.Option(
            "--seed",
            help="The weights' seed: the same seed writes the same model. Default: one made from the "
            "model's folder name, so two names write two models and the same name the same bytes.",
            show_default=False,
        ),
    ] = None,
    python: Annotated[
        Optional[str],
        typer.Option(
            "--python",
            help="hf/gguf: the host's interpreter with torch and transformers (default its torch_env).",
            show_default=False,
        ),
    ] = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Write a model of a real architecture on a host's model folder, made from a seed.

    tinylm: the weights are written on the host itself by labctl's agent (no torch needed
    there, nothing crosses the network), as `storage.models/NAME/` with `config.json`, so
    `bench model-load` can build the model and run real forward passes. hf and gguf: a tiny
    Llama-architecture model (a byte-level BPE tokenizer trained on the phase-3 tasks, a ChatML
    chat template) that the orchestra serves with labctl's server (hf) or llama.cpp (gguf);
    --size-gb does not apply to them. --kind coder: that model (about 5M parameters) trained on
    the host's CPU to answer phase 3's prompt for the first --tasks tasks (8) with their reference
    programs; its folder's labctl_coder.json names the trained and held-out tasks.

    Examples:

        labctl bench make-model --size-gb 2 --host irina

        labctl bench make-model --format gguf --name tiny-llama-gguf --host irina

        labctl bench make-model --kind coder --hint-matters --host irina
    """
    from labctl.cache.targets import check_models, library_root, storage_host
    from labctl.hosts.agent_ship import call_agent
    from labctl.hosts.fanout import HostResult, HostRun, fan_out
    from labctl.modelload.render import render_made

    if name is not None:
        check_models(
            [name], "make-model", "For example: labctl bench make-model --name tinylm-2g --size-gb 2."
        )
    from labctl.output.errors import InputError

    if kind not in ("random", "coder"):
        raise InputError(f"--kind {kind!r} is not a kind of model labctl makes.", "Use random or coder.")
    fmt = fmt or ("hf" if kind == "coder" else "tinylm")
    if fmt not in ("tinylm", "hf", "gguf"):
        raise InputError(f"--format {fmt!r} is not a model format labctl makes.", "Use tinylm, hf or gguf.")
    if kind == "coder" and fmt == "tinylm":
        raise InputError(
            "A coder model is a Hugging Face model.", "Use --format hf or gguf with --kind coder."
        )
    if (hint_matters or tasks != 8) and kind != "coder":
        raise InputError("--hint-matters and --tasks are for a coder model.", "Add --kind coder.")
    if kind == "coder":
        folder = name or f"tiny-coder{'-hint' if hint_matters else ''}-{fmt}"
    else:
        folder = name or (f"tinylm-{size_gb:g}g" if fmt == "tinylm" else f"tiny-llama-{fmt}")
    from labctl.modelload import seed_of

    weights_seed = seed if seed is not None else seed_of(folder)

    def work(c: Context) -> Outcome:
        target = storage_host(c.inventory, host)
        library = library_root(target)

        def step(run: HostRun) -> HostResult:
            args = {
                "models": library,
                "name": folder,
                "size_gb": size_gb,
                "dtype": dtype,
                "seed": weights_seed,
            }
            if fmt != "tinylm":
                args.update(format=fmt, python=python)
            if kind == "coder":
                args.update(kind=kind, hint_matters=hint_matters, tasks=tasks)
            ans = call_agent(run, "modelload.make_model", args, timeout=3600)
            return HostResult(run.host.name, "changed", data=ans)

        what = (
            f"{size_gb:g} GB model"
            if fmt == "tinylm"
            else f"{fmt} {'coder ' if kind == 'coder' else ''}model"
        )
        results = fan_out(c, [target], step, label=f"writing {what}")
        r = results[0]

        return Outcome(
            r.to_json() | {"model": folder},
            lambda: render_made(c.console, results, target.name, kind),
            0 if r.ok else 1,
        )

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
    from labctl.modelload.measure import measure_model_load, write_plot
    from labctl.modelload.render import render_load

    def work(c: Context) -> Outcome:
        result = measure_model_load(c, host=host, model=model, file=file, device=device, python=python)
        if out:
            import json

            from labctl.output.files import write_output

            write_output(out, json.dumps(result, indent=2))
        if plot:
            write_plot(result, plot)

        return Outcome(result, lambda: render_load(c.console, result, plot))

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
    from labctl.netbench.render import NETWORK_PROGRESS, render_network
    from labctl.output.progress import shown

    counts = parse_streams(streams)
    check_seconds(seconds)

    def work(c: Context) -> Outcome:
        a, b = pick_hosts(c.inventory, sender, receiver)
        report = measure_network(c, a, b, counts, seconds, shown(c, NETWORK_PROGRESS))
        return Outcome(report, lambda: render_network(c.console, report))

    run_command(ctx, work, inventory, json_out, verbose)
