"""`labctl ckpt restore RUN --to HOST`: a library copy back where a run resumes from it.

The library's copy is re-hashed first on the storage host (whatever `verify` marked or not): a
damaged one is never sent, and the refusal names the run's newest copy that does verify, as
the restore command that puts it back. The storage host then serves the step folder's two
files and HOST pulls them with the cache's transfer into a hidden folder inside the run's
checkpoint folder (or --dir); a stopped restore resumes from its verified chunks there. On
arrival HOST checks them again against their manifest and the library's sha256, and only then
renames them into place, the .pt first: the trainer, which takes a checkpoint only with its
manifest, never sees a half-copied or damaged one. A copy that arrives damaged is removed.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from labctl.ckpt.library import Library, checkpoint_dir, copies, rehash, repair_hints
from labctl.output.errors import HostError, InputError
from labctl.output.progress import QUIET, Progress

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.inventory.model import Host


def pick_step(
    entries: list[dict[str, Any]], run_id: str, step: int | None, lib: Library, storage: str = ""
) -> dict[str, Any]:
    """The library copy to restore: `step`, else the newest. `storage`: the backup command's
    --storage words, where it needs them to find this library."""
    mine = [e for e in entries if e["run_id"] == run_id]
    if not mine:
        runs = sorted({e["run_id"] for e in entries})
        held = f" It holds: {', '.join(runs[:8])}." if runs else ""
        raise InputError(
            f"The library on {lib.host.name} ({lib.path}) holds no copy of run '{run_id}'.",
            f"Back it up first: `labctl ckpt backup --run {shlex.quote(run_id)}{storage}`.{held}",
        )
    if step is None:
        return max(mine, key=lambda e: int(e["step"]))
    for e in mine:
        if e["step"] == step:
            return e
    raise InputError(
        f"The library holds no step {step} of run '{run_id}'.",
        f"Steps held: {', '.join(str(e['step']) for e in mine)}.",
    )


def newest_good(ctx: Context, lib: Library, held: list[dict[str, Any]], run_id: str, bad: int) -> int | None:
    """The run's newest library copy other than step `bad` that re-hashes intact, or None; each
    copy tried is marked as `verify` marks it."""
    for step in sorted((int(e["step"]) for e in held if e["run_id"] == run_id), reverse=True):
        if step != bad and rehash(ctx, lib, [(run_id, step)], mark=True).get((run_id, step), "gone") is None:
            return step
    return None


def refusal(
    ctx: Context,
    lib: Library,
    held: list[dict[str, Any]],
    entry: dict[str, Any],
    damage: str,
    to: Host,
    folder: str | None,
    note: str = "",
) -> HostError:
    """Why the copy `entry` is not restored, with what mends it and the newest good step."""
    run_id, n = entry["run_id"], int(entry["step"])
    entry["record"] = entry.get("record") or {}
    fix = repair_hints(ctx, lib, [entry])[(run_id, n)]
    then = " Then run this restore again." if fix["mends"] else ""
    good = newest_good(ctx, lib, held, run_id, n)
    other = " The library holds no other copy of this run that verifies."
    if good is not None:
        again = f"labctl ckpt restore {shlex.quote(run_id)} --to {to.name} --step {good}"
        if folder is not None:
            again += f" --dir {shlex.quote(folder)}"
        several = sum(1 for h in ctx.inventory.hosts.values() if h.storage is not None) > 1
        if several:
            again += f" --storage {lib.host.name}"
        other = f" Or restore step {good}, the newest copy that verifies: `{again}`."
    return HostError(
        f"The library's copy of {run_id} step {n} on {lib.host.name} ({entry['path']}) is damaged "
        f"({damage}){note}; nothing was restored.",
        f"{fix['text']}{then}{other}",
    )


def restore(
    ctx: Context,
    lib: Library,
    run_id: str,
    to: Host,
    *,
    step: int | None,
    folder: str | None,
    chunk_size: int,
    streams: int,
    progress: Progress = QUIET,
) -> dict[str, Any]:
    from labctl.agent.ckpt.library import step_dir_name
    from labctl.agent.train.ckpt import manifest_name, pt_name
    from labctl.cache.sync import FileServer, pull_from
    from labctl.ckpt.library import run_records
    from labctl.hosts.agent_ship import AgentFailed, ask_agent
    from labctl.hosts.fanout import on_host

    folder_given = folder is not None
    if folder is None:
        try:
            record = run_records(ctx, [run_id])[0]
        except InputError:
            raise InputError(
                f"Run '{run_id}' has no record on this machine, so its checkpoint folder is unknown.",
                "Say where the checkpoint goes: --dir /data/ckpt/phase1.",
            ) from None
        folder = checkpoint_dir(record)
        if folder is None:
            raise InputError(
                f"Run '{run_id}'s record names no checkpoint folder.",
                "Say where the checkpoint goes: --dir PATH.",
            )
    from labctl.inventory.model import host_path

    try:
        folder = host_path(folder)
    except ValueError as e:
        # The rule every host path of the inventory and phase files follows.
        raise InputError(f"--dir {e}.", "For example: --dir /data/ckpt/phase1.") from None
    held = copies(ctx, lib, run_id)["entries"]
    # --storage only where the backup needs it to find this library (several storage hosts)
    several = sum(1 for h in ctx.inventory.hosts.values() if h.storage is not None) > 1
    entry = pick_step(held, run_id, step, lib, f" --storage {lib.host.name}" if several else "")
    n = int(entry["step"])
    # Re-hashed before it is served: a damaged copy restored would overwrite that step on the
    # host (perhaps a good one) with one the trainer then skips.
    damage = rehash(ctx, lib, [(run_id, n)], mark=True).get((run_id, n), "no longer in the library")
    if damage:
        raise refusal(ctx, lib, held, entry, str(damage), to, folder if folder_given else None)
    names = [pt_name(n), manifest_name(n)]
    staging = ".labctl-restore-" + step_dir_name(n)
    server = FileServer(ctx, lib.host, entry["path"], names, chunk_size, hash_cache=False).begin()
    pulled: dict[str, Any] | None = None
    last: dict[str, Any] = {}
    try:
        info = server.wait_ready()
        if info.get("missing"):
            raise HostError(
                f"{lib.host.name}: the copy {entry['path']} lacks {', '.join(info['missing'])}.",
                f"Check it: `labctl ckpt verify --run {shlex.quote(run_id)}`.",
            )
        args = {
            "into": f"{folder.rstrip('/')}/{staging}",
            "all_or_nothing": True,
            "models": [info["models"][name] for name in names],  # the .pt lands before its manifest
            "chunk_size": chunk_size,
            "streams": streams,
            "source": f"{lib.host.name}:{entry['path']}",
        }
        label = f"{run_id} step {n}"

        try:
            pulled = on_host(
                ctx, to, lambda run: pull_from(run, server, info, args, last, progress, what=label)
            )
        except HostError as e:
            raise HostError(
                f"the restore of {label} from {lib.host.name} to {to.name}:{folder} stopped: {e.message}",
                "Nothing half-copied is visible to the trainer; run the same restore again to resume.",
            ) from None
    finally:
        server.stop(5.0 if pulled is not None else 0.0)
    sha = (entry.get("record") or {}).get("sha256")
    try:
        ask_agent(
            ctx,
            to,
            "ckpt.restore_commit",
            {"dir": folder, "staging": staging, "step": n, "sha256": sha},
            timeout=max(120.0, float(entry.get("bytes") or 0) / 50e6),
        )
    except AgentFailed as e:
        if e.kind != "damaged":
            raise
        # Damaged on the way or at the source since it was re-hashed: which, the source says.
        damage = rehash(ctx, lib, [(run_id, n)], mark=True).get((run_id, n), "no longer in the library")
        if damage:
            note = f", found when the copy that reached {to.name} did not verify there"
            raise refusal(
                ctx, lib, held, entry, str(damage), to, folder if folder_given else None, note
            ) from None
        raise HostError(
            f"The copy of {run_id} step {n} arrived on {to.name} damaged, though the library's copy "
            f"verifies: {e.message.rstrip('.')}; nothing was restored.",
            "Run the same restore again; the copy is sent afresh.",
        ) from None
    return {
        "run_id": run_id,
        "step": n,
        "host": to.name,
        "dir": folder,
        "files": [f"{folder.rstrip('/')}/{name}" for name in names],
        "from": f"{lib.host.name}:{entry['path']}",
        "fetched_bytes": pulled.get("fetched_bytes", 0),
        "resumed_bytes": pulled.get("resumed_bytes", 0),
        "seconds": pulled.get("seconds"),
        "rate_bytes_per_s": pulled.get("rate_bytes_per_s"),
    }
