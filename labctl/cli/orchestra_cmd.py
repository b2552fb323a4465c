"""`labctl orchestra plan|status|start|stop` and `labctl rotate`: the LLM orchestra's warm set."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from labctl.cli.common import DryRunAlias, InventoryOpt, JsonOpt, VerboseOpt, check_option, finite
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.orchestra.spec import Orchestra

app = typer.Typer(
    help=(
        "The LLM orchestra: models kept warm on the inference GPUs for phase-3 training. "
        "plan places them, start/stop loads or unloads the warm set, status shows it; "
        "`labctl rotate` swaps part of it."
    ),
    no_args_is_help=True,
)

FileOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--file",
        "-f",
        help="Orchestra file. Default: playbooks/orchestra.yaml beside the inventory, else in the current folder.",
        show_default=False,
    ),
]
CheckOpt = Annotated[bool, check_option("Decide and show every step; start, stop and write nothing.")]
PythonOpt = Annotated[
    Optional[str],
    typer.Option(
        "--python",
        help="Interpreter with torch for labctl's model server on the hosts (default: the file's "
        "server.python, else the host's torch_env, else its python).",
        show_default=False,
    ),
]
WaitOpt = Annotated[
    Optional[float],
    typer.Option(
        "--wait",
        min=0,
        callback=finite,
        help="Seconds to wait for another rotation on the same host (default 600; 0: refuse at once).",
        show_default=False,
    ),
]


def load(c: Context, file: Optional[Path]) -> Orchestra:
    from labctl.orchestra.spec import default_path, load_orchestra

    return load_orchestra(file or default_path(c.inventory_path))


@app.command("plan")
def plan_cmd(
    ctx: typer.Context,
    file: FileOpt = None,
    offline: Annotated[
        bool,
        typer.Option("--offline", help="Plan from the inventory's declared GPUs; ask no host."),
    ] = False,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Place the warm set on the inference GPUs by memory, and show what the lab can hold.

    Each model's format, parameters and weight bytes are read from its files on the storage
    host (Hugging Face folders, GGUF files, tinylm), and its KV cache from its layers, heads and
    the context it will serve; its engine is checked against the format and the GPU's compute
    capability (vLLM needs 7.5, so a P40 takes GGUF through llama.cpp) before anything starts.

    GPUs the hosts detect win over the inventory's declaration (--offline: declared only); the
    GPUs training keeps (playbooks/train.yaml: the V100) are left out. A model that fits no GPU
    is refused with the reason. The capacity view counts how many 7B fp16, 13B fp16 and 70B
    4-bit models fit, beside the lab's plan (15-20 7B fp16 models on M5's GPUs, for example).

    Examples:

        labctl orchestra plan

        labctl orchestra plan --offline --json | jq '.placement'
    """
    from labctl.orchestra.decide import plan_placement
    from labctl.orchestra.render import render_plan
    from labctl.orchestra.rotate import serving_hosts

    def work(c: Context) -> Outcome:
        orch = load(c, file)
        hosts = serving_hosts(c, orch)
        views = None
        files: dict = {}
        notes: list[str] = []
        if not offline:
            from labctl.orchestra.files import read_files
            from labctl.orchestra.hoststate import read_views

            views = read_views(c, hosts, orch.server.health)
            files, notes = read_files(c, orch, hosts)
        shown = plan_placement(c.inventory, orch, hosts, views, files, notes)
        return Outcome(shown.to_json(), lambda: render_plan(c.console, shown))

    run_command(ctx, work, inventory, json_out, verbose)


