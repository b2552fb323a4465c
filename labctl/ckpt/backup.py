"""`labctl ckpt backup`: each run's newest valid checkpoint, host to host into the library.

Per run (the controller's run records: hosts and checkpoint folder), each training host is
asked for its newest valid checkpoint (re-hashed there); each distinct step is copied once,
from the first host that holds it valid. The training host serves the two files with the
cache's transfer (`cache.serve`), the storage host pulls them (`cache.pull` into the step's
incoming folder: verified, resumable chunks; the data never passes through this machine),
and `ckpt_library.commit` re-verifies the copy and renames it into sight. Then, and only for
runs whose copy did not fail, retention prunes the library (labctl/ckpt/retention.py), never
a run's newest copy that verifies: the copy retention would keep as a run's newest is
re-hashed first when it was not this time, and a damaged one passes that on to the next step.

A host's newer checkpoint that fails validation there is never skipped in silence: the backup
names it, why, and the step taken instead (`warnings`); the exit code stays 0 when a good one
was backed up, 1 when none was.

A step already in the library is not copied again unless it is damaged: the copies a backup
would otherwise call present are re-hashed on the storage host, and the ones `ckpt verify`
marked damaged are known from their mark. A damaged copy is copied again from a host that
still holds that checkpoint (the same sha256) and replaced atomically by the commit; one that
no host holds any more is named with the command that drops it. A killed copy leaves only
its incoming folder, which the next backup resumes.
"""

from __future__ import annotations

import shlex
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from labctl.ckpt.clock import iso, parse_record_time
from labctl.ckpt.library import (
    Library,
    copies,
    find_sources,
    newest_on_hosts,
    rehash,
    repair_hints,
    run_records,
    superseded,
)
from labctl.output.errors import HostError, InputError, LabctlError
from labctl.output.progress import QUIET, Progress

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.inventory.model import Host


