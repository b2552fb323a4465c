"""`labctl sandbox`: run untrusted code in the sandbox host's hardened warm pool, and bench it.

Each command is one function here (engineer C adds `selftest` the same way); the work is in
labctl/sandbox/ and the host's agent.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from labctl.cli.common import InventoryOpt, JsonOpt, VerboseOpt, finite
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context

app = typer.Typer(
    help="Run untrusted programs in hardened, pre-started Docker containers (no network, capped everything).",
    no_args_is_help=True,
)

EXIT_TIMEOUT = 124  # as timeout(1)
MAX_INPUT_BYTES = 64 * 2**20  # a source or stdin file; it travels to the host inside one agent call

LangOpt = Annotated[str, typer.Option("--lang", help="The program's language, e.g. python or c.")]
HostOpt = Annotated[
    Optional[str],
    typer.Option(
        "--host", help="Sandbox host; default the inventory's host with the role sandbox.", show_default=False
    ),
]


def _read(path: str, what: str) -> bytes:
    """The file's bytes, as they are: a source in any encoding reaches the sandbox unchanged."""
    from labctl.output.errors import InputError

    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        else:
            with open(path, "rb") as f:  # at most the cap: /dev/zero is a file too
                data = f.read(MAX_INPUT_BYTES + 1)
    except OSError as e:
        raise InputError(
            f"cannot read the {what} {path}: {e.strerror}.", "Give a readable file, or - for stdin."
        ) from None
    if len(data) > MAX_INPUT_BYTES:
        raise InputError(
            f"the {what} {path} is over {MAX_INPUT_BYTES // 2**20} MiB, more than a sandbox run takes.",
            "Give a smaller file, or run it where it can read its data itself.",
        )
    return data


