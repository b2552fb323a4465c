"""Where the keeper listens, how both ends talk, and who may.

The socket lives in a folder only its user can enter (0700, owned by them, not a link):
$LABCTL_KEEPER_DIR if set (tests), else $XDG_RUNTIME_DIR/labctl, else `keeper` in labctl's
folder under the user's home (paths.USER_HOME).
One keeper per inventory file: the socket's name is a digest of the file's absolute path.

Frames are a 4-byte big-endian length and that many bytes of UTF-8 JSON. Each end checks the
other's uid with SO_PEERCRED: the keeper answers no other user, and a command talks to no
keeper but its user's.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import struct
from pathlib import Path
from typing import Any

from labctl.agent.core import paths

# Every request names it; a keeper of another labctl version declines, and leaves (the next
# command starts one of its own version).
PROTOCOL = 2
MAX_FRAME = 512 * 1024 * 1024  # put_bytes carries a whole file, base64
SUN_PATH_MAX = 107


class KeeperUnavailable(Exception):
    """No keeper to ask (no folder we trust, no socket, a refusal): the command connects itself."""


def keeper_dir() -> Path:
    override = os.environ.get("LABCTL_KEEPER_DIR")
    if override:
        return Path(override)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        try:
            st = os.stat(runtime)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
                return Path(runtime) / "labctl"
        except OSError:
            pass
    return Path.home() / paths.USER_HOME / "keeper"


def ensure_dir(folder: Path | None = None, create: bool = True) -> Path:
    """`folder` (default `keeper_dir()`), made 0700 if new, and refused (KeeperUnavailable)
    unless it is a real folder that this user owns and no one else may enter."""
    folder = folder or keeper_dir()
    if create:
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise KeeperUnavailable(f"cannot create {folder}: {e.strerror}") from None
    try:
        st = os.lstat(folder)
    except OSError as e:
        raise KeeperUnavailable(f"{folder}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise KeeperUnavailable(f"{folder} is not a folder (a link or a file)")
    if st.st_uid != os.geteuid():
        raise KeeperUnavailable(f"{folder} belongs to uid {st.st_uid}, not to this user")
    if st.st_mode & 0o077:
        raise KeeperUnavailable(f"{folder} has mode {stat.S_IMODE(st.st_mode):o}; it must be 700")
    return folder


def inventory_id(inventory: Path) -> str:
    return hashlib.sha256(str(Path(inventory).absolute()).encode("utf-8", "surrogateescape")).hexdigest()[:20]


def socket_path(inventory: Path, folder: Path | None = None) -> Path:
    path = (folder or keeper_dir()) / f"{inventory_id(inventory)}.sock"
    if len(os.fsencode(str(path))) > SUN_PATH_MAX:
        raise KeeperUnavailable(f"{path} is too long for a Unix socket")
    return path


def lock_path(sock: Path) -> Path:
    return sock.with_suffix(".lock")


def peer_uid(s: socket.socket) -> int:
    creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def send_frame(s: socket.socket, obj: dict[str, Any]) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    s.sendall(struct.pack(">I", len(data)) + data)


def _recv_exact(s: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            if buf:
                raise ConnectionError("the other end closed in the middle of a frame")
            return None
        buf += chunk
    return bytes(buf)


def recv_frame(s: socket.socket) -> dict[str, Any] | None:
    """The next frame, or None when the other end closed between frames."""
    head = _recv_exact(s, 4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    if n > MAX_FRAME:
        raise ConnectionError(f"a frame of {n} bytes is more than the protocol allows")
    body = _recv_exact(s, n)
    if body is None:
        raise ConnectionError("the other end closed in the middle of a frame")
    obj = json.loads(body)
    if not isinstance(obj, dict):
        raise ConnectionError("a frame that is not a JSON object")
    return obj


def connect(path: Path, timeout: float = 2.0) -> socket.socket:
    """A socket to the keeper at `path`, its owner checked (KeeperUnavailable if none)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(str(path))
        if peer_uid(s) != os.geteuid():
            raise KeeperUnavailable(f"{path} is served by another user")
    except KeeperUnavailable:
        s.close()
        raise
    except OSError as e:
        s.close()
        raise KeeperUnavailable(f"no keeper at {path}: {e.strerror or e}") from None
    return s


def close_quietly(s: socket.socket) -> None:
    """Shut down then close: shutdown is what wakes a thread blocked in recv on `s`."""
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
