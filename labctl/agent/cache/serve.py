"""The storage side of a copy: list models under the storage folder, and serve their bytes.

`cache.serve` listens on the host's own address and answers only clients that present its
one-time token, and only with byte ranges of the files it listed, each followed by its
sha256; whole-chunk hashes are cached beside the models so the next listing carries them.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import socket
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from ..core.accepting import Accepting, listen_on
from ..core.errors import AgentError
from ..core.fsutil import write_json
from ..core.spec import Opt, Or, command
from .manifest import (
    BLOCK,
    CACHE_FILE,
    DEFAULT_CHUNK,
    META,
    check_name,
    chunk_ranges,
    emit,
    inside,
    read_json,
)

MAX_LINE = 1 << 16
MAX_RANGE = 1 << 30
PROTOCOL = 1


def _hash_cache_path(root: str, name: str) -> str:
    return os.path.join(root, META, "hashes", name + ".json")


def list_models(
    root: str, names: List[str], chunk_size: int
) -> Tuple[Dict[str, Dict[str, Any]], List[str], Dict[str, str]]:
    """Listing of each named model under `root`, the names not found, and each file's real path.

    Dot files and folders are left out (tool metadata such as .cache/ or .git/), and so is
    anything a symlink leads to outside `root`: nothing outside the storage folder is served.
    """
    if not os.path.isdir(root):
        raise AgentError(f"the storage folder {root} does not exist on this host", "no_storage")
    real_root = os.path.realpath(root)
    models: Dict[str, Dict[str, Any]] = {}
    missing: List[str] = []
    real_paths: Dict[str, str] = {}
    for name in names:
        check_name(name)
        top = os.path.join(root, name)
        if not os.path.lexists(top):
            missing.append(name)
            continue
        real = os.path.realpath(top)
        if not inside(real, real_root):
            raise AgentError(f"{top} leads to {real}, outside the storage folder {root}", "outside")
        found: List[Tuple[str, str]] = []
        if os.path.isdir(real):
            kind = "dir"
            for dirpath, dirnames, filenames in os.walk(real):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                for fn in sorted(filenames):
                    if fn.startswith("."):
                        continue
                    full = os.path.join(dirpath, fn)
                    target = os.path.realpath(full)
                    if not inside(target, real_root):
                        raise AgentError(
                            f"{full} leads to {target}, outside the storage folder {root}", "outside"
                        )
                    if os.path.isfile(target):
                        found.append((name + "/" + os.path.relpath(full, real).replace(os.sep, "/"), target))
        elif os.path.isfile(real):
            kind = "file"
            found.append((name, real))
        else:
            raise AgentError(f"{top} is neither a file nor a folder", "not_a_model")
        cached = _read_hash_cache(root, name)
        files = []
        for rel, target in found:
            st = os.stat(target)
            entry: Dict[str, Any] = {"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
            c = cached.get(rel)
            if (
                isinstance(c, dict)
                and c.get("size") == st.st_size
                and c.get("mtime_ns") == st.st_mtime_ns
                and c.get("chunk_size") == chunk_size
                and len(c.get("chunks") or []) == len(chunk_ranges(st.st_size, chunk_size))
            ):
                entry["chunks"] = c["chunks"]
            files.append(entry)
            real_paths[rel] = target
        models[name] = {
            "name": name,
            "kind": kind,
            "files": files,
            "bytes": sum(f["size"] for f in files),
            "chunk_size": chunk_size,
        }
    return models, missing, real_paths


def _read_hash_cache(root: str, name: str) -> Dict[str, Any]:
    """Cached chunk hashes by file; whatever is not in the shape `_save_hashes` writes is ignored
    (hashed again, and the file rewritten once it is)."""
    try:
        doc = read_json(_hash_cache_path(root, name))
    except (ValueError, OSError):
        return {}
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict):
        return {}
    return {
        rel: c
        for rel, c in files.items()
        if isinstance(c, dict)
        and isinstance(c.get("chunks"), list)
        and all(isinstance(h, str) and len(h) == 64 for h in c["chunks"])
    }


def _available(root: str, limit: int = 40) -> List[str]:
    try:
        return sorted(n for n in os.listdir(root) if not n.startswith("."))[:limit]
    except OSError:
        return []


@command(
    takes={"root": "str", "models": Or(["any"], []), "chunk_size": Or("int", DEFAULT_CHUNK)},
    answers={
        "root?": "str",
        "models": {"*": {"name?": "str", "files": [CACHE_FILE], "bytes": "int", "chunk_size?": "int"}},
        "missing?": ["str"],
        "available?": ["str"],
    },
)
def list_command(args: Dict[str, Any]) -> Dict[str, Any]:
    root = args["root"]
    models, missing, _ = list_models(root, list(args["models"]), args["chunk_size"])
    for m in models.values():
        for f in m["files"]:
            f["hashed"] = "chunks" in f
            f.pop("chunks", None)
    return {"root": root, "models": models, "missing": missing, "available": _available(root)}


class _Served(Accepting):
    """The serving state shared by the connection threads."""

    def __init__(
        self,
        root: str,
        models: Dict[str, Dict[str, Any]],
        real_paths: Dict[str, str],
        token: str,
        chunk_size: int,
        idle_timeout: float,
        hash_cache: bool = True,
    ) -> None:
        super().__init__(idle_timeout)
        # False where the folder is not labctl's to write in (a run's checkpoint folder).
        self.hash_cache = hash_cache
        self.root = root
        self.models = models
        self.files = {f["path"]: f for m in models.values() for f in m["files"]}
        self.real = real_paths
        self.token = token
        self.chunk_size = chunk_size
        self.bytes_sent = 0
        self.ranges = 0
        self.connections = 0
        self.refused = 0
        self.peers: Set[str] = set()
        self.hashes: Dict[str, Dict[int, str]] = {}
        self.cached_files = 0

    def handle(self, conn: socket.socket, peer: str) -> None:
        with self.in_use():
            self._handle(conn, peer)

    def _handle(self, conn: socket.socket, peer: str) -> None:
        with self.lock:
            self.connections += 1
        files: Dict[str, Any] = {}
        try:
            # A client that stops talking must not keep the server (and its idle clock) for ever.
            conn.settimeout(max(30.0, self.idle_timeout))
            rf = conn.makefile("rb")
            hello = read_line(rf)
            if hello is None or not hmac.compare_digest(str(hello.get("token", "")), self.token):
                with self.lock:
                    self.refused += 1
                send_line(conn, {"ok": False, "error": "bad token"})
                return
            with self.lock:
                self.peers.add(peer)
            send_line(conn, {"ok": True, "protocol": PROTOCOL})
            buf = memoryview(bytearray(BLOCK))
            while not self.stop.is_set():
                req = read_line(rf)
                if req is None:
                    return
                self.touch()
                op = req.get("op")
                if op == "shutdown":
                    send_line(conn, {"ok": True})
                    self.shutdown()
                    return
                if op != "get":
                    send_line(conn, {"ok": False, "error": f"unknown op {op!r}"})
                    return
                if not self._send_range(conn, req, files, buf):
                    return
        except (OSError, ValueError):
            return  # the client went away; it retries or reports on its side
        finally:
            for f in files.values():
                f.close()
            conn.close()

    def _send_range(
        self, conn: socket.socket, req: Dict[str, Any], files: Dict[str, Any], buf: memoryview
    ) -> bool:
        path, offset, length = req.get("path"), req.get("offset"), req.get("length")
        meta = self.files.get(path) if isinstance(path, str) else None
        # Only files of the listed models, so a client cannot name /etc/shadow or ../x.
        if meta is None or not isinstance(offset, int) or not isinstance(length, int):
            send_line(conn, {"ok": False, "error": f"not served here: {path!r}"})
            return False
        if offset < 0 or length <= 0 or length > MAX_RANGE or offset + length > meta["size"]:
            send_line(conn, {"ok": False, "error": f"bad range {offset}+{length} of {path}"})
            return False
        assert isinstance(path, str)
        f = files.get(path)
        if f is None:
            # Kept open for the connection's next ranges; handle() closes them all.
            f = files[path] = open(self.real[path], "rb", buffering=0)  # noqa: SIM115
        st = os.fstat(f.fileno())
        if st.st_size != meta["size"] or st.st_mtime_ns != meta["mtime_ns"]:
            send_line(conn, {"ok": False, "error": f"{path} changed on the storage host since it was listed"})
            return False
        send_line(conn, {"ok": True, "length": length})
        h = hashlib.sha256()
        f.seek(offset)
        left = length
        while left:
            n = f.readinto(buf[: min(BLOCK, left)])
            if not n:
                return False  # the file shrank under us: dropping the connection tells the client
            h.update(buf[:n])
            conn.sendall(buf[:n])
            left -= n
        digest = h.hexdigest()
        send_line(conn, {"sha256": digest})
        with self.lock:
            self.bytes_sent += length
            self.ranges += 1
        self._record(path, offset, length, digest)
        self.touch()
        return True

    def _record(self, path: str, offset: int, length: int, digest: str) -> None:
        """Keep whole-chunk hashes; once a file has all of them, cache them beside the models."""
        meta = self.files[path]
        ranges = chunk_ranges(meta["size"], self.chunk_size)
        idx = offset // self.chunk_size
        if offset % self.chunk_size or idx >= len(ranges) or ranges[idx][1] != length:
            return
        known = meta.get("chunks")
        with self.lock:
            if known and known[idx] != digest:
                # Bytes differ from the cached hashes with size and mtime unchanged: the cache is
                # wrong (the client rejects the chunk); drop it so the next listing rehashes.
                meta.pop("chunks", None)
                with contextlib.suppress(OSError):
                    os.unlink(_hash_cache_path(self.root, path.split("/")[0]))
                return
            got = self.hashes.setdefault(path, {})
            got[idx] = digest
            if len(got) == len(ranges) and not known:
                meta["chunks"] = [got[i] for i in range(len(ranges))]
                if self.hash_cache:
                    self._save_hashes(path)

    def _save_hashes(self, path: str) -> None:
        name = path.split("/")[0]
        meta = self.files[path]
        target = _hash_cache_path(self.root, name)
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            try:
                doc = read_json(target)
            except ValueError:
                doc = None
            files = doc.get("files") if isinstance(doc, dict) else None
            files = files if isinstance(files, dict) else {}
            files[path] = {
                "size": meta["size"],
                "mtime_ns": meta["mtime_ns"],
                "chunk_size": self.chunk_size,
                "chunks": meta["chunks"],
            }
            write_json(target, {"files": files})
            self.cached_files += 1
        except (OSError, ValueError):
            pass  # a read-only library still serves; it just hashes again next time


def read_line(rf: Any) -> Optional[Dict[str, Any]]:
    line = rf.readline(MAX_LINE)
    if not line:
        return None
    try:
        doc = json.loads(line)
    except RecursionError:  # malformed like any other line, not a handler thread's death
        raise ValueError("the line is nested too deeply to parse as JSON") from None
    if not isinstance(doc, dict):
        raise ValueError("not an object")
    return doc


def send_line(sock: socket.socket, obj: Dict[str, Any]) -> None:
    sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")


@command(
    takes={
        "root": "str",
        "models": Or(["any"], []),
        "chunk_size": Or("int", DEFAULT_CHUNK),
        "idle_timeout": Or("num", 120.0),
        "allow_missing": Opt("bool", False),
        "bind": Or("str", ""),
        "port": Or("int", 0),
        "hash_cache": Opt("bool", True),
    },
    answers={"port?": "int", "bytes_sent?": "int", "connections?": "int", "seconds?": "num"},
)
def serve_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """Serve the named models until told to stop, idle for `idle_timeout`, or killed."""
    root = args["root"]
    chunk_size = args["chunk_size"]
    idle = args["idle_timeout"]
    models, missing, real_paths = list_models(root, list(args["models"]), chunk_size)
    if missing and not args["allow_missing"]:
        raise AgentError(
            f"not in {root}: {', '.join(missing)} (it has: {', '.join(_available(root)) or 'nothing'})",
            "not_found",
        )
    port = args["port"]
    try:
        sock, bound = listen_on(args["bind"], port)
    except OSError as exc:
        raise AgentError(f"cannot listen on port {port}: {exc}", "listen_failed") from None
    port = sock.getsockname()[1]
    token = secrets.token_urlsafe(24)
    served = _Served(root, models, real_paths, token, chunk_size, idle, args["hash_cache"])
    start = time.monotonic()
    # With allow_missing, the controller starts this server while it plans (saving a round
    # trip) and turns a missing model into its own error; nothing is served for those.
    emit(
        {
            "event": "listening",
            "address": bound,
            "port": port,
            "token": token,
            "pid": os.getpid(),
            "models": models,
            "missing": missing,
            "available": _available(root) if missing else [],
        }
    )
    reason = served.serve(sock, served.handle)
    return {
        "reason": reason,
        "address": bound,
        "port": port,
        "bytes_sent": served.bytes_sent,
        "ranges": served.ranges,
        "connections": served.connections,
        "refused": served.refused,
        "peers": sorted(served.peers),
        "hash_files_cached": served.cached_files,
        "seconds": round(time.monotonic() - start, 3),
    }
