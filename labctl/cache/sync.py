"""Carrying out a sync: the storage host serves, the cache host pulls, this process only starts both.

The data path is host to host: the storage host's agent serves the models (`cache.serve`) and
the cache host's agent pulls them (`cache.pull`, see labctl/agent/cache/); this process starts
both over SSH, passes the one-time token along, and reads progress lines.

Two entry points: `prepare` then `Prepared.sync` for many cache hosts at once (`labctl cache
sync`: every server starts while every cache's state is read, one round trip), and `sync` for
one (`cache verify`'s repair, the model-load bench's network stage).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from labctl.agent.cache.manifest import DEFAULT_CHUNK
from labctl.cache.ops import cache_state
from labctl.cache.plan import plan_sync
from labctl.cache.targets import Target, cache_of, resolve_target
from labctl.hosts.agent_ship import agent_event
from labctl.hosts.listening import Listener
from labctl.output.errors import HostError, InputError, LabctlError
from labctl.output.fmt import fmt_bytes
from labctl.output.progress import QUIET, Progress

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.hosts.fanout import HostRun
    from labctl.inventory.model import Host

# Two streams at least: an 802.3ad bond hashing layer3+4 puts each TCP flow on one member,
# so one stream can never use more than one link. Four keeps both members busy even when
# two flows happen to hash onto the same one.
DEFAULT_STREAMS = 4
LONG = 7 * 24 * 3600.0  # "no timeout" for copies: the transfer itself has stall timeouts
READY_TIMEOUT = 300.0  # listing a large library (hash caches read) before the server answers
STOP_AFTER_ENV = "LABCTL_CACHE_TEST_STOP_AFTER"


class FileServer(Listener):
    """`cache.serve` on `host`, serving the named files or folders under `root`, in a thread,
    for as long as one pull needs it. `hash_cache`: keep chunk hashes beside them (only in
    folders labctl owns: not in a run's checkpoint folder)."""

    def __init__(
        self,
        ctx: Context,
        host: Host,
        root: str,
        names: Sequence[str],
        chunk_size: int,
        port: int = 0,
        *,
        hash_cache: bool = True,
    ) -> None:
        args = {
            "root": root,
            "models": list(names),
            "chunk_size": chunk_size,
            "bind": host.address,
            "port": port,
            "idle_timeout": 120,
            "allow_missing": True,
            "hash_cache": hash_cache,
        }
        super().__init__(
            ctx,
            host,
            "cache.serve",
            args,
            what="cache.serve",
            timeout=LONG,
            ready_timeout=READY_TIMEOUT,
            thread_name=f"serve-{host.name}",
        )
        self.source = host


class SourceServer(FileServer):
    """The storage host's server for one cache sync.

    It is started before planning, in parallel with reading the cache's state: its
    announcement carries the listing, so the copy costs no separate listing round trip. When
    the plan finds nothing to copy, it is closed unused.
    """

    def __init__(
        self, ctx: Context, target: Target, models: Sequence[str], chunk_size: int, port: int = 0
    ) -> None:
        super().__init__(ctx, target.source, target.root, models, chunk_size, port)


def pull_from(
    run: HostRun,
    server: FileServer,
    info: Mapping[str, Any],
    args: dict[str, Any],
    last: dict[str, Any],
    progress: Progress = QUIET,
    what: str | None = None,
) -> dict[str, Any]:
    """`cache.pull` on `run`'s host from `server` (announced as `info`): host to host.

    `args` names what to pull and where (`cache` or `into`, `models`, ...); the address,
    port and token are added here. `last` keeps the latest progress event, for errors.
    `progress` hears "copied" (what: `what`, else the host's name; done, total: bytes).
    """
    from labctl.hosts.agent_ship import agent_dir, call_agent

    host = run.host.name

    def on_line(stream: str, line: str) -> None:
        event = agent_event(stream, line, "progress")
        if event is not None:
            last.update(event)
            progress.event(
                "copied", what=what or host, done=event.get("done", 0), total=event.get("total", 0)
            )

    # The token goes in a 0600 file, never on a command line other users can read.
    token_file = f"{agent_dir(run.host)}/cache-token-{uuid.uuid4().hex}"
    run.conn.put_bytes(str(info["token"]).encode(), token_file, mode=0o600)
    full = {"address": server.source.address, "port": info["port"], "token_file": token_file, **args}
    stop_after = int(os.environ.get(STOP_AFTER_ENV) or 0)
    if stop_after:
        full["stop_after_chunks"] = stop_after
    pulled: dict[str, Any] = call_agent(run, "cache.pull", full, timeout=LONG, on_line=on_line)
    return pulled


@dataclass
class Prepared:
    """One cache host ready to sync: its storage host's listing and server, its cache's state."""

    target: Target
    server: SourceServer
    models: list[str]
    chunk_size: int
    listing: dict[str, Any]
    state: dict[str, Any] | None = None
    error: LabctlError | None = None  # reading the cache's state failed: that host fails alone

    def sync(
        self,
        run: HostRun,
        *,
        streams: int = DEFAULT_STREAMS,
        progress: Progress = QUIET,
        protect: Collection[str] = (),
    ) -> dict[str, Any]:
        """Bring the models into the target's cache (`run` is the cache host); returns what
        happened (JSON-ready).

        Plans from the cache's state first (an error here means nothing moved), then runs the
        pull on the cache host against the server on the storage host: host to host.
        """
        target, server, models = self.target, self.server, self.models
        host = run.host.name
        mc = target.cache
        pulled: dict[str, Any] | None = None
        try:
            if self.error is not None:
                raise self.error
            assert self.state is not None
            plan = plan_sync(
                self.state, self.listing, models, self.chunk_size, where=target.where, protect=protect
            )
            result: dict[str, Any] = {
                "cache": mc.path,
                "source": target.source.name,
                "source_address": target.source.address,
                "plan": plan.to_json(),
                "models": [
                    {
                        "name": m.name,
                        "action": m.action,
                        "bytes": m.bytes,
                        "fetched_bytes": 0,
                        "resumed_bytes": 0,
                    }
                    for m in plan.models
                ],
                "evicted": [],
                "fetched_bytes": 0,
                "changed": False,
                "repairs": self.state.get("repairs", []),
            }
            fetch = plan.to_fetch
            if not fetch:
                return result
            info = server.wait_ready(run.cancel)
            gone = [n for n in fetch if n not in info["models"]]
            if gone:  # removed from the storage host since it was listed
                raise HostError(
                    f"{target.source.name} no longer has {', '.join(gone)} in {target.root}.",
                    "Check the storage host's model folder and sync again.",
                )
            last: dict[str, Any] = {}
            args: dict[str, Any] = {
                "cache": mc.path,
                "size_gb": mc.size_gb,
                "streams": streams,
                "chunk_size": self.chunk_size,
                "models": [info["models"][n] for n in fetch],
                "evict": [e.name for e in plan.evict if not e.partial],
                "evict_partials": [e.name for e in plan.evict if e.partial],
                "source": f"{target.source.name}:{target.root}",  # the agent appends /MODEL
            }
            try:
                pulled = pull_from(run, server, info, args, last, progress)
            except HostError as e:
                raise _pull_failed(e, host, target, last) from None
        finally:
            # A pull that finished told the server to stop; otherwise close its channel now.
            server.stop(5.0 if pulled is not None else 0.0)
        by_name = {m["name"]: m for m in pulled.get("models", [])}
        for m in result["models"]:
            got = by_name.get(m["name"])
            if got:
                m.update(
                    fetched_bytes=got["fetched_bytes"],
                    resumed_bytes=got["resumed_bytes"],
                    chunks=got["chunks"],
                    fetched_chunks=got["fetched_chunks"],
                    resumed_chunks=got["resumed_chunks"],
                    path=got["path"],
                    verified=got["committed"],
                )
        result.update(
            evicted=pulled.get("evicted", []),
            fetched_bytes=pulled.get("fetched_bytes", 0),
            resumed_bytes=pulled.get("resumed_bytes", 0),
            streams=pulled.get("streams"),
            chunk_size=pulled.get("chunk_size"),
            seconds=pulled.get("seconds"),
            verify_seconds=pulled.get("verify_seconds"),
            rate_bytes_per_s=pulled.get("rate_bytes_per_s"),
            retries=pulled.get("retries", 0),
            port=info["port"],
            served=server.result,
            changed=True,
        )
        return result


def _pull_failed(e: HostError, host: str, target: Target, last: Mapping[str, Any]) -> HostError:
    from labctl.hosts.agent_ship import CANCELLED, NO_JSON, AgentFailed

    where = ""
    if last.get("total") and last.get("done"):
        where = f" at {fmt_bytes(last.get('done'))} of {fmt_bytes(last.get('total'))}"
    message = e.message
    if isinstance(e, AgentFailed) and e.kind == "disk_full":
        return HostError(
            f"disk full on {host}:{target.cache.path}: the copy from {target.source.name} stopped{where}.",
            f"Free space there (`labctl exec -l {host} -- df -h {target.cache.path}`; files labctl did not "
            "put there count too), or make the cache smaller; then run the same `labctl cache sync` again: "
            "verified chunks are kept and the copy resumes.",
        )
    if isinstance(e, AgentFailed) and e.kind in (CANCELLED, NO_JSON):
        # Killed mid-copy: what it printed is progress noise, not an explanation.
        message = f"{host}: the copy from {target.source.name} was stopped{where} before it finished."
    elif where:
        message = f"{message.rstrip('.')} (stopped{where})."
    return HostError(
        message,
        "Chunks verified so far are kept in the cache's partial folder (the model is not listed as cached): "
        "run the same `labctl cache sync` again to resume.",
    )


def prepare(
    ctx: Context,
    targets: Sequence[Target],
    models: Sequence[str],
    chunk_size: int = DEFAULT_CHUNK,
    port: int = 0,
) -> dict[str, Prepared]:
    """Start a server on each target's storage host and read each cache's state, all at once.

    A model missing on a storage host is an InputError (exit 2) and an unreachable storage
    host a HostError, both before anything is copied; every server started is then closed.
    """
    from concurrent.futures import ThreadPoolExecutor

    from labctl.hosts.fanout import on_host

    servers = {t.host.name: SourceServer(ctx, t, models, chunk_size, port).begin() for t in targets}
    try:

        def state_of(t: Target) -> dict[str, Any] | LabctlError:
            try:
                return on_host(ctx, t.host, lambda run: cache_state(run, t.cache))
            except LabctlError as e:
                return e

        with ThreadPoolExecutor(max_workers=max(1, min(16, len(targets)))) as pool:
            states = dict(zip([t.host.name for t in targets], pool.map(state_of, targets), strict=True))
        out: dict[str, Prepared] = {}
        for t in targets:
            info = servers[t.host.name].wait_ready()
            if info.get("missing"):
                missing, have = info["missing"], info.get("available") or []
                raise InputError(
                    f"{t.source.name} has no {'model' if len(missing) == 1 else 'models'} "
                    f"{', '.join(missing)} in {t.root}.",
                    f"It has: {', '.join(have)}." if have else f"{t.root} on {t.source.name} is empty.",
                )
            st = states[t.host.name]
            out[t.host.name] = Prepared(
                t,
                servers[t.host.name],
                list(models),
                chunk_size,
                info["models"],
                None if isinstance(st, LabctlError) else st,
                st if isinstance(st, LabctlError) else None,
            )
        return out
    except BaseException:
        for srv in servers.values():
            srv.stop(0)
        raise


def sync(
    run: HostRun,
    target: Target,
    models: Sequence[str],
    *,
    streams: int = DEFAULT_STREAMS,
    chunk_size: int = DEFAULT_CHUNK,
    progress: Progress = QUIET,
    protect: Collection[str] = (),
) -> dict[str, Any]:
    """`labctl cache sync` for one cache host (`run`'s) as a function: raises a LabctlError.
    `protect`: cached models never evicted for room (as if pinned)."""
    p = prepare(run.ctx, [target], models, chunk_size)[target.host.name]
    return p.sync(run, streams=streams, progress=progress, protect=protect)


def verify_host(
    run: HostRun,
    models: Sequence[str],
    *,
    repair: bool = True,
    streams: int = DEFAULT_STREAMS,
    progress: Progress = QUIET,
) -> dict[str, Any]:
    """Re-hash cached models; re-fetch the corrupt ones from the storage host (resuming
    from their good chunks, so only the bad ones cross the network)."""
    from labctl.hosts.agent_ship import call_agent

    inv = run.ctx.inventory
    mc = cache_of(inv, run.host)
    state = cache_state(run, mc)  # a clear error when the cache folder is missing
    verified: dict[str, Any] = call_agent(
        run, "cache.verify", {"cache": mc.path, "models": list(models), "repair": repair}, timeout=LONG
    )
    out: dict[str, Any] = {
        "cache": mc.path,
        "models": verified["models"],
        "repairs": [*state.get("repairs", []), *verified.get("repairs", [])],
    }
    out["changed"] = bool(out["repairs"])
    # A missing model was taken out of the listing like a corrupt one: both are fetched again.
    corrupt = [
        m["name"]
        for m in verified["models"]
        if m["status"] in ("corrupt", "missing") and m.get("moved_to_partial")
    ]
    if not corrupt:
        return out
    out["changed"] = True
    try:
        target = resolve_target(inv, run.host.name)
        # The chunk size the model was cached with: the source's cached hashes for it still apply.
        cs = next(
            int(m.get("chunk_size") or DEFAULT_CHUNK) for m in verified["models"] if m["name"] in corrupt
        )
        synced = sync(run, target, corrupt, streams=streams, chunk_size=cs, progress=progress)
    except LabctlError as e:
        for m in out["models"]:
            if m["name"] in corrupt:
                m["repaired"] = False
        raise HostError(
            f"{run.host.name}: {', '.join(corrupt)} failed verification and {'was' if len(corrupt) == 1 else 'were'} "
            f"taken out of the cache, but re-fetching failed: {e.message}",
            e.hint or "Run `labctl cache sync` for it once the storage host is back.",
        ) from None
    fetched = {m["name"]: m for m in synced["models"]}
    for m in out["models"]:
        if m["name"] in fetched:
            m["repaired"] = bool(fetched[m["name"]].get("verified"))
            m["refetched_bytes"] = fetched[m["name"]].get("fetched_bytes", 0)
    out["sync"] = synced
    return out
