"""The checkpoint library on the storage host: checkpoints kept off the host that trained them.

Layout (under the storage host's `storage.checkpoints`, default: beside `storage.models`):

    LIB/RUN_ID/step-00000120/step-00000120.pt     the trainer's checkpoint, byte for byte
    LIB/RUN_ID/step-00000120/step-00000120.json   its manifest (sha256, bytes, step, model)
    LIB/RUN_ID/step-00000120/backup.json          how it got here: RECORD_KEYS
    LIB/RUN_ID/step-00000120/damaged.json         written by verify when the copy does not
                                                  re-hash: {reason, found_at}; the next
                                                  backup (or pull) replaces such a copy
    LIB/RUN_ID/.incoming-step-00000120/           a copy under way: invisible to list, verify,
                                                  restore and retention; resumed by the next copy

A step folder is only ever made by renaming a complete, verified incoming folder (`commit`),
so a reader sees a whole checkpoint or none; a damaged step folder is replaced the same way
(the old one renamed out of sight, the verified new one renamed in). Each step folder is a `CheckpointDir`, so the
trainer's own validation (`CheckpointDir.check`) is the library's.

Standard library only, Python 3.8 syntax, like the rest of the agent.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from typing import Any, Dict, List, Optional

from ..core.fsutil import fsync_dir, write_atomic
from ..train.ckpt import CheckpointDir, manifest_name, pt_name

RECORD = "backup.json"
DAMAGED = "damaged.json"
INCOMING_PREFIX = ".incoming-"
# What backup.json holds. origin: "backup" (host to host), "pull" (a cloud session's output).
RECORD_KEYS = ("run_id", "step", "origin", "source_host", "source_path", "backed_up_at", "sha256", "bytes")
_STEP_DIR = re.compile(r"step-([0-9]{8})\Z")
# A run id names a folder: no separators, no leading dot (hidden folders are incoming copies).
_RUN_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}\Z")


class LibraryError(Exception):
    pass


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise LibraryError(f"{run_id!r} is not a run id the library can hold (letters, digits, _ . + -)")
    return run_id


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def run_dir(lib: str, run_id: str) -> str:
    return os.path.join(lib, check_run_id(run_id))


def step_dir(lib: str, run_id: str, step: int) -> str:
    return os.path.join(run_dir(lib, run_id), step_dir_name(step))


def incoming_dir(lib: str, run_id: str, step: int) -> str:
    return os.path.join(run_dir(lib, run_id), INCOMING_PREFIX + step_dir_name(step))


def read_record(path: str) -> Optional[Dict[str, Any]]:
    """A step folder's backup.json, or None when it is missing or unreadable."""
    try:
        with open(os.path.join(path, RECORD)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def entries(lib: str, run_id: Optional[str] = None) -> List[Dict[str, Any]]:
    """The committed copies: {run_id, step, path, record}, by run then step; nothing is hashed."""
    out: List[Dict[str, Any]] = []
    try:
        runs = sorted(os.listdir(lib)) if run_id is None else [check_run_id(run_id)]
    except FileNotFoundError:
        return out
    for run in runs:
        if run.startswith(".") or not _RUN_ID.match(run):
            continue
        try:
            names = sorted(os.listdir(os.path.join(lib, run)))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            m = _STEP_DIR.match(name)
            if m is None:
                continue
            path = os.path.join(lib, run, name)
            out.append(
                {
                    "run_id": run,
                    "step": int(m.group(1)),
                    "path": path,
                    "record": read_record(path),
                    "damaged": damaged_reason(path),
                }
            )
    return out


def damaged_reason(path: str) -> Optional[str]:
    """What the last verify found wrong with the copy in `path` (its damaged.json), or None."""
    try:
        with open(os.path.join(path, DAMAGED)) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return "damaged (unreadable " + DAMAGED + ")"
    reason = data.get("reason") if isinstance(data, dict) else None
    return str(reason) if reason else "damaged"


def mark(path: str, reason: Optional[str]) -> None:
    """Record verify's finding in the step folder (damaged.json), or clear it when intact, so
    backup and pull know to replace the copy without re-hashing the whole library. A folder
    that cannot be written keeps what it had: verify's answer names the damage anyway."""
    marker = os.path.join(path, DAMAGED)
    try:
        if reason is None:
            if os.path.exists(marker):
                os.unlink(marker)
            return
        found = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        write_atomic(marker, (json.dumps({"reason": reason, "found_at": found}) + "\n").encode())
    except OSError:
        pass


def check_entry(path: str, step: int) -> Optional[str]:
    """Why the copy in `path` is damaged (re-hashed against its manifest), or None when intact.

    The manifest must also be the one committed (the record keeps its sha256 and size): a .pt
    changed together with its manifest is not the checkpoint that was backed up."""
    record = read_record(path)
    if record is None:
        return f"{RECORD} missing or unreadable"
    ck = CheckpointDir(path)
    reason = ck.check(step)
    if reason is not None:
        return reason
    manifest = ck.manifest(step)
    for key in ("sha256", "bytes"):
        if record.get(key) is not None and manifest.get(key) != record.get(key):
            return (
                f"manifest rewritten: its {key} is {str(manifest.get(key))[:12]}, "
                f"{RECORD} recorded {str(record.get(key))[:12]} when the copy was committed"
            )
    return None


def commit(lib: str, run_id: str, step: int, record: Dict[str, Any]) -> Dict[str, Any]:
    """Verify the incoming copy of `step` and make it visible, atomically; returns the entry.

    The incoming folder must hold the .pt and its manifest. An intact copy already committed
    wins (the incoming one is dropped): committing twice is harmless. A committed copy that
    does not re-hash is replaced by the verified incoming one (`replaced`: what was wrong),
    keeping its backed_up_at so retention still files it where it was.
    """
    final = step_dir(lib, run_id, step)
    incoming = incoming_dir(lib, run_id, step)
    old: Optional[Dict[str, Any]] = None
    damage: Optional[str] = None
    if os.path.isdir(final):
        damage = check_entry(final, step)
        if damage is None:
            shutil.rmtree(incoming, ignore_errors=True)
            mark(final, None)  # mended by hand since verify marked it
            return {
                "run_id": run_id,
                "step": step,
                "path": final,
                "record": read_record(final),
                "existed": True,
            }
        old = read_record(final) or {}
    reason = CheckpointDir(incoming).check(step)
    if reason is not None:
        raise LibraryError(f"the copy of {run_id} step {step} does not verify: {reason}")
    manifest = CheckpointDir(incoming).manifest(step)
    if old is not None and old.get("sha256") not in (None, manifest.get("sha256")):
        # Same run and step, other bytes: not this copy's checkpoint, so it cannot repair it.
        shutil.rmtree(incoming, ignore_errors=True)
        raise LibraryError(
            f"the library's damaged copy of {run_id} step {step} was checkpoint sha256 "
            f"{str(old.get('sha256'))[:12]}..., the new one is {str(manifest.get('sha256'))[:12]}...; "
            "the damaged copy was left as it is"
        )
    full = dict(record)
    full.update({"run_id": run_id, "step": step})
    if old is not None:
        if old.get("backed_up_at"):
            full["backed_up_at"] = old["backed_up_at"]
        full["replaced"] = {
            "reason": damage,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    full.setdefault("backed_up_at", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    full.setdefault("sha256", manifest.get("sha256"))
    full.setdefault("bytes", manifest.get("bytes"))
    text = (json.dumps(full, indent=2, sort_keys=True) + "\n").encode()
    write_atomic(os.path.join(incoming, RECORD), text, durable=True)
    doomed = None
    if old is not None:
        # A folder cannot be renamed over a non-empty one: the damaged copy goes out of sight
        # first, so a reader sees the damaged copy, no copy, or the verified one; never a mix.
        doomed = os.path.join(run_dir(lib, run_id), ".removing-" + step_dir_name(step))
        shutil.rmtree(doomed, ignore_errors=True)
        os.rename(final, doomed)
    os.rename(incoming, final)
    fsync_dir(os.path.dirname(final))
    if doomed is not None:
        shutil.rmtree(doomed, ignore_errors=True)
    out = {"run_id": run_id, "step": step, "path": final, "record": full, "existed": False}
    if damage is not None:
        out["replaced"] = damage
    return out


def remove(lib: str, run_id: str, step: int) -> None:
    """Drop one committed copy: renamed out of sight first, so a half-deleted copy is never listed."""
    final = step_dir(lib, run_id, step)
    doomed = os.path.join(run_dir(lib, run_id), ".removing-" + step_dir_name(step))
    os.rename(final, doomed)
    shutil.rmtree(doomed)


FILES = (pt_name, manifest_name)  # the two files a step folder copies from a checkpoint folder
