"""Agent commands for `labctl ckpt`: a training host's newest valid checkpoint, the
checkpoint library on the storage host (list, commit, remove, verify), and a restored
checkpoint checked on arrival and put in place (restore_commit).

The bytes themselves move with the cache's transfer (`cache.serve` on one host,
`cache.pull` with `into` on the other); these commands only look and decide.

Standard library only, Python 3.8 syntax, like the rest of the agent.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Dict, List, Optional

from ..core.errors import AgentError
from ..core.fsutil import fsync_dir
from ..core.spec import Opt, Or, command
from ..train.ckpt import CheckpointDir, manifest_name, pt_name
from . import library as lib

# What this feature's answers share (labctl/agent/core/spec.py's shape language).
CKPT_ENTRY: Dict[str, Any] = {
    "run_id": "str",
    "step": "int",
    "path": "str",
    "bytes?": "int?",
    "record?": ({}, "null"),
}


def _library_error(exc: lib.LibraryError) -> AgentError:
    return AgentError(str(exc), "bad_args")


@command(
    takes={"dir": "str", "step": Opt("int?", None)},
    answers={
        "exists": "bool",
        "step": "int?",
        "bytes?": "int?",
        "sha256?": "str?",
        "files?": ["str"],
        "skipped": [{"step": "int", "reason?": "str?"}],
    },
)
def newest_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """The newest valid checkpoint in a run's checkpoint folder on this host (re-hashed),
    and the newer ones skipped with their reason. With `step`: that step, if it is valid
    (a damaged library copy is copied again from a folder that still holds it)."""
    path = args["dir"]
    if not os.path.isdir(path):
        return {"dir": path, "exists": False, "step": None, "skipped": []}
    folder = CheckpointDir(path)
    skipped: List[Dict[str, Any]] = []
    steps = folder.steps_present()
    if args["step"] is not None:
        steps = [s for s in steps if s == args["step"]]
    for step in reversed(steps):
        reason = folder.check(step)
        if reason is None:
            manifest = folder.manifest(step)
            return {
                "dir": path,
                "exists": True,
                "step": step,
                "bytes": manifest.get("bytes"),
                "sha256": manifest.get("sha256"),
                "files": list(name(step) for name in lib.FILES),
                "skipped": skipped,
            }
        skipped.append({"step": step, "reason": reason})
    return {"dir": path, "exists": True, "step": None, "skipped": skipped}


def _entry_json(e: Dict[str, Any]) -> Dict[str, Any]:
    record = e.get("record") or {}
    return {
        "run_id": e["run_id"],
        "step": e["step"],
        "path": e["path"],
        "bytes": record.get("bytes"),
        "backed_up_at": record.get("backed_up_at"),
        "origin": record.get("origin"),
        "source_host": record.get("source_host"),
        "damaged": e.get("damaged"),
        "record": record,
    }


@command(
    takes={"lib": "str", "run_id": Opt("str?", None)},
    answers={"exists": "bool", "entries": [CKPT_ENTRY], "incoming?": ["str"]},
)
def list_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """The committed copies (nothing hashed); incoming copies are counted, never listed as copies."""
    root = args["lib"]
    run_id: Optional[str] = args["run_id"]
    try:
        found = lib.entries(root, run_id)
    except lib.LibraryError as exc:
        raise _library_error(exc) from None
    incoming = []
    if os.path.isdir(root):
        for run in sorted(os.listdir(root)) if run_id is None else [run_id]:
            try:
                names = os.listdir(os.path.join(root, run))
            except OSError:
                continue
            incoming += [run + "/" + n for n in sorted(names) if n.startswith(lib.INCOMING_PREFIX)]
    return {
        "lib": root,
        "exists": os.path.isdir(root),
        "entries": [_entry_json(e) for e in found],
        "incoming": incoming,
    }


@command(
    takes={"lib": "str", "run_id": "str", "step": "int", "record": Or({}, {})},
    answers=dict(CKPT_ENTRY, **{"existed": "bool"}),
)
def commit_command(args: Dict[str, Any]) -> Dict[str, Any]:
    try:
        entry = lib.commit(args["lib"], args["run_id"], args["step"], dict(args["record"]))
    except lib.LibraryError as exc:
        raise AgentError(str(exc), "damaged") from None
    out = _entry_json(entry)
    out["existed"] = entry["existed"]
    out["replaced"] = entry.get("replaced")
    return out


@command(
    takes={"lib": "str", "copies": Or(["any"], [])},
    answers={"removed": [{"run_id": "str", "step": "int"}]},
)
def remove_command(args: Dict[str, Any]) -> Dict[str, Any]:
    root = args["lib"]
    removed = []
    for run_id, step in args["copies"]:
        try:
            lib.remove(root, str(run_id), int(step))
        except FileNotFoundError:
            continue  # already gone: removing twice is harmless
        except lib.LibraryError as exc:
            raise _library_error(exc) from None
        removed.append({"run_id": run_id, "step": int(step)})
    return {"lib": root, "removed": removed}


@command(
    takes={
        "lib": "str",
        "run_id": Opt("str?", None),
        "copies": Opt((["any"], "null"), None),
        "mark": Opt("bool", False),
        "remove_damaged": Opt("bool", False),
    },
    answers={
        "exists?": "bool",
        "entries": [dict(CKPT_ENTRY, **{"status": "str", "reason?": "str?"})],
    },
)
def verify_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """Re-hash every committed copy (of `run_id`, or only `copies`: [[run_id, step]]) against
    its manifest: each one's status and reason.

    `mark`: record each finding in the copy (damaged.json, cleared when intact), so that the
    next backup or pull replaces it. `remove_damaged`: drop the copies found damaged now.
    """
    root = args["lib"]
    try:
        found = lib.entries(root, args["run_id"])
    except lib.LibraryError as exc:
        raise _library_error(exc) from None
    if args["copies"] is not None:
        wanted = {(str(r), int(s)) for r, s in args["copies"]}
        found = [e for e in found if (e["run_id"], e["step"]) in wanted]
    out = []
    for e in found:
        reason = lib.check_entry(e["path"], e["step"])
        item = _entry_json(e)
        item.update(status="ok" if reason is None else "damaged", reason=reason, damaged=reason)
        if reason is not None and args["remove_damaged"]:
            lib.remove(root, e["run_id"], e["step"])
            item["status"] = "removed"
        elif args["mark"]:
            lib.mark(e["path"], reason)
        out.append(item)
    return {"lib": root, "exists": os.path.isdir(root), "entries": out}


@command(
    takes={"dir": "any", "staging": "any", "step": "int", "sha256": Opt("str?", None)},
    answers={"dir": "str", "step": "int", "files": ["str"], "sha256?": "str?"},
)
def restore_commit_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """{dir, staging, step, sha256}: a restored checkpoint, whole in the hidden folder `staging`
    inside `dir`, checked here on arrival against its manifest and the library's sha256, then
    renamed into `dir`, the .pt before its manifest (the trainer takes a .pt only with its
    manifest). One that does not verify is removed whole and `dir` is left as it was."""
    folder = args["dir"]
    name = args["staging"]
    if not isinstance(folder, str) or not folder.startswith("/"):
        raise AgentError(f"dir must be an absolute path, got {folder!r}", "bad_args")
    if not isinstance(name, str) or not name.startswith(".") or "/" in name or name in (".", ".."):
        raise AgentError(f"staging must be a hidden folder name, got {name!r}", "bad_args")
    step = args["step"]
    want = args["sha256"]
    stage = os.path.join(folder, name)
    ck = CheckpointDir(stage)
    reason = ck.check(step)
    if reason is None and isinstance(want, str):
        got = str(ck.manifest(step).get("sha256"))
        if got != want:
            reason = f"its manifest names sha256 {got[:12]}..., the library's record {want[:12]}..."
    if reason is not None:
        shutil.rmtree(stage, ignore_errors=True)
        raise AgentError(
            f"the copy of step {step} that arrived in {stage} does not verify ({reason}); it was "
            f"removed and {folder} was left as it was",
            "damaged",
        )
    files = []
    for fname in (pt_name(step), manifest_name(step)):
        os.rename(os.path.join(stage, fname), os.path.join(folder, fname))
        files.append(os.path.join(folder, fname))
    fsync_dir(folder)
    shutil.rmtree(stage, ignore_errors=True)
    return {"dir": folder, "step": step, "files": files, "sha256": want}
