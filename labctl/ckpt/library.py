"""The controller's view of the checkpoint library: which host stores it, which runs exist and
where their checkpoints are, and what is where (the library's copies, each run's newest one
still only on a training host).

The library itself lives on the storage host (labctl/agent/ckpt/library.py, its layout);
everything here asks that host's agent, or the training hosts', over SSH.
"""

from __future__ import annotations

import json
import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from labctl.output.errors import InputError, LabctlError

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.inventory.model import Host, Inventory


@dataclass
class Library:
    host: Host
    path: str

    def key(self, run_id: str, step: int) -> str:
        from labctl.agent.ckpt.library import step_dir_name

        return f"{run_id}/{step_dir_name(step)}"


def find_storage(inv: Inventory, name: str | None) -> Library:
    """The storage host (`--storage`, else the one inventory host with a storage section)."""
    from labctl.cache.targets import host_named

    stores = [h for h in inv.hosts.values() if h.storage is not None]
    if name is not None:
        host = host_named(inv, name)
        if host.storage is None:
            raise InputError(
                f"Host '{name}' has no 'storage' section, so it keeps no checkpoint library.",
                "Add storage: {models: /srv/models, checkpoints: /srv/checkpoints} to it in the inventory"
                + (f", or use --storage {stores[0].name}." if stores else "."),
            )
        assert host.storage is not None
        return Library(host, host.storage.checkpoint_library)
    if not stores:
        raise InputError(
            f"No host in {inv.path} has a 'storage' section: there is nowhere to keep checkpoints.",
            "Give the storage host one, e.g. storage: {models: /srv/models, checkpoints: /srv/checkpoints}.",
        )
    if len(stores) > 1:
        raise InputError(
            f"Several hosts have a 'storage' section ({', '.join(h.name for h in stores)}).",
            f"Name the one holding the checkpoint library: --storage {stores[0].name}.",
        )
    host = stores[0]
    assert host.storage is not None
    return Library(host, host.storage.checkpoint_library)


def checkpoint_dir(record: dict[str, Any]) -> str | None:
    """Where the run's trainer wrote checkpoints: recorded since issue 16; for older records,
    read back from the recorded trainer command line (its --settings JSON)."""
    if isinstance(record.get("checkpoint_dir"), str):
        return str(record["checkpoint_dir"])
    for line in (record.get("commands") or {}).values():
        try:
            argv = shlex.split(line)
            settings = json.loads(argv[argv.index("--settings") + 1])
        except (ValueError, IndexError):
            continue
        if isinstance(settings, dict) and isinstance(settings.get("checkpoint_dir"), str):
            return str(settings["checkpoint_dir"])
    return None


def run_records(ctx: Context, run_ids: list[str] | None) -> list[dict[str, Any]]:
    """The controller's run records: the named ones (unknown names are an InputError), else all."""
    from labctl.train import runs

    root = runs.runs_dir(ctx.inventory_file())
    if run_ids:
        return [runs.load(root, r) for r in dict.fromkeys(run_ids)]
    return runs.list_runs(root)


def superseded(records: list[dict[str, Any]]) -> dict[str, str]:
    """Runs whose checkpoint folder a newer run took over on every one of their hosts: run id ->
    the newest run now writing there.

    A resumed run (after `--time-limit`, or any re-run with the same checkpoint_dir) writes into
    the folder an older run left, so what the folder holds is the newest run's: backing it up
    under each older run's id would file one checkpoint under several runs.
    """
    claimed: dict[tuple[str, str], str] = {}
    out: dict[str, str] = {}
    for r in sorted(records, key=lambda r: r.get("started", 0), reverse=True):
        folder = checkpoint_dir(r)
        if folder is None:
            continue
        places = [(str(h), folder) for h in r.get("hosts") or []]
        if places and all(p in claimed for p in places):
            out[r["run_id"]] = claimed[places[0]]
        for p in places:
            claimed.setdefault(p, r["run_id"])
    return out


def newest_on_hosts(ctx: Context, records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per run, each training host's newest valid checkpoint ({host, dir, step, bytes} or
    {host, error}), asked of every (run, host) at once."""
    from labctl.hosts.agent_ship import ask_agent

    pairs: list[tuple[str, Host | None, str, str | None]] = []
    for r in records:
        folder = checkpoint_dir(r)
        for name in r.get("hosts") or []:
            pairs.append((r["run_id"], ctx.inventory.hosts.get(name), name, folder))

    def ask(pair: tuple[str, Host | None, str, str | None]) -> dict[str, Any]:
        _run, host, name, folder = pair
        if host is None:
            return {"host": name, "error": f"host '{name}' is no longer in the inventory"}
        if folder is None:
            return {"host": name, "error": "the run's record names no checkpoint folder"}
        try:
            answer = ask_agent(ctx, host, "ckpt.newest", {"dir": folder}, timeout=3600)
        except LabctlError as e:
            return {"host": name, "dir": folder, "error": e.message}
        return {"host": name, **answer}

    out: dict[str, list[dict[str, Any]]] = {r["run_id"]: [] for r in records}
    if pairs:
        with ThreadPoolExecutor(max_workers=min(16, len(pairs))) as pool:
            for pair, got in zip(pairs, pool.map(ask, pairs), strict=True):
                out[pair[0]].append(got)
    return out


def library_run_id(run_id: str, where: str) -> str:
    """`run_id` when the library can hold it (the storage host's own rule, ckpt_library's);
    else an InputError (exit 2) naming `where`, before any host is asked."""
    from labctl.agent.ckpt.library import LibraryError, check_run_id

    try:
        return check_run_id(run_id)
    except LibraryError as e:
        raise InputError(
            f"{where}: {e}.",
            "Give the run's id as `labctl ckpt list` shows it, e.g. p1-20261123-213000-ab12.",
        ) from None


def copies(ctx: Context, lib: Library, run_id: str | None = None) -> dict[str, Any]:
    """The library's committed copies ({entries, incoming}); a HostError when its host fails."""
    from labctl.hosts.agent_ship import ask_agent

    args: dict[str, Any] = {"lib": lib.path}
    if run_id is not None:
        args["run_id"] = library_run_id(run_id, "The run")
    answer: dict[str, Any] = ask_agent(ctx, lib.host, "ckpt.lib_list", args, timeout=120)
    return answer


