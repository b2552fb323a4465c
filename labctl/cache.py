"""Controller side of `labctl cache`: plan a sync, then have two hosts carry it out.

The data path is host to host: the storage host's agent serves the model (`cache_serve`)
and the cache host's agent pulls it (`cache_pull`, see labctl/agent/cache.py); this process
only starts both over SSH, passes the one-time token along, and reads progress lines.

Everything that decides something is pure and unit-tested: whether a model is already
cached (`plan_sync`), what to evict to make room (`plan_eviction`: least recently used
first, pinned never, an error before any byte moves when room cannot be made), how models
split into chunks, and the rate and ETA shown while copying (`RateMeter`).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from labctl.agent.cache import DEFAULT_CHUNK, check_name, chunk_ranges, page_round
from labctl.errors import HostError, InputError, LabctlError
from labctl.inventory.model import Host

if TYPE_CHECKING:
    from labctl.context import Context
    from labctl.fanout import HostRun
    from labctl.inventory.model import Inventory, ModelCache

# Two streams at least: an 802.3ad bond hashing layer3+4 puts each TCP flow on one member,
# so one stream can never use more than one link. Four keeps both members busy even when
# two flows happen to hash onto the same one.
DEFAULT_STREAMS = 4
DEFAULT_CHUNK_MB = DEFAULT_CHUNK >> 20
SLACK = 1 << 20  # room left for the manifest and state files next to the models
LONG = 7 * 24 * 3600.0  # "no timeout" for copies: the transfer itself has stall timeouts
READY_TIMEOUT = 300.0  # listing a large library (hash caches read) before the server answers
STOP_AFTER_ENV = "LABCTL_CACHE_TEST_STOP_AFTER"

ProgressFn = Callable[[str, dict[str, Any]], None]


# ---------------------------------------------------------------------------------------------
# Formatting


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def fmt_rate(bps: float | None) -> str:
    return "-" if not bps else f"{bps / 1e6:.1f} MB/s"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = round(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def fmt_age(when: float | None, now: float) -> str:
    if not when:
        return "never"
    ago = max(0.0, now - when)
    if ago < 60:
        return "just now"
    return fmt_duration(ago) + " ago"


# ---------------------------------------------------------------------------------------------
# Progress


class RateMeter:
    """Rate over a sliding window of (time, bytes done) samples, and the ETA it implies.

    A window, not the average since the start: a resumed copy starts at 60% done in no time,
    and a copy slowed by another flow should show today's rate, not the morning's.
    """

    def __init__(self, window: float = 5.0) -> None:
        self.window = window
        self.samples: deque[tuple[float, float]] = deque()

    def update(self, t: float, done: float) -> None:
        self.samples.append((t, done))
        # Keep one sample older than the window so the rate always spans the whole window.
        while len(self.samples) > 2 and self.samples[1][0] <= t - self.window:
            self.samples.popleft()

    def rate(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        if t1 <= t0:
            return None
        return max(0.0, (d1 - d0) / (t1 - t0))

    def eta(self, total: float) -> float | None:
        rate = self.rate()
        if not self.samples:
            return None
        left = max(0.0, total - self.samples[-1][1])
        if left == 0:
            return 0.0
        return left / rate if rate else None


# ---------------------------------------------------------------------------------------------
# Planning


class CacheFull(HostError):
    """Room for the models cannot be made (pinned models, or they exceed the cache)."""


@dataclass
class Evictable:
    name: str
    disk_bytes: int
    last_used: float | None = None
    pinned: bool = False
    partial: bool = False  # an abandoned partial copy: unusable, so it goes first


def plan_eviction(
    free: int,
    need: int,
    candidates: Iterable[Evictable],
    *,
    capacity: int | None = None,
    where: str = "the cache",
    what: str = "the models",
) -> list[Evictable]:
    """What to evict so that `need` bytes fit in `free` plus what is evicted.

    Abandoned partial copies go first (oldest first), then cached models, least recently used
    first. Pinned ones never. Raises CacheFull when even evicting everything allowed is not
    enough; nothing has been changed at that point.
    """
    if need <= free:
        return []
    allowed = [c for c in candidates if not c.pinned]
    order = sorted(allowed, key=lambda c: (not c.partial, c.last_used or 0.0, c.name))
    chosen: list[Evictable] = []
    got = free
    for c in order:
        if got >= need:
            break
        chosen.append(c)
        got += c.disk_bytes
    if got >= need:
        return chosen
    pinned = sorted((c for c in candidates if c.pinned), key=lambda c: c.name)
    verb = "need" if "," in what or what.startswith("the ") else "needs"
    if capacity is not None and need > capacity:
        why = f"{what} {verb} {fmt_bytes(need)}, more than the whole cache ({fmt_bytes(capacity)})"
    else:
        why = (
            f"{what} {verb} {fmt_bytes(need)}; {fmt_bytes(max(0, free))} is free and evicting every unpinned model "
            f"would free only {fmt_bytes(got - free)} more"
        )
        if pinned:
            why += f" ({', '.join(c.name for c in pinned)} {'is' if len(pinned) == 1 else 'are'} pinned)"
    raise CacheFull(
        f"{where} has no room: {why}. Nothing was copied and nothing was evicted.",
        "Evict or unpin models (labctl cache evict / unpin), sync fewer at once, or raise "
        "model_cache.size_gb in the inventory and run `labctl provision --tags model_cache`.",
    )


def file_key(files: Iterable[Mapping[str, Any]]) -> set[tuple[str, int, Any]]:
    return {(str(f["path"]), int(f["size"]), f.get("mtime_ns")) for f in files}


def chunk_count(files: Iterable[Mapping[str, Any]], chunk_size: int) -> int:
    return sum(len(chunk_ranges(int(f["size"]), chunk_size)) for f in files)


@dataclass
class ModelPlan:
    name: str
    action: str  # cached | fetch | resume | replace
    bytes: int
    need_bytes: int = 0  # new space this model's copy takes
    resumed_bytes: int = 0  # verified bytes an earlier, stopped copy left (re-checked on the host)
    chunks: int = 0


@dataclass
class SyncPlan:
    models: list[ModelPlan]
    evict: list[Evictable] = field(default_factory=list)
    need_bytes: int = 0
    free_bytes: int = 0
    capacity_bytes: int = 0

    @property
    def to_fetch(self) -> list[str]:
        return [m.name for m in self.models if m.action != "cached"]

    def to_json(self) -> dict[str, Any]:
        return {
            "models": [asdict(m) for m in self.models],
            "evict": [asdict(e) for e in self.evict],
            "need_bytes": self.need_bytes,
            "free_bytes": self.free_bytes,
            "capacity_bytes": self.capacity_bytes,
        }


def plan_sync(
    state: Mapping[str, Any],
    listing: Mapping[str, Mapping[str, Any]],
    models: Sequence[str],
    chunk_size: int,
    *,
    where: str = "the cache",
) -> SyncPlan:
    """Decide, from the cache's state and the source's listing, what each model needs.

    A model is cached when the manifest lists it, it is on disk, and its files (path, size,
    mtime) are the source's: then nothing happens to it. One whose source changed is
    replaced. Room is planned for everything to copy at once, before any byte moves.
    """
    manifest: Mapping[str, Any] = state.get("models") or {}
    partials = {p["name"]: p for p in state.get("partials") or []}
    plans: list[ModelPlan] = []
    need = 0
    for name in models:
        src = listing[name]
        files = src.get("files") or []
        total = int(src.get("bytes", sum(int(f["size"]) for f in files)))
        entry = manifest.get(name)
        if entry and entry.get("present", True) and file_key(entry.get("files") or []) == file_key(files):
            plans.append(
                ModelPlan(
                    name,
                    "cached",
                    total,
                    chunks=chunk_count(files, int(entry.get("chunk_size") or chunk_size)),
                )
            )
            continue
        partial = partials.get(name)
        resumed, on_disk = 0, 0
        cs = chunk_size
        if partial:
            on_disk = int(partial.get("disk_bytes") or 0)
            same = {
                (p, int(f.get("size") or 0), f.get("mtime_ns"))
                for p, f in (partial.get("files") or {}).items()
            } == file_key(files)
            if same:
                resumed = int(partial.get("done_bytes") or 0)
                cs = int(partial.get("chunk_size") or chunk_size)
        model_need = max(0, sum(page_round(int(f["size"])) for f in files) - on_disk)
        action = "replace" if entry else ("resume" if resumed else "fetch")
        plans.append(ModelPlan(name, action, total, model_need, resumed, chunk_count(files, cs)))
        need += model_need
    free = int(state.get("free_bytes") or 0)
    capacity = int(state.get("capacity_bytes") or 0)
    plan = SyncPlan(plans, need_bytes=need, free_bytes=free, capacity_bytes=capacity)
    if need == 0:
        return plan
    wanted = set(models)
    candidates = [
        Evictable(
            n, int(e.get("disk_bytes") or e.get("bytes") or 0), e.get("last_used"), bool(e.get("pinned"))
        )
        for n, e in manifest.items()
        if n not in wanted
    ] + [
        Evictable(p["name"], int(p.get("disk_bytes") or 0), p.get("updated"), partial=True)
        for p in partials.values()
        if p["name"] not in wanted
    ]
    names = ", ".join(m.name for m in plans if m.action != "cached")
    plan.evict = plan_eviction(
        free - SLACK, need, candidates, capacity=capacity or None, where=where, what=names
    )
    return plan


# ---------------------------------------------------------------------------------------------
# Who talks to whom


@dataclass
class Target:
    host: Host
    cache: ModelCache
    source: Host
    root: str

    @property
    def where(self) -> str:
        return f"{self.host.name}: the cache {self.cache.path}"


def check_models(models: Sequence[str]) -> list[str]:
    from labctl.agent.commands import AgentError

    out: list[str] = []
    for m in models:
        try:
            check_name(m)
        except AgentError as e:
            raise InputError(f"{e.message}.", "For example: labctl cache sync tinylm-1g --host m5.") from None
        if m not in out:
            out.append(m)
    if not out:
        raise InputError("No model named.", "For example: labctl cache sync tinylm-1g --host m5.")
    return out


def cache_of(inv: Inventory, host: Host) -> ModelCache:
    if host.model_cache is None:
        with_cache = [h.name for h in inv.hosts.values() if h.model_cache is not None]
        raise InputError(
            f"{host.name} has no model_cache in {inv.path}, so it has no RAM cache to fill.",
            f"Hosts with one: {', '.join(with_cache) or 'none'}. Or add model_cache: "
            "{path: /mnt/model-cache, size_gb: N, source: STORAGE_HOST} to it.",
        )
    return host.model_cache


def resolve_target(inv: Inventory, name: str) -> Target:
    """The cache host `name`, its cache and its storage host, or a one-paragraph InputError."""
    if name not in inv.hosts:
        raise InputError(f"No host '{name}' in {inv.path}.", f"Hosts: {', '.join(inv.hosts)}.")
    host = inv.hosts[name]
    if host.is_windows:
        raise InputError(f"{name} runs Windows; the model cache is Linux-only.", "Pick a Linux host.")
    mc = cache_of(inv, host)
    storage_hosts = [h.name for h in inv.hosts.values() if h.storage is not None]
    if not mc.source:
        raise InputError(
            f"{name}'s model_cache has no source: labctl does not know which host to copy models from.",
            f"Add source: HOST to its model_cache (hosts with storage: {', '.join(storage_hosts) or 'none'}).",
        )
    if mc.source not in inv.hosts:
        raise InputError(
            f"{name}'s model_cache.source is '{mc.source}', which is not a host in {inv.path}.",
            f"Hosts with storage: {', '.join(storage_hosts) or 'none'}.",
        )
    source = inv.hosts[mc.source]
    if source.storage is None:
        raise InputError(
            f"{name}'s model_cache.source is {source.name}, which declares no storage in {inv.path}.",
            f"Add storage: {{models: /srv/models}} to {source.name}, or point source at a host with storage "
            f"({', '.join(storage_hosts) or 'none'}).",
        )
    return Target(host, mc, source, source.storage.models.rstrip("/") or "/")


def list_source(
    ctx: Context, source: Host, root: str, models: Sequence[str], chunk_size: int = DEFAULT_CHUNK
) -> dict[str, Any]:
    """The storage host's listing of `models`; a model it lacks is an InputError (exit 2)."""
    from labctl.agent_ship import ask_agent

    answer: dict[str, Any] = ask_agent(
        ctx, source, "cache_list", {"root": root, "models": list(models), "chunk_size": chunk_size}
    )
    if answer.get("missing"):
        missing = answer["missing"]
        have = answer.get("available") or []
        raise InputError(
            f"{source.name} has no {'model' if len(missing) == 1 else 'models'} {', '.join(missing)} in {root}.",
            f"It has: {', '.join(have) or 'nothing'}." if have else f"{root} on {source.name} is empty.",
        )
    return answer


