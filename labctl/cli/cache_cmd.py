"""`labctl cache`: fill a host's RAM model cache from the storage host, and keep it in bounds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from labctl.cli.common import InventoryOpt, JsonOpt, VerboseOpt
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.hosts.fanout import HostResult, Step
    from labctl.inventory.model import Host
    from labctl.output.bars import Bars

app = typer.Typer(
    help=(
        "The RAM model cache: copy models into it host to host (sync), see what it holds (status), "
        "evict, verify, pin."
    ),
    no_args_is_help=True,
)

HostOpt = Annotated[
    str,
    typer.Option(
        "--host",
        help="Cache host(s): a name, a comma list or role:NAME (hosts with a model_cache).",
        show_default=False,
    ),
]
HostsOpt = Annotated[
    Optional[str],
    typer.Option("--host", help="Cache host(s); default every host with a model_cache.", show_default=False),
]
StreamsOpt = Annotated[
    int,
    typer.Option(
        "--streams",
        min=1,
        max=64,
        help="Parallel TCP streams per copy (a layer3+4 bond spreads them over its links).",
    ),
]


@app.command("sync")
def sync_cmd(
    ctx: typer.Context,
    models: Annotated[list[str], typer.Argument(help="Model names in the storage host's model folder.")],
    host: HostOpt,
    streams: StreamsOpt = 4,
    chunk_mb: Annotated[
        int,
        typer.Option("--chunk-mb", min=1, max=1024, help="Chunk size in MiB: the unit hashed and resumed."),
    ] = 64,
    port: Annotated[
        int,
        typer.Option("--port", min=0, max=65535, help="Port the storage host listens on (0: any free one)."),
    ] = 0,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Copy models from the storage host (model_cache.source) into a host's RAM cache.

    The storage host serves the files and the cache host pulls them over parallel TCP
    streams, host to host: the data never passes through this machine. Every chunk is
    checked by sha256; an interrupted copy resumes; a model is listed as cached only once
    complete and verified. When the cache lacks room, least recently used unpinned models
    are evicted first; when room cannot be made, nothing is copied. Models already cached
    are left alone.

    Examples:

        labctl cache sync tinylm-1g --host m5

        labctl cache sync llama-8b qwen-7b --host m5 --streams 4 --json
    """
    from labctl.cache.render import render_sync
    from labctl.cache.sync import prepare
    from labctl.cache.targets import check_models, resolve_target
    from labctl.hosts.fanout import HostResult, HostRun
    from labctl.inventory.select import select_hosts
    from labctl.output.bars import Bars
    from labctl.output.progress import shown

    names = check_models(models, "sync")
    chunk = chunk_mb << 20

    def work(c: Context) -> Outcome:
        targets = [
            resolve_target(c.inventory, h.name) for h in select_hosts(c.inventory, host, label="--host")
        ]
        # Servers start on the storage hosts while the caches' states are read: one round trip.
        prepared = prepare(c, targets, names, chunk, port)
        bars = Bars(c.console, enabled=not c.json_mode and c.console.is_terminal)
        progress = shown(c, bars.shows())

        def step(run: HostRun) -> HostResult:
            data = prepared[run.host.name].sync(run, streams=streams, progress=progress)
            return HostResult(run.host.name, "changed" if data["changed"] else "ok", data=data)

        return _fan(
            c,
            [t.host for t in targets],
            step,
            "cache sync",
            lambda rs: render_sync(c.console, rs, verbose),
            bars,
        )

    run_command(ctx, work, inventory, json_out, verbose)