def rehash(
    ctx: Context, lib: Library, pairs: list[tuple[str, int]], *, mark: bool
) -> dict[tuple[str, int], str | None]:
    """Re-hash these library copies on the storage host: (run, step) -> why damaged, or None.
    `mark`: record the finding in each copy, as `ckpt verify` does."""
    from labctl.hosts.agent_ship import ask_agent

    if not pairs:
        return {}
    args = {"lib": lib.path, "copies": [list(p) for p in pairs], "mark": mark}
    answer = ask_agent(ctx, lib.host, "ckpt.lib_verify", args, timeout=24 * 3600.0)
    return {(e["run_id"], e["step"]): e.get("reason") for e in answer["entries"]}


def find_sources(ctx: Context, damaged: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, str] | None]:
    """For each damaged library copy ({run_id, step, record}), a training host folder that still
    holds that step valid and with the copy's sha256 ({host, dir}), or None.

    Tried in order: the folder the copy was backed up from, then the run's hosts and folder. A
    step with other bytes under the same run id is another checkpoint, never a repair.
    """
    from labctl.hosts.agent_ship import ask_agent

    if not damaged:
        return {}
    try:
        records = {r["run_id"]: r for r in run_records(ctx, None)}
    except LabctlError:
        records = {}

    def candidates(e: dict[str, Any]) -> list[tuple[str, str]]:
        rec = e.get("record") or {}
        out: list[tuple[str, str]] = []
        if rec.get("origin") == "backup" and rec.get("source_host") and rec.get("source_path"):
            out.append((str(rec["source_host"]), str(rec["source_path"])))
        run = records.get(e["run_id"])
        folder = checkpoint_dir(run) if run else None
        if run and folder:
            out += [(str(h), folder) for h in run.get("hosts") or []]
        return list(dict.fromkeys(out))

    def ask(e: dict[str, Any]) -> dict[str, str] | None:
        want = (e.get("record") or {}).get("sha256")
        for name, folder in candidates(e):
            host = ctx.inventory.hosts.get(name)
            if host is None:
                continue
            try:
                got = ask_agent(ctx, host, "ckpt.newest", {"dir": folder, "step": e["step"]}, timeout=3600)
            except LabctlError:
                continue
            if got.get("step") == e["step"] and want in (None, got.get("sha256")):
                return {"host": name, "dir": folder}
        return None

    with ThreadPoolExecutor(max_workers=min(8, len(damaged))) as pool:
        found = list(pool.map(ask, damaged))
    return {(e["run_id"], e["step"]): f for e, f in zip(damaged, found, strict=True)}


def pulled_from(record: dict[str, Any]) -> str | None:
    """The folder or archive on this machine a pulled copy came from, if it is still here: what
    `labctl ckpt pull` takes again to replace a damaged copy."""
    import os
    import socket

    where = record.get("source_path")
    if record.get("origin") != "pull" or not isinstance(where, str):
        return None
    if record.get("source_host") != socket.gethostname():
        return None
    # An archive's member is recorded as ARCHIVE::MEMBER, a folder's checkpoint as its path.
    path = where.split("::", 1)[0] if "::" in where else os.path.dirname(where)
    return path if os.path.exists(path) else None


def repair_hints(
    ctx: Context,
    lib: Library,
    damaged: list[dict[str, Any]],
    sources: dict[tuple[str, int], dict[str, str] | None] | None = None,
) -> dict[tuple[str, int], dict[str, Any]]:
    """For each damaged copy, the command that mends it ({text, mends}): a backup from a host
    that still holds the checkpoint, a pull from the source still on this machine (`mends`:
    the copy is good again), or, when the checkpoint is nowhere else any more, removing the
    copy, which nothing can mend. `sources`: what `find_sources` answered, if asked already."""
    if sources is None:
        sources = find_sources(ctx, damaged)
    # --storage only where the command needs it to find this library (several storage hosts).
    several = sum(1 for h in ctx.inventory.hosts.values() if h.storage is not None) > 1
    storage = f" --storage {lib.host.name}" if several else ""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for e in damaged:
        key = (e["run_id"], e["step"])
        run, step = shlex.quote(e["run_id"]), e["step"]
        src = sources.get(key)
        pulled = pulled_from(e.get("record") or {})
        if src is not None:
            text = (
                f"`labctl ckpt backup --run {run}{storage}` copies step {step} again from "
                f"{src['host']}:{src['dir']}, which still holds it."
            )
        elif pulled is not None:
            text = (
                f"`labctl ckpt pull {shlex.quote(pulled)} --run {run}{storage}` sends step {step} again "
                "from where it was pulled."
            )
        else:
            text = (
                f"No training host holds step {step} any more, so it cannot be copied again: "
                f"`labctl ckpt verify --run {run} --remove-damaged{storage}` drops the copy."
            )
        out[key] = {"text": text, "mends": src is not None or pulled is not None}
    return out