def cache_state(run: HostRun, mc: ModelCache) -> dict[str, Any]:
    from labctl.agent_ship import call_agent

    state: dict[str, Any] = call_agent(run, "cache_state", {"cache": mc.path, "size_gb": mc.size_gb})
    if not state.get("exists"):
        raise HostError(
            f"{run.host.name} has no folder at its model_cache path {mc.path}.",
            f"Create and mount it with `labctl provision --tags model_cache --limit {run.host.name}`.",
        )
    return state


class SourceServer:
    """`cache_serve` on the storage host, in a thread, for as long as one pull needs it.

    It is started before planning, in parallel with reading the cache's state: its
    announcement carries the listing, so the copy costs no separate listing round trip. When
    the plan finds nothing to copy, it is closed unused.
    """

    def __init__(
        self, ctx: Context, target: Target, models: Sequence[str], chunk_size: int, port: int = 0
    ) -> None:
        self.cancel = threading.Event()
        self.ready = threading.Event()
        self.info: dict[str, Any] | None = None
        self.result: dict[str, Any] | None = None
        self.error: LabctlError | None = None
        self.args = {
            "root": target.root,
            "models": list(models),
            "chunk_size": chunk_size,
            "bind": target.source.address,
            "port": port,
            "idle_timeout": 120,
            "allow_missing": True,
        }
        self.ctx = ctx
        self.source = target.source
        self.thread = threading.Thread(target=self._serve, daemon=True, name=f"serve-{target.source.name}")

    def _serve(self) -> None:
        from labctl.agent_ship import call_agent
        from labctl.fanout import on_host

        def serve(run: HostRun) -> dict[str, Any]:
            answer: dict[str, Any] = call_agent(
                run, "cache_serve", self.args, timeout=LONG, on_line=self._line
            )
            return answer

        try:
            self.result = on_host(self.ctx, self.source, serve, self.cancel)
        except LabctlError as e:
            self.error = e
        finally:
            self.ready.set()

    def _line(self, stream: str, line: str) -> None:
        if stream != "stderr" or not line.startswith("{") or self.info is not None:
            return
        import json

        try:
            event = json.loads(line)
        except ValueError:
            return
        if isinstance(event, dict) and event.get("event") == "listening":
            self.info = event
            self.ready.set()

    def begin(self) -> SourceServer:
        self.thread.start()
        return self

    def wait_ready(self, cancel: threading.Event | None = None) -> dict[str, Any]:
        """The server's announcement (port, token, listing); raises if it could not start."""
        deadline = time.monotonic() + READY_TIMEOUT
        while not self.ready.wait(0.05):
            if (cancel is not None and cancel.is_set()) or time.monotonic() > deadline:
                self.stop(0)
                raise HostError(
                    f"{self.source.name}: cache_serve did not start listening "
                    + (
                        "(cancelled)."
                        if cancel is not None and cancel.is_set()
                        else f"within {READY_TIMEOUT:g} s."
                    )
                )
        if self.info is None:
            if self.error is not None:
                raise self.error
            raise HostError(f"{self.source.name}: cache_serve ended before it listened.")
        return self.info

    def stop(self, grace: float = 5.0) -> None:
        """Wait for the server's own exit (the pull asks it to stop), else close its channel."""
        if self.thread.is_alive():
            self.thread.join(grace)
        if self.thread.is_alive():
            self.cancel.set()  # the channel closes and the watchdog kills the server
            self.thread.join(10)