@app.command("status")
def status_cmd(
    ctx: typer.Context,
    host: HostsOpt = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """What each cache holds: models, sizes, when last used, pinned, when verified; and its room.

    Examples:

        labctl cache status

        labctl cache status --host m5 --json | jq '.results[0].models'
    """
    from labctl.cache.ops import cache_state
    from labctl.cache.render import render_status
    from labctl.cache.targets import cache_hosts
    from labctl.hosts.fanout import HostResult, HostRun

    def step(run: HostRun) -> HostResult:
        assert run.host.model_cache is not None
        return HostResult(run.host.name, "ok", data=cache_state(run, run.host.model_cache))

    def work(c: Context) -> Outcome:
        hosts = cache_hosts(c.inventory, host)
        return _fan(
            c, hosts, step, "cache status", lambda rs: render_status(c.console, rs), to_json=_status_json
        )

    run_command(ctx, work, inventory, json_out, verbose)


@app.command("evict")
def evict_cmd(
    ctx: typer.Context,
    models: Annotated[list[str], typer.Argument(help="Cached models to remove.")],
    host: HostOpt,
    force: Annotated[bool, typer.Option("--force", help="Evict pinned models too.")] = False,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Remove models from a host's cache (its partial copy too). Pinned ones need --force.

    Example:

        labctl cache evict tinylm-1g --host m5
    """
    from labctl.cache.ops import evict
    from labctl.cache.render import render_evict
    from labctl.cache.targets import cache_hosts, check_models
    from labctl.hosts.fanout import HostResult, HostRun

    names = check_models(models, "evict")

    def work(c: Context) -> Outcome:
        hosts = cache_hosts(c.inventory, host)

        def step(run: HostRun) -> HostResult:
            assert run.host.model_cache is not None
            data = evict(run, run.host.model_cache, names, force)
            if data["pinned"]:
                return HostResult(
                    run.host.name,
                    "failed",
                    data=data,
                    error=f"{', '.join(data['pinned'])} {'is' if len(data['pinned']) == 1 else 'are'} pinned; not evicted.",
                    hint=f"Unpin first (labctl cache unpin NAME --host {run.host.name}) or pass --force.",
                )
            return HostResult(run.host.name, "changed" if data["evicted"] else "ok", data=data)

        return _fan(c, hosts, step, "cache evict", lambda rs: render_evict(c.console, rs))

    run_command(ctx, work, inventory, json_out, verbose)


@app.command("verify")
def verify_cmd(
    ctx: typer.Context,
    models: Annotated[
        Optional[list[str]], typer.Argument(help="Models to check (default: all cached).")
    ] = None,
    host: HostsOpt = None,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair/--no-repair", help="Re-fetch corrupt and missing models from the storage host."
        ),
    ] = True,
    streams: StreamsOpt = 4,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Re-hash cached models against their recorded chunk hashes; re-fetch corrupt or missing ones.

    A corrupt model leaves the cache's listing at once; its good chunks are kept, and only the
    bad ones are fetched again from the storage host.

    Examples:

        labctl cache verify --host m5

        labctl cache verify tinylm-1g --host m5 --no-repair --json
    """
    from labctl.cache.render import render_verify
    from labctl.cache.sync import verify_host
    from labctl.cache.targets import cache_hosts, check_models
    from labctl.hosts.fanout import HostResult, HostRun
    from labctl.output.bars import Bars
    from labctl.output.progress import shown

    names = check_models(models, "verify") if models else []

    def work(c: Context) -> Outcome:
        hosts = cache_hosts(c.inventory, host)
        bars = Bars(c.console, enabled=not c.json_mode and c.console.is_terminal)
        progress = shown(c, bars.shows())

        def step(run: HostRun) -> HostResult:
            data = verify_host(run, names, repair=repair, streams=streams, progress=progress)
            bad = [m for m in data["models"] if m["status"] != "ok"]
            unrepaired = [m["name"] for m in bad if not m.get("repaired")]
            if unrepaired:
                return HostResult(
                    run.host.name,
                    "failed",
                    data=data,
                    error=f"{', '.join(unrepaired)}: "
                    + "; ".join(
                        f"{m['name']} {m['status'].replace('_', ' ')}" for m in bad if m["name"] in unrepaired
                    )
                    + ".",
                    hint="Run without --no-repair to re-fetch them." if not repair else "",
                )
            return HostResult(run.host.name, "changed" if data["changed"] else "ok", data=data)

        return _fan(c, hosts, step, "cache verify", lambda rs: render_verify(c.console, rs), bars)

    run_command(ctx, work, inventory, json_out, verbose)


def _pin(
    ctx: typer.Context, model: str, host: str, pinned: bool, inventory: Any, json_out: bool, verbose: int
) -> None:
    from labctl.cache.ops import pin
    from labctl.cache.render import render_pin
    from labctl.cache.targets import cache_hosts, check_models
    from labctl.hosts.fanout import HostResult, HostRun

    name = check_models([model], "pin" if pinned else "unpin")[0]

    def work(c: Context) -> Outcome:
        hosts = cache_hosts(c.inventory, host)

        def step(run: HostRun) -> HostResult:
            assert run.host.model_cache is not None
            data = pin(run, run.host.model_cache, name, pinned)
            return HostResult(run.host.name, "changed" if data["changed"] else "ok", data=data)

        return _fan(c, hosts, step, "cache pin", lambda rs: render_pin(c.console, rs, name, pinned))

    run_command(ctx, work, inventory, json_out, verbose)


@app.command("pin")
def pin_cmd(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help="A cached model.")],
    host: HostOpt,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Pin a cached model: eviction never removes it (only `cache evict --force` does)."""
    _pin(ctx, model, host, True, inventory, json_out, verbose)


@app.command("unpin")
def unpin_cmd(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help="A cached model.")],
    host: HostOpt,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Unpin a model: it may be evicted again when room is needed (least recently used first)."""
    _pin(ctx, model, host, False, inventory, json_out, verbose)


def _fan(
    c: Context,
    hosts: Sequence[Host],
    step: Step,
    label: str,
    render: Callable[[list[HostResult]], None],
    bars: Bars | None = None,
    to_json: Callable[[HostResult], dict[str, Any]] | None = None,
) -> Outcome:
    """Run `step` on every cache host: one result per host, exit 1 if any failed."""
    from labctl.cache.render import print_repairs
    from labctl.hosts.fanout import exit_code, fan_out

    if bars is not None:
        with bars:
            results = fan_out(c, hosts, step, label=label, progress=not bars.enabled)
    else:
        results = fan_out(c, hosts, step, label=label)

    def show() -> None:
        render(results)
        print_repairs(c.console, results)

    return Outcome({"results": [(to_json or _flat)(r) for r in results]}, show, exit_code(results))


def _flat(r: Any) -> dict[str, Any]:
    d = {k: v for k, v in r.to_json().items() if k not in ("stdout", "stderr", "rc", "data")}
    d.update(r.data or {})
    return d


def _status_json(r: Any) -> dict[str, Any]:
    d = _flat(r)
    if isinstance(d.get("models"), dict):
        d["models"] = [
            {k: v for k, v in m.items() if k != "files"} | {"files": len(m.get("files", []))}
            for m in d["models"].values()
        ]
    return d
