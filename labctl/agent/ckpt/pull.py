"""Host side of `labctl ckpt pull`: files the controller uploaded in parts, put together and made
visible whole, in the checkpoint library (`ckpt_library.commit`) or the model library.

The controller writes each file as numbered parts (`put_bytes`: whole, size- and sha256-checked,
over the exec channel, so a host without SFTP takes them) into a `.parts` folder inside a hidden
incoming folder; a part that arrived before (an interrupted pull) is reported with its hash and
not sent again. Here the parts are joined into the file, the `.parts` folder goes, and the
incoming folder is renamed into place only once everything in it verifies.

Standard library only, Python 3.8 syntax, like the rest of the agent.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from typing import Any, Dict, List

from ..cache.manifest import check_name
from ..core import paths
from ..core.errors import AgentError
from ..core.fsutil import fsync_dir, write_atomic
from ..core.spec import Opt, Or, command
from ..train.ckpt import pt_name
from . import library as ckpt_library
from .library_cmds import CKPT_ENTRY

# What this feature's answers share (labctl/agent/core/spec.py's shape language).
PUBLISHED_FILES = {"*": {"size": "int", "sha256": "str"}}

PARTS = ".parts"
MODEL_INCOMING = ".incoming-"
_BLOCK = 1 << 20


def _abs(args: Dict[str, Any], key: str) -> str:
    path = args[key]
    if not isinstance(path, str) or not path.startswith("/"):
        raise AgentError(f"{key} must be an absolute path, got {path!r}", "bad_args")
    return path.rstrip("/") or "/"


def _sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(_BLOCK)
            if not block:
                return h.hexdigest()
            h.update(block)


def _files(folder: str) -> Dict[str, Dict[str, Any]]:
    """Every plain file under `folder` (relative path -> size, sha256); {} when it does not exist."""
    out: Dict[str, Dict[str, Any]] = {}
    for dirpath, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, folder)
            out[rel] = {"size": os.path.getsize(path), "sha256": _sha(path)}
    return out


def _join(folder: str, name: str, parts: List[Dict[str, Any]]) -> None:
    """Write folder/name from the parts in folder/.parts, each checked against its size and hash."""
    part_dir = os.path.join(folder, PARTS)
    for p in parts:
        path = os.path.join(part_dir, str(p["name"]))
        if not os.path.isfile(path) or os.path.getsize(path) != p["size"] or _sha(path) != p["sha256"]:
            raise AgentError(f"part {path} is missing or not the one sent; pull again", "damaged")

    def fill(f: Any) -> None:
        for p in parts:
            with open(os.path.join(part_dir, str(p["name"])), "rb") as src:
                shutil.copyfileobj(src, f, _BLOCK)

    write_atomic(os.path.join(folder, name), fill, durable=True)


def _parts(args: Dict[str, Any]) -> List[Dict[str, Any]]:
    parts = args.get("parts")
    ok = isinstance(parts, list) and all(
        isinstance(p, dict)
        and paths.component_problem(p.get("name")) is None
        and isinstance(p.get("size"), int)
        and isinstance(p.get("sha256"), str)
        for p in parts
    )
    if not ok:
        raise AgentError("parts must be a list of {name, size, sha256}", "bad_args")
    return list(parts)  # type: ignore[arg-type]


# -- the checkpoint library ------------------------------------------------------------------


@command(
    takes={"lib": "any", "run_id": "any", "steps": Or(["any"], [])},
    answers={
        "steps": {
            "*": {
                "committed": ({"path": "str", "sha256?": "str?", "damaged?": "str?"}, "null"),
                "parts": PUBLISHED_FILES,
            }
        }
    },
    per_asked=("steps", "steps"),
)
def ckpt_state_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """{lib, run_id, steps} -> per step: the committed copy (its sha256, and why it is damaged:
    re-hashed here, so a pull replaces a damaged copy rather than calling it present), or
    None; the parts already here."""
    lib = _abs(args, "lib")
    run_id = _run_id(args)
    out: Dict[str, Any] = {}
    for step in args["steps"]:
        final = ckpt_library.step_dir(lib, run_id, int(step))
        committed = None
        if os.path.isdir(final):
            record = ckpt_library.read_record(final) or {}
            committed = {
                "sha256": record.get("sha256"),
                "path": final,
                "origin": record.get("origin"),
                "damaged": ckpt_library.check_entry(final, int(step)),
            }
        part_dir = os.path.join(ckpt_library.incoming_dir(lib, run_id, int(step)), PARTS)
        out[str(step)] = {"committed": committed, "parts": _files(part_dir)}
    return {"lib": lib, "run_id": run_id, "steps": out}


def _run_id(args: Dict[str, Any]) -> str:
    try:
        return ckpt_library.check_run_id(args["run_id"])
    except ckpt_library.LibraryError as exc:
        raise AgentError(str(exc), "bad_args") from None


@command(
    takes={"lib": "any", "run_id": "any", "step": "int", "parts": Opt("any", None), "record": Or({}, {})},
    answers=dict(CKPT_ENTRY, **{"existed": "bool"}),
)
def ckpt_commit_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """{lib, run_id, step, parts, record}: join the .pt from its parts beside its uploaded
    manifest, then `ckpt_library.commit` (which verifies it against the manifest, and
    replaces a committed copy that is damaged)."""
    lib = _abs(args, "lib")
    run_id = _run_id(args)
    step = args["step"]
    record = dict(args["record"])
    incoming = ckpt_library.incoming_dir(lib, run_id, step)
    final = ckpt_library.step_dir(lib, run_id, step)
    if not os.path.isdir(final) or ckpt_library.check_entry(final, step) is not None:
        _join(incoming, pt_name(step), _parts(args))
        shutil.rmtree(os.path.join(incoming, PARTS), ignore_errors=True)
    try:
        entry = ckpt_library.commit(lib, run_id, step, record)
    except ckpt_library.LibraryError as exc:
        # What arrived does not match its manifest: nothing of it is kept for the next pull.
        shutil.rmtree(incoming, ignore_errors=True)
        raise AgentError(str(exc), "damaged") from None
    return entry


# -- the model library -----------------------------------------------------------------------


def _model_name(args: Dict[str, Any]) -> str:
    """The model library is the one `cache sync` reads: its names follow the cache's rule."""
    name = check_name(args["name"])
    if paths.component_problem(MODEL_INCOMING + name):
        raise AgentError(
            f"{name!r} is too long for a model name: its incoming folder ({MODEL_INCOMING}NAME) must fit "
            f"in {paths.NAME_MAX} bytes",
            "bad_name",
        )
    return name


