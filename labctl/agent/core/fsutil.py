"""The one way labctl replaces a file: a reader sees the old file or the new one, never half.

Used on hosts by the agent (provision, the cache, checkpoints, generated models, run records)
and on the controller through labctl/output/files.py. Standard library only, Python 3.8.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import stat
import tempfile
from typing import IO, Any, Callable, Dict, Optional, Tuple, Union

Fill = Union[bytes, Callable[[IO[bytes]], Any]]


# Read once at import: os.umask can only be read by setting it, which would race other threads.
_UMASK = os.umask(0)
os.umask(_UMASK)


def fsync_dir(path: str) -> None:
    """Make a rename in `path` durable; some file systems cannot fsync a folder, which is fine."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(
    path: str,
    data: Fill,
    mode: Optional[int] = None,
    owner: Optional[Tuple[int, int]] = None,
    durable: bool = False,
    mount_point_ok: bool = False,
    buffering: int = -1,
) -> int:
    """Replace `path` with `data` (bytes, or a function that writes to the open file); its size.

    The bytes go to a temporary file beside `path`, are fsynced, then renamed over it.
    `mode`: the new file's mode; default the old file's, else what a new file gets (umask).
    `owner`: (uid, gid); either left out (-1, or no `owner`) is the old file's, else ours.
    `durable`: fsync the folder too, so the rename survives a power cut (checkpoints, /etc).
    `mount_point_ok`: when `path` is itself a mount point (a bind-mounted file, as /etc/fstab
    in containers and labctl's simulated lab), a rename cannot replace it: copy in place then.
    """
    directory = os.path.dirname(path) or "."
    try:
        old: Optional[os.stat_result] = os.stat(path)
    except FileNotFoundError:
        old = None
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb", buffering=buffering) as f:
            if isinstance(data, bytes):
                f.write(data)
            else:
                data(f)
            f.flush()
            os.fsync(f.fileno())
        if mode is None:
            mode = (old.st_mode & 0o7777) if old else (0o666 & ~_UMASK)
        os.chmod(tmp, mode)
        uid, gid = owner if owner is not None else (-1, -1)
        if old is not None:
            uid = old.st_uid if uid == -1 else uid
            gid = old.st_gid if gid == -1 else gid
        if (uid, gid) != (-1, -1) and (uid, gid) != (os.geteuid(), os.getegid()):
            os.chown(tmp, uid, gid)
        size = os.path.getsize(tmp)
        try:
            os.replace(tmp, path)
        except OSError as e:
            if not (mount_point_ok and e.errno == errno.EBUSY):
                raise
            _copy_in_place(tmp, path)
            os.unlink(tmp)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and e.filename is None:
            e.filename = path  # a write that found the disk full names the file it was for
        raise
    if durable:
        fsync_dir(directory)
    return size


def write_json(path: str, obj: Any, **options: Any) -> int:
    """`obj` as compact, key-sorted JSON, replaced atomically (see write_atomic for options)."""
    return write_atomic(path, json.dumps(obj, sort_keys=True, separators=(",", ":")).encode(), **options)


def _copy_in_place(src: str, path: str) -> None:
    with open(src, "rb") as s, open(path, "r+b") as f:
        while True:
            block = s.read(1 << 20)
            if not block:
                break
            f.write(block)
        f.truncate()
        f.flush()
        os.fsync(f.fileno())


# Content sent back up to this size; the sha256 always, which is what plans compare. A probe
# with "whole": true gets the content at any size (an edit of one line needs the rest).
MAX_CONTENT = 1 << 20


def file_state(p: Dict[str, Any]) -> Dict[str, Any]:
    """What a file is (mode, owner, size, sha256, and its text up to MAX_CONTENT): p = {path, content?, whole?}."""
    path = p["path"]
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return {"exists": False}
    out: Dict[str, Any] = {
        "exists": True,
        "is_dir": stat.S_ISDIR(st.st_mode),
        "mode": stat.S_IMODE(st.st_mode),
        "uid": st.st_uid,
        "gid": st.st_gid,
        "size": st.st_size,
    }
    # content: false for a secret (a private key): its mode and size are all the plan needs.
    if stat.S_ISREG(st.st_mode) and p.get("content", True):
        with open(path, "rb") as f:
            data = f.read()
        out["sha256"] = hashlib.sha256(data).hexdigest()
        if len(data) <= MAX_CONTENT or p.get("whole"):
            try:
                out["text"] = data.decode("utf-8")
            except UnicodeDecodeError:
                out["b64"] = base64.b64encode(data).decode()
    return out