@dataclass
class Prepared:
    """One cache host ready to sync: its storage host's listing and server, its cache's state."""

    target: Target
    server: SourceServer
    listing: dict[str, Any]
    state: dict[str, Any] | None = None
    error: LabctlError | None = None  # reading the cache's state failed: that host fails alone


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

    from labctl.fanout import on_host

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
                info["models"],
                None if isinstance(st, LabctlError) else st,
                st if isinstance(st, LabctlError) else None,
            )
        return out
    except BaseException:
        for srv in servers.values():
            srv.stop(0)
        raise


def sync_host(
    run: HostRun,
    target: Target,
    models: Sequence[str],
    listing: Mapping[str, Mapping[str, Any]],
    *,
    streams: int = DEFAULT_STREAMS,
    chunk_size: int = DEFAULT_CHUNK,
    port: int = 0,
    on_progress: ProgressFn | None = None,
    state: Mapping[str, Any] | None = None,
    server: SourceServer | None = None,
) -> dict[str, Any]:
    """Bring `models` into the target's cache; returns what happened (JSON-ready).

    Plans from the cache's state first (an error here means nothing moved), then runs the
    pull on the cache host against the server on the storage host: host to host. `server`
    is one `prepare` started; without it, one is started once the plan needs it.
    """
    from labctl.agent_ship import agent_dir, call_agent

    host = run.host.name
    mc = target.cache
    pulled: dict[str, Any] | None = None
    try:
        if state is None:
            state = cache_state(run, mc)
        plan = plan_sync(state, listing, models, chunk_size, where=target.where)
        result: dict[str, Any] = {
            "cache": mc.path,
            "source": target.source.name,
            "source_address": target.source.address,
            "plan": plan.to_json(),
            "models": [
                {"name": m.name, "action": m.action, "bytes": m.bytes, "fetched_bytes": 0, "resumed_bytes": 0}
                for m in plan.models
            ],
            "evicted": [],
            "fetched_bytes": 0,
            "changed": False,
        }
        fetch = plan.to_fetch
        if not fetch:
            return result
        if server is None:
            server = SourceServer(run.ctx, target, fetch, chunk_size, port).begin()
        info = server.wait_ready(run.cancel)
        gone = [n for n in fetch if n not in info["models"]]
        if gone:  # removed from the storage host since it was listed
            raise HostError(
                f"{target.source.name} no longer has {', '.join(gone)} in {target.root}.",
                "Check the storage host's model folder and sync again.",
            )
        last: dict[str, Any] = {}

        def on_line(stream: str, line: str) -> None:
            if stream != "stderr" or not line.startswith('{"'):
                return
            import json

            try:
                event = json.loads(line)
            except ValueError:
                return
            if isinstance(event, dict) and event.get("event") == "progress":
                last.update(event)
                if on_progress is not None:
                    on_progress(host, event)

        # The token goes in a 0600 file, never on a command line other users can read.
        token_file = f"{agent_dir(run.host)}/cache-token-{uuid.uuid4().hex}"
        run.conn.put_bytes(str(info["token"]).encode(), token_file, mode=0o600)
        args: dict[str, Any] = {
            "cache": mc.path,
            "size_gb": mc.size_gb,
            "address": target.source.address,
            "port": info["port"],
            "token_file": token_file,
            "streams": streams,
            "chunk_size": chunk_size,
            "models": [info["models"][n] for n in fetch],
            "evict": [e.name for e in plan.evict if not e.partial],
            "evict_partials": [e.name for e in plan.evict if e.partial],
            "source": f"{target.source.name}:{target.root}",  # the agent appends /MODEL
        }
        stop_after = int(os.environ.get(STOP_AFTER_ENV) or 0)
        if stop_after:
            args["stop_after_chunks"] = stop_after
        try:
            pulled = call_agent(run, "cache_pull", args, timeout=LONG, on_line=on_line)
        except HostError as e:
            raise _pull_failed(e, host, target, last) from None
    finally:
        # A pull that finished told the server to stop; otherwise close its channel now.
        if server is not None:
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
        served=server.result if server is not None else None,
        changed=True,
    )
    return result