def _file_name(name: Any) -> str:
    """`name` when it is one plain, visible file name inside a model folder (.parts is ours)."""
    problem = paths.component_problem(name)
    if problem is None and name.startswith("."):
        problem = "it starts with '.', as labctl's own files there do"
    if problem:
        raise AgentError(f"{name!r} is not a file name: {problem}", "bad_args")
    return name


@command(
    takes={"models": "any", "name": "any"},
    answers={
        "path": "str",
        "exists": "bool",
        "files": PUBLISHED_FILES,
        "parts": PUBLISHED_FILES,
    },
)
def model_state_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """{models, name} -> the model's files if it is in the library, and the parts already here."""
    root = _abs(args, "models")
    name = _model_name(args)
    final = os.path.join(root, name)
    incoming = os.path.join(root, MODEL_INCOMING + name)
    return {
        "path": final,
        "exists": os.path.lexists(final),
        "files": _files(final) if os.path.isdir(final) else {},
        "parts": _files(os.path.join(incoming, PARTS)),
    }


@command(
    takes={"models": "any", "name": "any", "files": Opt("any", None)},
    answers={"path": "str", "files": PUBLISHED_FILES, "written?": ["str"]},
)
def model_publish_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """{models, name, files: [{name, parts, size, sha256}]}: each file joined from its parts and
    checked whole against the size and sha256 the controller exported, then the folder renamed
    into place, so `cache sync` never lists half a model or a wrong one."""
    root = _abs(args, "models")
    name = _model_name(args)
    final = os.path.join(root, name)
    if os.path.lexists(final):
        raise AgentError(f"{final} already exists; it was not replaced", "exists")
    incoming = os.path.join(root, MODEL_INCOMING + name)
    files = args["files"]
    if not isinstance(files, list) or not files:
        raise AgentError("files must be a non-empty list of {name, parts}", "bad_args")
    written = []
    for f in files:
        fname = _file_name(f.get("name") if isinstance(f, dict) else None)
        _join(incoming, fname, _parts(f))
        path = os.path.join(incoming, fname)
        want_size, want_sha = f.get("size"), f.get("sha256")
        if (isinstance(want_size, int) and os.path.getsize(path) != want_size) or (
            isinstance(want_sha, str) and _sha(path) != want_sha
        ):
            shutil.rmtree(incoming, ignore_errors=True)
            raise AgentError(
                f"{fname} of model {name} does not match the file sent (size or sha256) once joined; "
                "nothing was published; pull again",
                "damaged",
            )
        written.append(fname)
    shutil.rmtree(os.path.join(incoming, PARTS), ignore_errors=True)
    os.rename(incoming, final)
    fsync_dir(root)
    return {"path": final, "files": _files(final), "written": written}