@app.command("ask")
def ask_cmd(
    ctx: typer.Context,
    prompt: Annotated[
        Optional[str],
        typer.Argument(
            help="The text every model continues (with --task: the CET's hint in phase 3's prompt).",
            show_default=False,
        ),
    ] = None,
    task: Annotated[
        Optional[str],
        typer.Option(
            "--task",
            help="Ask phase 3's prompt for this task (e.g. sum_two), as the trainers do.",
            show_default=False,
        ),
    ] = None,
    file: FileOpt = None,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", min=1, max=4096, help="Tokens each model may add.")
    ] = 32,
    temperature: Annotated[
        float, typer.Option("--temperature", min=0, max=2, callback=finite, help="0: greedy (the default).")
    ] = 0.0,
    remote: Annotated[
        bool,
        typer.Option(
            "--remote/--no-remote", help="Ask the remote tiers whose key is set here too (default)."
        ),
    ] = True,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Ask every warm model at once, as phase 3's trainer does; one answer each, with its latency.

    Every model speaks the OpenAI-compatible completions API; the warm set is read from the
    serving hosts, and each remote tier is asked when its key's variable is set in this shell.
    A model that cannot take the request (stopped, loading) is answered by another, and the
    table says by whom. Exit 1 when a model gives no answer even so.

    Examples:

        labctl orchestra ask 'def add(a, b):'

        labctl orchestra ask --no-remote --json 'x =' | jq '.answers[] | {name, latency_s}'

        labctl orchestra ask --task sum_two --max-tokens 64
    """
    from labctl.orchestra.ask import ask
    from labctl.orchestra.render import render_answers
    from labctl.output.errors import InputError

    if task is not None:
        from labctl.agent.models.prompting import ask_prompt
        from labctl.agent.models.tasks import TASKS

        found = [t for t in TASKS if t.name == task]
        if not found:
            from labctl.documents.suggest import did_you_mean

            raise InputError(
                f"--task {task!r} is no phase-3 task{did_you_mean(task, [t.name for t in TASKS])}.",
                f"Name one of the {len(TASKS)}: {', '.join(t.name for t in TASKS[:6])}, ...",
            )
        prompt = ask_prompt(found[0], prompt or "")
    elif prompt is None:
        raise InputError("Nothing to ask.", "Give the text the models continue, or --task NAME.")

    def work(c: Context) -> Outcome:
        result = ask(c, load(c, file), prompt, max_tokens, temperature, remote)
        return Outcome(result.to_json(), lambda: render_answers(c.console, result), 0 if result.ok else 1)

    run_command(ctx, work, inventory, json_out, verbose)


@app.command("status")
def status_cmd(
    ctx: typer.Context,
    file: FileOpt = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """What is warm where, since when, whether it answers; the last and next rotation; cache hits.

    The next rotation is read from the schedule `labctl cron install rotate` installed (its
    host's cron entry, and whether a cron daemon runs there); without one it says "not
    scheduled". Exit 1 when a recorded model does not answer (the next rotation repairs it).

    Example: labctl orchestra status --json | jq '.models[] | {name, healthy}'
    """
    from labctl.orchestra.render import render_status
    from labctl.orchestra.spec import default_path
    from labctl.orchestra.status import orchestra_status

    def work(c: Context) -> Outcome:
        path = file or default_path(c.inventory_path)
        orch = load(c, path)
        st = orchestra_status(c, orch, path)
        code = 0 if all(r["healthy"] for r in st.rows) and not st.notes else 1
        return Outcome(st.to_json(), lambda: render_status(c.console, st), code)

    run_command(ctx, work, inventory, json_out, verbose)


def run_rotation(
    ctx: typer.Context,
    kind: str,
    file: Optional[Path],
    check: bool,
    python: Optional[str],
    wait: Optional[float],
    inventory: Optional[Path],
    json_out: bool,
    verbose: int,
    out: Optional[list[str]] = None,
    in_: Optional[list[str]] = None,
) -> None:
    """Rotate, start or stop; print or emit; exit 1 on a host failure (the error is raised)."""
    from labctl.orchestra.render import ROTATION_PROGRESS, render_rotation
    from labctl.orchestra.rotate import Options, rotate
    from labctl.output.progress import shown

    def work(c: Context) -> Outcome:
        orch = load(c, file)
        result = rotate(
            c,
            orch,
            Options(kind, out or (), in_ or (), check, python, wait, shown(c, ROTATION_PROGRESS)),
        )
        return Outcome(result.to_json(), lambda: render_rotation(c.console, result, orch))

    run_command(ctx, work, inventory, json_out, verbose)


@app.command("start")
def start_cmd(
    ctx: typer.Context,
    file: FileOpt = None,
    check: CheckOpt = False,
    _dry_run: DryRunAlias = False,
    python: PythonOpt = None,
    wait: WaitOpt = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Load the whole warm set: the first `warm` models of the library (pinned ones first),
    synced into the RAM cache where missing, each started and health-checked on its GPU.

    Run again after a failure: what answers is kept, the rest is started. warm.json on each
    serving host then tells phase-3 training the set is loaded.

    Example: labctl orchestra start --check
    """
    run_rotation(ctx, "start", file, check, python, wait, inventory, json_out, verbose)


@app.command("stop")
def stop_cmd(
    ctx: typer.Context,
    file: FileOpt = None,
    check: CheckOpt = False,
    _dry_run: DryRunAlias = False,
    wait: WaitOpt = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Unload the whole warm set: every server of this lab on each serving host stopped, whether
    warm.json lists it or not (SIGTERM, SIGKILL after the file's stop_grace), GPU memory freed,
    warm.json emptied (phase 3 then refuses to start). Another lab's servers on the same machine
    are left alone. Each host is then asked again: exit 1 naming any server still running (pid,
    model, port) and the command that stops it."""
    run_rotation(ctx, "stop", file, check, None, wait, inventory, json_out, verbose)


def rotate_cmd(
    ctx: typer.Context,
    file: FileOpt = None,
    out: Annotated[
        Optional[list[str]],
        typer.Option(
            "--out", help="A warm model to take out (repeatable); default the least recently rotated in."
        ),
    ] = None,
    in_: Annotated[
        Optional[list[str]],
        typer.Option(
            "--in", help="A library model to bring in (repeatable); default the next in the library's order."
        ),
    ] = None,
    check: CheckOpt = False,
    _dry_run: DryRunAlias = False,
    python: PythonOpt = None,
    wait: WaitOpt = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Swap part of the LLM orchestra's warm set (the file's `rotate`, default 2 models).

    Who leaves: the least recently rotated in, never a pinned model. Who joins: the next models
    in the library's order (or --in/--out). Joining models are synced into the RAM cache if
    missing (evicting only cold models), started on their GPUs and health-checked before the
    leaving ones are stopped (make-before-break; where memory does not allow it, the leaving
    one goes first). Every stage is timed. A lock on each serving host makes a second rotation
    wait (--wait) or refuse; a rotation killed half-way is repaired by the next one. A model on a
    GPU the inventory no longer has moves to one it has, models over the warm count or gone from
    the file leave; the hosts are then read again, and anything that differs from the plan is an
    error (exit 1) naming it.

    Examples:

        labctl rotate --check

        labctl rotate --out CodeLlama-7B-Instruct --in Gemma-2-9B-it --json
    """
    run_rotation(ctx, "rotate", file, check, python, wait, inventory, json_out, verbose, out, in_)


def bench_rotation(
    ctx: typer.Context,
    file: FileOpt = None,
    python: PythonOpt = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Measure one real rotation by stage (cache, load, warm-up, health, stop) and as a share of
    the cadence, beside the lab's planned figures (15 s load from the RAM cache + 40 s warm-up per
    model, about 2 minutes a rotation: under 1% of a 4-hour cadence).

    Runs `labctl rotate` once (the warm set is started first if nothing is warm).

    Example: labctl bench rotation --json
    """
    from labctl.orchestra.bench import rotation_bench
    from labctl.orchestra.render import ROTATION_PROGRESS, render_bench
    from labctl.output.progress import shown

    def work(c: Context) -> Outcome:
        orch = load(c, file)
        report = rotation_bench(c, orch, python, shown(c, ROTATION_PROGRESS))
        return Outcome(report, lambda: render_bench(c.console, report))

    run_command(ctx, work, inventory, json_out, verbose)