def _pull_failed(e: HostError, host: str, target: Target, last: Mapping[str, Any]) -> HostError:
    from labctl.agent_ship import CANCELLED, NO_JSON, AgentFailed

    where = ""
    if last.get("total") and last.get("done"):
        where = f" at {fmt_bytes(last.get('done'))} of {fmt_bytes(last.get('total'))}"
    message = e.message
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


def sync_prepared(
    run: HostRun,
    p: Prepared,
    models: Sequence[str],
    *,
    streams: int = DEFAULT_STREAMS,
    chunk_size: int = DEFAULT_CHUNK,
    on_progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """sync_host for a host `prepare` readied (the fan-out step of `labctl cache sync`)."""
    if p.error is not None:
        p.server.stop(0)
        raise p.error
    return sync_host(
        run,
        p.target,
        models,
        p.listing,
        streams=streams,
        chunk_size=chunk_size,
        on_progress=on_progress,
        state=p.state,
        server=p.server,
    )


def sync(
    ctx: Context,
    host: str,
    models: Sequence[str],
    *,
    streams: int = DEFAULT_STREAMS,
    chunk_size: int = DEFAULT_CHUNK,
    on_progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """`labctl cache sync` for one host as a function (benchmarks, the model-load bench's
    network stage): raises a LabctlError when it fails."""
    names = check_models(models)
    target = resolve_target(ctx.inventory, host)
    from labctl.fanout import on_host

    p = prepare(ctx, [target], names, chunk_size)[host]
    return on_host(
        ctx,
        target.host,
        lambda run: sync_prepared(
            run, p, names, streams=streams, chunk_size=chunk_size, on_progress=on_progress
        ),
    )


# ---------------------------------------------------------------------------------------------
# Maintenance


def cache_hosts(inv: Inventory, limit: str | None) -> list[Host]:
    """Hosts with a model_cache among those `limit` selects; an error when there is none."""
    from labctl.inventory.select import select_hosts

    chosen = select_hosts(inv, limit)
    hosts = [h for h in chosen if h.model_cache is not None and not h.is_windows]
    if not hosts:
        raise InputError(
            f"None of {', '.join(h.name for h in chosen)} has a model_cache in {inv.path}.",
            "Add model_cache: {path, size_gb, source} to a host, or pick one with --host.",
        )
    return hosts


def verify_host(
    run: HostRun,
    models: Sequence[str],
    *,
    repair: bool = True,
    streams: int = DEFAULT_STREAMS,
    on_progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """Re-hash cached models; re-fetch the corrupt ones from the storage host (resuming
    from their good chunks, so only the bad ones cross the network)."""
    from labctl.agent_ship import call_agent

    inv = run.ctx.inventory
    mc = cache_of(inv, run.host)
    cache_state(run, mc)  # a clear error when the cache folder is missing
    verified: dict[str, Any] = call_agent(
        run, "cache_verify", {"cache": mc.path, "models": list(models), "repair": repair}, timeout=LONG
    )
    out: dict[str, Any] = {"cache": mc.path, "models": verified["models"], "changed": False}
    corrupt = [
        m["name"] for m in verified["models"] if m["status"] == "corrupt" and m.get("moved_to_partial")
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
        listing = list_source(run.ctx, target.source, target.root, corrupt, cs)
        synced = sync_host(
            run, target, corrupt, listing["models"], streams=streams, chunk_size=cs, on_progress=on_progress
        )
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