def choose(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The copies to make from the hosts' answers: one per distinct newest step, from the first
    host that has it valid (hosts in the run's order)."""
    out: dict[int, dict[str, Any]] = {}
    for f in found:
        step = f.get("step")
        if isinstance(step, int) and step not in out:
            out[step] = f
    return [out[s] for s in sorted(out)]


def skipped_on_hosts(
    run_id: str,
    hosts: list[dict[str, Any]],
    picks: list[dict[str, Any]],
    dry_run: bool,
    actions: dict[tuple[str, int], str] | None = None,
) -> list[dict[str, Any]]:
    """A warning for each checkpoint a host holds newer than its newest valid one (the trainer's
    validation failed there): which, where, why, and the step backed up instead. `actions`:
    what became of each (run, step) copy, once known."""
    from labctl.agent.train.ckpt import pt_name

    came_from = {p["step"]: p["host"] for p in picks}
    verb = "would back up" if dry_run else "backed up"
    out: list[dict[str, Any]] = []
    for h in hosts:
        instead = h.get("step")
        listed = h.get("skipped")
        for s in listed if isinstance(listed, list) else []:
            step = s.get("step") if isinstance(s, dict) else None
            if not isinstance(step, int):
                continue
            reason = str(s.get("reason") or "not valid")
            where = f"{h.get('dir')}/{pt_name(step)}" if h.get("dir") else pt_name(step)
            text = f"skipped step {step} of {run_id} on {h['host']} ({where}): {reason}; "
            if isinstance(instead, int) and (actions or {}).get((run_id, instead)) == "failed":
                text += f"step {instead}, taken instead, failed too"
            elif isinstance(instead, int):
                text += f"{verb} step {instead} instead"
            else:
                text += f"no valid checkpoint is left on {h['host']}"
            if step in came_from and came_from[step] != h["host"]:
                came = "would come" if dry_run else "came"
                text += f" (step {step} itself {came} from {came_from[step]}, where it is valid)"
            out.append(
                {
                    "run_id": run_id,
                    "host": h["host"],
                    "dir": h.get("dir"),
                    "step": step,
                    "reason": reason,
                    "instead": instead if isinstance(instead, int) else None,
                    "text": text,
                }
            )
    return out


def copy_step(
    ctx: Context,
    lib: Library,
    run_id: str,
    src: Host,
    folder: str,
    step: int,
    *,
    chunk_size: int,
    streams: int,
    backed_up_at: str,
    progress: Progress = QUIET,
) -> dict[str, Any]:
    """Copy one checkpoint from `src:folder` into the library and commit it; what happened."""
    from labctl.agent.ckpt.library import LibraryError, incoming_dir
    from labctl.agent.train.ckpt import manifest_name, pt_name
    from labctl.cache.sync import FileServer, pull_from
    from labctl.hosts.agent_ship import ask_agent
    from labctl.hosts.fanout import on_host

    try:
        # The pull makes it; a killed copy's is found there and resumed.
        incoming = incoming_dir(lib.path, run_id, step)
    except LibraryError as e:
        raise InputError(
            f"Run '{run_id}' cannot be backed up: {e}.", "Run ids come from `labctl train`."
        ) from None
    names = [pt_name(step), manifest_name(step)]
    server = FileServer(ctx, src, folder, names, chunk_size, hash_cache=False).begin()
    pulled: dict[str, Any] | None = None
    last: dict[str, Any] = {}
    label = f"{run_id} step {step}"
    try:
        info = server.wait_ready()
        if info.get("missing"):
            raise HostError(
                f"{src.name}:{folder} no longer holds {', '.join(info['missing'])} (the trainer pruned it?).",
                "Run the backup again: it takes the newest checkpoint then.",
            )
        args = {
            "into": incoming,
            "models": [info["models"][n] for n in names],
            "chunk_size": chunk_size,
            "streams": streams,
            "source": f"{src.name}:{folder}",
        }

        try:
            pulled = on_host(
                ctx, lib.host, lambda run: pull_from(run, server, info, args, last, progress, what=label)
            )
        except HostError as e:
            where = ""
            if last.get("total"):
                where = f" at {last.get('done', 0)} of {last.get('total')} bytes"
            raise HostError(
                f"the copy of {label} from {src.name} to {lib.host.name} stopped{where}: {e.message}",
                "Verified chunks are kept in the library's incoming folder (not listed as a copy): "
                "run `labctl ckpt backup` again to resume.",
            ) from None
    finally:
        server.stop(5.0 if pulled is not None else 0.0)
    record = {
        "origin": "backup",
        "source_host": src.name,
        "source_path": folder,
        "backed_up_at": backed_up_at,
    }
    committed = ask_agent(
        ctx,
        lib.host,
        "ckpt.lib_commit",
        {"lib": lib.path, "run_id": run_id, "step": step, "record": record},
    )
    action = "present" if committed.get("existed") else "replaced" if committed.get("replaced") else "copied"
    return {
        "action": action,
        "path": committed["path"],
        "backed_up_at": committed.get("backed_up_at"),
        "bytes": committed.get("bytes"),
        "fetched_bytes": pulled.get("fetched_bytes", 0),
        "resumed_bytes": pulled.get("resumed_bytes", 0),
        "seconds": pulled.get("seconds"),
        "rate_bytes_per_s": pulled.get("rate_bytes_per_s"),
        "served": server.result,
    }


def backup(
    ctx: Context,
    lib: Library,
    records: list[dict[str, Any]],
    *,
    dry_run: bool = False,
    chunk_size: int,
    streams: int,
    progress: Progress = QUIET,
) -> dict[str, Any]:
    """Back up each run's newest checkpoint, then prune; JSON-ready. Per run: `action` is
    copied, present, would copy, replaced / would replace (the library's copy was `damaged`),
    damaged (no host holds it any more: `hint`), nothing (no valid checkpoint anywhere),
    superseded (a newer run writes into its checkpoint folder now: `by`) or failed."""
    from labctl.ckpt import clock

    now = clock.now()
    stamp = iso(now)
    newer = superseded(run_records(ctx, None))
    out_runs: list[dict[str, Any]] = [
        {"run_id": r["run_id"], "action": "superseded", "by": newer[r["run_id"]]}
        for r in records
        if r["run_id"] in newer
    ]
    records = [r for r in records if r["run_id"] not in newer]
    # The training hosts re-hash their newest checkpoints while the library is listed.
    with ThreadPoolExecutor(max_workers=2) as pool:
        listing = pool.submit(copies, ctx, lib)
        found = newest_on_hosts(ctx, records)
        held = listing.result()["entries"]
    have = {(e["run_id"], e["step"]): e for e in held}
    picked = {r["run_id"]: choose(found[r["run_id"]]) for r in records}
    # Never trust a copy for being there: the ones this backup would call present are re-hashed.
    present = [(run, p["step"]) for run, ps in picked.items() for p in ps if (run, p["step"]) in have]
    damaged = {k: str(e["damaged"]) for k, e in have.items() if e.get("damaged")}
    for k, why in rehash(ctx, lib, present, mark=not dry_run).items():
        damaged.pop(k, None)
        if why:
            damaged[k] = why
    failed: set[str] = set()

    def copy_into(item: dict[str, Any], src: str, folder: str, step: int) -> None:
        try:
            item.update(
                copy_step(
                    ctx,
                    lib,
                    item["run_id"],
                    ctx.inventory.hosts[src],
                    folder,
                    step,
                    chunk_size=chunk_size,
                    streams=streams,
                    backed_up_at=stamp,
                    progress=progress,
                )
            )
        except LabctlError as e:
            item.update(action="failed", error=e.message, hint=e.hint)
            failed.add(item["run_id"])

    for r in records:
        run_id = r["run_id"]
        hosts = found[run_id]
        picks = picked[run_id]
        errors = [{"host": h["host"], "error": h["error"]} for h in hosts if h.get("error")]
        if not picks:
            skipped = skipped_on_hosts(run_id, hosts, picks, dry_run)
            item = {"run_id": run_id, "action": "nothing", "hosts": hosts}
            problems = [f"{e['host']}: {e['error']}" for e in errors] + [w["text"] for w in skipped]
            if problems:
                # Checkpoints that exist but none valid: nothing good was backed up, so it fails.
                item.update(action="failed", error="; ".join(problems))
                if skipped:
                    item.update(
                        hint=f"`labctl ckpt list --run {shlex.quote(run_id)}` shows the copies the library "
                        "still holds; the trainer's next checkpoint can be backed up again.",
                    )
                failed.add(run_id)
            out_runs.append(item)
            continue
        for pick in picks:
            step, src = pick["step"], pick["host"]
            item = {
                "run_id": run_id,
                "step": step,
                "source_host": src,
                "source_path": pick["dir"],
                "bytes": pick.get("bytes"),
                "unreachable": errors,
            }
            if (run_id, step) in damaged:
                item["damaged"] = damaged[(run_id, step)]
            if (run_id, step) in have and "damaged" not in item:
                item["action"] = "present"
            elif dry_run:
                item["action"] = "would replace" if "damaged" in item else "would copy"
            else:
                copy_into(item, src, pick["dir"], step)
            out_runs.append(item)
    # Damaged copies of older steps: copied again from a host that still holds them.
    handled = {(run, p["step"]) for run, ps in picked.items() for p in ps}
    rest = [have[k] for k in sorted(damaged) if k not in handled and k[0] in picked]
    sources = find_sources(ctx, rest)
    hints = repair_hints(ctx, lib, rest, sources)
    for e in rest:
        key = (e["run_id"], e["step"])
        src = sources.get(key)
        item = {"run_id": e["run_id"], "step": e["step"], "damaged": damaged[key]}
        if src is None:
            item.update(action="damaged", path=e["path"], hint=hints[key]["text"])
        else:
            item.update(source_host=src["host"], source_path=src["dir"])
            if dry_run:
                item["action"] = "would replace"
            else:
                copy_into(item, src["host"], src["dir"], e["step"])
        out_runs.append(item)
    # Said once each copy's outcome is known, beside the copy taken instead (or the run's failure).
    actions = {(r["run_id"], r["step"]): str(r["action"]) for r in out_runs if "step" in r}
    warnings: list[dict[str, Any]] = []
    for r in records:
        run_id = r["run_id"]
        for w in skipped_on_hosts(run_id, found[run_id], picked[run_id], dry_run, actions):
            warnings.append(w)
            for item in out_runs:
                if item["run_id"] == run_id and item.get("step") == w["instead"]:
                    item.setdefault("skipped", []).append(w)
                    break
    new = [
        {"run_id": r["run_id"], "step": r["step"], "backed_up_at": r.get("backed_up_at") or stamp}
        for r in out_runs
        if r["action"] in ("copied", "would copy")
    ]
    # What this backup knows of each copy: None verifies (re-hashed, or copied and committed,
    # or would be), else why it is damaged. Whatever it does not know, prune re-hashes if needed.
    status: dict[tuple[str, int], str | None] = dict(damaged)
    status.update({k: None for k in present if k not in damaged})
    for r in out_runs:
        if r["action"] in ("copied", "replaced", "present", "would copy", "would replace"):
            status[(r["run_id"], r["step"])] = None
    pruned, plan = prune(ctx, lib, now, failed, dry_run, held + new, status)
    return {
        "storage": lib.host.name,
        "library": lib.path,
        "now": stamp,
        "dry_run": dry_run,
        "runs": out_runs,
        "pruned": pruned,
        "kept": plan,
        "failed": sorted(failed),
        "damaged": [{"run_id": r["run_id"], "step": r["step"]} for r in out_runs if r["action"] == "damaged"],
        "warnings": warnings,
    }


def prune(
    ctx: Context,
    lib: Library,
    now: Any,
    failed: set[str],
    dry_run: bool,
    entries: list[dict[str, Any]],
    status: dict[tuple[str, int], str | None] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Apply retention to the library's `entries` (the listing and this backup's copies):
    (pruned copies, kept key -> why). Runs whose copy failed this time are left alone, so a
    failed backup never costs an old copy; a dry run's planned copies count, unremovable.

    `monitor.status`: what the caller knows of each copy ((run, step) -> None when it verifies, else
    why it is damaged). A run that would lose a copy keeps its newest good one, and that one
    must verify: while it is not known to, it is re-hashed, and a damaged one hands the role
    to the next step down, so a damaged copy never stands in for the newest good one.
    """
    from labctl.ckpt.retention import Retention, plan_retention
    from labctl.hosts.agent_ship import ask_agent

    known: dict[tuple[str, int], str | None] = dict(status or {})
    for e in entries:
        if e.get("damaged"):
            known.setdefault((e["run_id"], e["step"]), str(e["damaged"]))
    dated = []
    where: dict[str, tuple[str, int]] = {}
    for e in entries:
        when = parse_record_time(e.get("backed_up_at"))
        if when is None:
            continue  # a copy without a readable record: verify names it, retention leaves it
        key = lib.key(e["run_id"], e["step"])
        if key not in where:
            dated.append((key, when))
            where[key] = (e["run_id"], e["step"])
    while True:
        bad = [k for k, w in where.items() if known.get(w)]
        plan = plan_retention(dated, now, Retention(), damaged=bad)
        losing = {where[k][0] for k in plan.prune} - failed
        unsure = [where[plan.newest[r]] for r in sorted(losing) if where[plan.newest[r]] not in known]
        if not unsure:
            break
        found = rehash(ctx, lib, unsure, mark=not dry_run)
        for pair in unsure:
            known[pair] = found.get(pair, "no longer in the library")
    doomed = [where[k] for k in plan.prune if k in where and where[k][0] not in failed]
    if doomed and not dry_run:
        ask_agent(ctx, lib.host, "ckpt.lib_remove", {"lib": lib.path, "copies": [list(d) for d in doomed]})
    return [{"run_id": r, "step": s} for r, s in doomed], dict(plan.why)