@app.command("run")
def run_cmd(
    ctx: typer.Context,
    file: Annotated[str, typer.Argument(help="The program's source file, or - to read it from stdin.")],
    lang: LangOpt,
    stdin_file: Annotated[
        Optional[str],
        typer.Option("--stdin", help="A file given to the program as its stdin.", show_default=False),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, max=3600, callback=finite, help="Wall-time limit, seconds.")
    ] = 10.0,
    memory: Annotated[
        int, typer.Option("--memory", min=6, max=65536, help="Memory limit (no swap), MB.")
    ] = 256,
    host: HostOpt = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Run one program in a fresh container of the sandbox host's warm pool.

    The source and the stdin file go to the program byte for byte, in whatever encoding. Its
    stdout and stderr are printed (each capped at 1 MiB; bytes that are not UTF-8 show as the
    replacement character, and --json adds stdout_b64/stderr_b64 with the exact bytes), then
    one summary line on stderr. labctl exits with the program's own exit code, 124 when it ran past
    --timeout (its container was killed, with everything in it), 1 when the host failed, 2 for
    bad input.

    Examples:

        labctl sandbox run --lang python hello.py

        echo 'print(input()[::-1])' | labctl sandbox run --lang python - --stdin words.txt --json
    """
    from labctl.sandbox.api import run
    from labctl.sandbox.render import render_run

    if file == "-" and stdin_file == "-":
        from labctl.output.errors import InputError

        raise InputError("the program and its stdin cannot both come from -.", "Give one of them as a file.")
    source = _read(file, "program")
    data = _read(stdin_file, "stdin file") if stdin_file is not None else None

    def work(c: Context) -> Outcome:
        res = run(source, lang, stdin=data, timeout=timeout, memory_mb=memory, host=host, ctx=c)
        keys = ("lang", "exit_code", "stdout", "stderr", "truncated", "timed_out", "oom_killed", "wall_ms")
        doc = {k: res.get(k) for k in keys}
        # Output that is not UTF-8: the text above has U+FFFD for it, these the exact bytes.
        doc.update({k: res[k] for k in ("stdout_b64", "stderr_b64") if k in res})

        return Outcome(doc, lambda: render_run(res), exit_code(res))

    run_command(ctx, work, inventory, json_out, verbose)


def exit_code(res: dict[str, Any]) -> int:
    if res.get("timed_out"):
        return EXIT_TIMEOUT
    code = res.get("exit_code")
    return int(code) if code is not None else 1


@app.command("bench")
def bench_cmd(
    ctx: typer.Context,
    lang: Annotated[str, typer.Option("--lang", help="Language of the hello-world.")] = "python",
    concurrency: Annotated[
        str, typer.Option("--concurrency", help="Comma list of concurrencies.")
    ] = "1,16,64",
    runs: Annotated[
        int, typer.Option("--runs", min=1, max=10000, help="Executions per concurrency and method.")
    ] = 64,
    host: HostOpt = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """The warm pool against `docker run --rm` with the same limits, same program, same run:
    per-execution latency p50/p95/p99 and executions per second at each concurrency.

    Example:

        labctl sandbox bench --lang python --concurrency 1,16,64 --runs 128
    """
    from labctl.sandbox.bench import bench
    from labctl.sandbox.render import render_bench

    levels = _levels(concurrency)

    def work(c: Context) -> Outcome:
        doc = bench(c, lang, levels, runs, host)
        failed = any(r["pool"]["errors"] or r["docker_run"]["errors"] for r in doc["rows"])
        return Outcome(doc, lambda: render_bench(c.console, doc), 1 if failed else 0)

    run_command(ctx, work, inventory, json_out, verbose)


def _levels(text: str) -> list[int]:
    from labctl.output.errors import InputError

    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or any(not 1 <= x <= 256 for x in levels):
        raise InputError(
            f"--concurrency '{text}' is not a comma list of 1 to 256.", "For example: --concurrency 1,16,64."
        )
    return levels


@app.command("serve")
def serve_cmd(
    ctx: typer.Context,
    port: Annotated[
        int, typer.Option("--port", min=1, max=65535, help="TCP port on the host's lab address.")
    ] = 8790,
    concurrency: Annotated[
        Optional[int],
        typer.Option(
            "--concurrency", min=1, max=256, help="Programs run at once (default 8).", show_default=False
        ),
    ] = None,
    stop: Annotated[
        bool, typer.Option("--stop", help="Stop the service and take its address off the trainers.")
    ] = False,
    status: Annotated[
        bool, typer.Option("--status", help="Say whether it runs and what it served; change nothing.")
    ] = False,
    host: HostOpt = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Serve the sandbox to the training hosts: programs in batches over HTTP, with a token.

    Starts a service on the sandbox host's inventory address that keeps the warm pools open
    and runs `POST /v1/batch` requests (each program against all its tests, in a container of
    its own; results in order). Then it writes the service's address and token onto every
    host with the role `train` (client.json, and client-token with mode 0600, in labctl's
    sandbox folder there), which the trainer's client (`labctl.agent.sandbox.client`)
    reads. A request without the token is refused. Run it again after a change: an
    unchanged service is left running.

    Examples:

        labctl sandbox serve
        labctl sandbox serve --status --json
        labctl sandbox serve --stop
    """
    from labctl.output.errors import InputError
    from labctl.sandbox import service
    from labctl.sandbox.render import render_served

    if stop and status:
        raise InputError("--stop and --status ask for two things.", "Pass one of them.")

    def work(c: Context) -> Outcome:
        if stop:
            doc = service.stop(c, host)
            return Outcome(doc, lambda: render_served(c.console, doc, "stopped"))
        if status:
            doc = service.state(c, host)
            return Outcome(
                doc,
                lambda: render_served(c.console, doc, doc["state"]),
                0 if doc["state"] == "running" else 1,
            )
        doc = service.serve(c, host, port, concurrency)
        failed = any(v != "ok" for v in doc["trainers"].values())
        return Outcome(doc, lambda: render_served(c.console, doc, doc["state"]), 1 if failed else 0)

    run_command(ctx, work, inventory, json_out, verbose)


@app.command("selftest")
def selftest_cmd(
    ctx: typer.Context,
    lang: Annotated[
        Optional[str],
        typer.Option(
            "--lang",
            help="Attack this language only; default the host's sandbox.languages.",
            show_default=False,
        ),
    ] = None,
    attack: Annotated[
        Optional[list[str]],
        typer.Option(
            "--attack",
            help="Run only this attack (repeat for more), e.g. after fixing what it found; default all.",
            show_default=False,
        ),
    ] = None,
    host: HostOpt = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Attack the sandbox and check it held: fork and memory bombs, full disks, output floods,
    escapes from the time limit, a CPU burn, network egress, /proc and host files, mount,
    unshare, keyctl, two runs killing each other, a compiler including host files.

    After each attack the host is checked: no container or process left, disk and memory back.
    Prints attack → contained yes/no with what was seen; exits 1 when any attack escaped or
    could not be run, 2 for bad input.

    Example:

        labctl sandbox selftest --lang python --host irina

        labctl sandbox selftest --lang c --attack fork_bomb --attack disk_fill_tmp
    """
    from labctl.sandbox.render import render_selftest
    from labctl.sandbox.selftest import on_hosts

    def work(c: Context) -> Outcome:
        doc = on_hosts(c, host, lang, attack or ())
        escaped = any(r["contained"] is not True for r in doc["rows"])
        return Outcome(doc, lambda: render_selftest(c.console, doc), 1 if escaped else 0)

    run_command(ctx, work, inventory, json_out, verbose)
