"""Host side of `labctl cache`: the RAM model cache's manifest, and host-to-host model copies.

A copy runs between two hosts and never through the controller:

- the storage host runs `cache_serve`: it lists the requested models under its storage folder,
  listens on its own address, announces one JSON line (port and a random one-time token) on
  stderr, then serves byte ranges of exactly those files to clients that present the token,
  hashing each range as it sends it and appending the sha256. It stops when a client asks it
  to, when nothing has happened for `idle_timeout` seconds, or when its SSH channel closes
  (labctl's watchdog kills it);
- the cache host runs `cache_pull`: N parallel TCP streams (separate flows, so a bond hashing
  layer3+4 spreads them over its members) fetch fixed-size chunks into a partial copy inside
  the cache, check every chunk's sha256, and record each verified chunk so a stopped copy
  resumes. Only a model whose every chunk is verified is renamed into place and entered in the
  manifest: the manifest never lists a model that is incomplete.

Layout of a cache (model_cache.path):

    <cache>/<model>                       complete, verified models (a file or a folder)
    <cache>/.labctl/manifest.json         per model: files, sizes, chunk hashes, source, times, pinned
    <cache>/.labctl/partial/<model>       a model being copied, in its final shape
    <cache>/.labctl/state/<model>.json    the partial copy's verified chunks
    <cache>/.labctl/{sync,manifest}.lock  flock files

The storage side caches chunk hashes in <models>/.labctl/hashes/<model>.json, keyed by each
file's size, mtime and the chunk size, when it may write there.

Stdlib only; runs on the host's own Python 3.8+.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import shutil
import signal
import socket
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Set, Tuple

from . import paths
from .commands import AgentError

META = paths.CACHE_META
MANIFEST_VERSION = 1
DEFAULT_CHUNK = 64 << 20
BLOCK = 1 << 20  # bytes moved per read/hash/send step: big enough that Python's overhead vanishes
PAGE = 4096  # tmpfs allocates whole pages
MAX_LINE = 1 << 16
MAX_RANGE = 1 << 30
GIB = 1 << 30
PROTOCOL = 1


# ---------------------------------------------------------------------------------------------
# Pure helpers (also imported by the controller's planning code)


def chunk_ranges(size: int, chunk_size: int) -> List[Tuple[int, int]]:
    """(offset, length) of each chunk of a file of `size` bytes; an empty file has none."""
    if chunk_size <= 0:
        raise ValueError("chunk_size must be positive")
    return [(off, min(chunk_size, size - off)) for off in range(0, size, chunk_size)]


def page_round(n: int) -> int:
    return -(-n // PAGE) * PAGE


def check_name(name: Any) -> str:
    """A model is a file or folder directly inside the storage folder: one plain path component."""
    bad = (
        not isinstance(name, str)
        or not name
        or name.startswith(".")
        or "/" in name
        or "\0" in name
        or "\n" in name
        or len(name.encode("utf-8", "replace")) > 255
    )
    if bad:
        raise AgentError(
            f"{name!r} is not a model name: give the name of a file or folder directly inside the "
            "storage folder (no '/', not starting with '.')",
            "bad_name",
        )
    return name


def _inside(path: str, root: str) -> bool:
    return path != root and path.startswith(root.rstrip("/") + "/")


def _now() -> float:
    return round(time.time(), 3)


def _write_json(path: str, obj: Any) -> None:
    """Replace `path` atomically: readers see the old document or the new one, never half."""
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, sort_keys=True, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _read_json(path: str) -> Optional[Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def _flock(path: str, blocking: bool = True) -> Iterator[int]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        yield fd
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _emit(event: Dict[str, Any]) -> None:
    """One JSON line on stderr: the controller reads these while the command runs."""
    sys.stderr.write(json.dumps(event, sort_keys=True, separators=(",", ":")) + "\n")
    sys.stderr.flush()


def _rmtree(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _hash_range(path: str, offset: int, length: int, buf: memoryview) -> Optional[str]:
    """sha256 of `length` bytes at `offset`, or None when the file is shorter."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        left = length
        while left:
            n = f.readinto(buf[: min(len(buf), left)])
            if not n:
                return None
            h.update(buf[:n])
            left -= n
    return h.hexdigest()


def _disk_bytes(path: str) -> int:
    """Bytes a file or tree really occupies (sparse partial files count only written pages)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    if not os.path.isdir(path) or os.path.islink(path):
        return st.st_blocks * 512
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


# ---------------------------------------------------------------------------------------------
# The cache: paths, manifest, capacity


class Cache:
    def __init__(self, path: str, create: bool = True) -> None:
        if not isinstance(path, str) or not path.startswith("/"):
            raise AgentError(f"the cache path {path!r} is not absolute", "bad_args")
        self.path = path.rstrip("/") or "/"
        if not os.path.isdir(self.path):
            raise AgentError(f"the model cache {self.path} does not exist on this host", "no_cache")
        self.meta = os.path.join(self.path, META)
        if create:
            for sub in ("", "partial", "state", "trash"):
                os.makedirs(os.path.join(self.meta, sub), exist_ok=True)

    def model_path(self, name: str) -> str:
        return os.path.join(self.path, name)

    def partial_path(self, name: str) -> str:
        return os.path.join(self.meta, "partial", name)

    def state_path(self, name: str) -> str:
        return os.path.join(self.meta, "state", name + ".json")

    def file_path(self, rel: str, partial: bool = False) -> str:
        base = os.path.join(self.meta, "partial") if partial else self.path
        return os.path.join(base, *rel.split("/"))

    @property
    def manifest_path(self) -> str:
        return os.path.join(self.meta, "manifest.json")

    def load_manifest(self) -> Dict[str, Any]:
        try:
            doc = _read_json(self.manifest_path)
        except ValueError as exc:
            raise AgentError(
                f"{self.manifest_path} is not valid JSON ({exc}); it is always written whole, so "
                "something else wrote it",
                "bad_manifest",
            ) from None
        if not isinstance(doc, dict) or not isinstance(doc.get("models"), dict):
            doc = {"version": MANIFEST_VERSION, "models": {}}
        return doc

    def models(self) -> Dict[str, Dict[str, Any]]:
        models: Dict[str, Dict[str, Any]] = self.load_manifest()["models"]
        return models

    def update(self, fn: Callable[[Dict[str, Dict[str, Any]]], Any]) -> Any:
        """Read-modify-write the manifest under its lock (the loader touches it concurrently)."""
        with _flock(os.path.join(self.meta, "manifest.lock")):
            doc = self.load_manifest()
            out = fn(doc["models"])
            doc["version"] = MANIFEST_VERSION
            _write_json(self.manifest_path, doc)
            return out

    @contextlib.contextmanager
    def sync_lock(self) -> Iterator[None]:
        path = os.path.join(self.meta, "sync.lock")
        try:
            with _flock(path, blocking=False) as fd:
                os.ftruncate(fd, 0)
                os.write(fd, str(os.getpid()).encode())
                yield
        except BlockingIOError:
            try:
                with open(path) as f:
                    pid = f.read().strip()
            except OSError:
                pid = "?"
            raise AgentError(
                f"another labctl cache sync or verify (pid {pid}) is working on {self.path}; "
                "wait for it to finish",
                "busy",
            ) from None

    def mount(self) -> Optional[Dict[str, Any]]:
        real = os.path.realpath(self.path)
        found = None
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[1].replace("\\040", " ") == real:
                    found = {"device": parts[0], "fstype": parts[2]}
        return found

    def space(self, size_gb: Optional[float]) -> Dict[str, Any]:
        """Capacity, used and free bytes: the mount's own (a tmpfs) or, for a plain folder,
        the inventory's size_gb less what the folder holds."""
        sv = os.statvfs(self.path)
        mount = self.mount()
        if mount is not None:
            cap = sv.f_blocks * sv.f_frsize
            used = (sv.f_blocks - sv.f_bfree) * sv.f_frsize
            free = sv.f_bavail * sv.f_frsize
        else:
            cap = int(size_gb * GIB) if size_gb else sv.f_blocks * sv.f_frsize
            used = _disk_bytes(self.path)
            free = max(0, min(cap - used, sv.f_bavail * sv.f_frsize))
        return {
            "mounted": mount is not None,
            "fstype": (mount or {}).get("fstype"),
            "capacity_bytes": cap,
            "used_bytes": used,
            "free_bytes": free,
        }

    def remove(self, name: str) -> int:
        """Take a model out of the manifest, then off the disk; returns the bytes freed."""
        path = self.model_path(name)
        freed = _disk_bytes(path)
        self.update(lambda models: models.pop(name, None))
        if os.path.lexists(path):
            trash = os.path.join(self.meta, "trash", f"{name}.{os.getpid()}.{time.monotonic_ns()}")
            os.rename(path, trash)  # the name disappears at once; the bytes go next
            _rmtree(trash)
        return freed

    def empty_trash(self) -> None:
        """Finish removals a crash interrupted (callers hold the sync lock)."""
        trash = os.path.join(self.meta, "trash")
        for n in os.listdir(trash) if os.path.isdir(trash) else []:
            _rmtree(os.path.join(trash, n))

    def remove_partial(self, name: str) -> int:
        freed = _disk_bytes(self.partial_path(name))
        _rmtree(self.partial_path(name))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.state_path(name))
        return freed


def _public(entry: Dict[str, Any]) -> Dict[str, Any]:
    """A manifest entry without its chunk hashes (which can run to thousands)."""
    out = {k: v for k, v in entry.items() if k != "files"}
    out["files"] = [{k: v for k, v in f.items() if k != "chunks"} for f in entry.get("files", [])]
    return out


def _load_state(cache: Cache, name: str) -> Optional[Dict[str, Any]]:
    try:
        doc = _read_json(cache.state_path(name))
    except ValueError:
        return None  # a torn state cannot happen (atomic writes); if it does, start over
    return doc if isinstance(doc, dict) and isinstance(doc.get("files"), dict) else None


def state_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """What a cache holds and how much room it has; the controller plans from this."""
    path = args.get("cache")
    if isinstance(path, str) and path.startswith("/") and not os.path.isdir(path):
        return {"cache": path, "exists": False}  # the controller says how to provision it
    cache = Cache(args["cache"], create=False)
    space = cache.space(args.get("size_gb"))
    models = {}
    for name, entry in cache.models().items():
        item = _public(entry)
        path = cache.model_path(name)
        item["present"] = os.path.lexists(path)
        item["disk_bytes"] = _disk_bytes(path)
        models[name] = item
    partials = []
    part_dir = os.path.join(cache.meta, "partial")
    names = set(os.listdir(part_dir)) if os.path.isdir(part_dir) else set()
    state_dir = os.path.join(cache.meta, "state")
    if os.path.isdir(state_dir):
        names |= {n[: -len(".json")] for n in os.listdir(state_dir) if n.endswith(".json")}
    for name in sorted(names):
        st = _load_state(cache, name) or {"files": {}}
        total = sum(int(f.get("size", 0)) for f in st["files"].values())
        cs = int(st.get("chunk_size") or DEFAULT_CHUNK)
        done = 0
        for f in st["files"].values():
            ranges = chunk_ranges(int(f.get("size", 0)), cs)
            done += sum(ranges[int(i)][1] for i in f.get("done", {}) if int(i) < len(ranges))
        try:
            mtime = os.stat(cache.state_path(name)).st_mtime
        except OSError:
            mtime = 0.0
        partials.append(
            {
                "name": name,
                "total_bytes": total,
                "done_bytes": done,
                "disk_bytes": _disk_bytes(cache.partial_path(name)),
                "chunk_size": cs,
                "files": {
                    p: {"size": f.get("size"), "mtime_ns": f.get("mtime_ns")} for p, f in st["files"].items()
                },
                "source": st.get("source"),
                "updated": mtime,
            }
        )
    untracked = sorted(n for n in os.listdir(cache.path) if n != META and n not in models)
    return {
        "cache": cache.path,
        "exists": True,
        **space,
        "models": models,
        "partials": partials,
        "untracked": untracked,
        "now": _now(),
    }


# ---------------------------------------------------------------------------------------------
# The storage side: listing and serving


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
        if not _inside(real, real_root):
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
                    if not _inside(target, real_root):
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
    try:
        doc = _read_json(_hash_cache_path(root, name))
    except (ValueError, OSError):
        return {}
    return doc.get("files", {}) if isinstance(doc, dict) else {}


def _available(root: str, limit: int = 40) -> List[str]:
    try:
        return sorted(n for n in os.listdir(root) if not n.startswith("."))[:limit]
    except OSError:
        return []


def list_command(args: Dict[str, Any]) -> Dict[str, Any]:
    root = args["root"]
    chunk_size = int(args.get("chunk_size") or DEFAULT_CHUNK)
    models, missing, _ = list_models(root, list(args.get("models") or []), chunk_size)
    for m in models.values():
        for f in m["files"]:
            f["hashed"] = "chunks" in f
            f.pop("chunks", None)
    return {"root": root, "models": models, "missing": missing, "available": _available(root)}


class _Served:
    """The serving state shared by the connection threads."""

    def __init__(
        self,
        root: str,
        models: Dict[str, Dict[str, Any]],
        real_paths: Dict[str, str],
        token: str,
        chunk_size: int,
        idle_timeout: float,
    ) -> None:
        self.root = root
        self.models = models
        self.files = {f["path"]: f for m in models.values() for f in m["files"]}
        self.real = real_paths
        self.token = token
        self.chunk_size = chunk_size
        self.idle_timeout = idle_timeout
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.active = 0
        self.last = time.monotonic()
        self.bytes_sent = 0
        self.ranges = 0
        self.connections = 0
        self.refused = 0
        self.peers: Set[str] = set()
        self.hashes: Dict[str, Dict[int, str]] = {}
        self.cached_files = 0
        self.listener: Optional[socket.socket] = None

    def touch(self) -> None:
        self.last = time.monotonic()

    def handle(self, conn: socket.socket, peer: str) -> None:
        with self.lock:
            self.active += 1
            self.connections += 1
        files: Dict[str, Any] = {}
        try:
            # A client that stops talking must not keep the server (and its idle clock) for ever.
            conn.settimeout(max(30.0, self.idle_timeout))
            rf = conn.makefile("rb")
            hello = _read_line(rf)
            if hello is None or not hmac.compare_digest(str(hello.get("token", "")), self.token):
                with self.lock:
                    self.refused += 1
                _send_line(conn, {"ok": False, "error": "bad token"})
                return
            with self.lock:
                self.peers.add(peer)
            _send_line(conn, {"ok": True, "protocol": PROTOCOL})
            buf = memoryview(bytearray(BLOCK))
            while not self.stop.is_set():
                req = _read_line(rf)
                if req is None:
                    return
                self.touch()
                op = req.get("op")
                if op == "shutdown":
                    _send_line(conn, {"ok": True})
                    self.stop.set()
                    if self.listener is not None:
                        # Wakes the accept() in serve_command at once instead of at its timeout.
                        with contextlib.suppress(OSError):
                            self.listener.shutdown(socket.SHUT_RDWR)
                    return
                if op != "get":
                    _send_line(conn, {"ok": False, "error": f"unknown op {op!r}"})
                    return
                if not self._send_range(conn, req, files, buf):
                    return
        except (OSError, ValueError):
            return  # the client went away; it retries or reports on its side
        finally:
            for f in files.values():
                f.close()
            conn.close()
            with self.lock:
                self.active -= 1
            self.touch()

    def _send_range(
        self, conn: socket.socket, req: Dict[str, Any], files: Dict[str, Any], buf: memoryview
    ) -> bool:
        path, offset, length = req.get("path"), req.get("offset"), req.get("length")
        meta = self.files.get(path) if isinstance(path, str) else None
        # Only files of the listed models, so a client cannot name /etc/shadow or ../x.
        if meta is None or not isinstance(offset, int) or not isinstance(length, int):
            _send_line(conn, {"ok": False, "error": f"not served here: {path!r}"})
            return False
        if offset < 0 or length <= 0 or length > MAX_RANGE or offset + length > meta["size"]:
            _send_line(conn, {"ok": False, "error": f"bad range {offset}+{length} of {path}"})
            return False
        assert isinstance(path, str)
        f = files.get(path)
        if f is None:
            # Kept open for the connection's next ranges; handle() closes them all.
            f = files[path] = open(self.real[path], "rb", buffering=0)  # noqa: SIM115
        st = os.fstat(f.fileno())
        if st.st_size != meta["size"] or st.st_mtime_ns != meta["mtime_ns"]:
            _send_line(
                conn, {"ok": False, "error": f"{path} changed on the storage host since it was listed"}
            )
            return False
        _send_line(conn, {"ok": True, "length": length})
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
        _send_line(conn, {"sha256": digest})
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
                self._save_hashes(path)

    def _save_hashes(self, path: str) -> None:
        name = path.split("/")[0]
        meta = self.files[path]
        target = _hash_cache_path(self.root, name)
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            doc = _read_json(target) or {}
            files = doc.get("files", {}) if isinstance(doc, dict) else {}
            files[path] = {
                "size": meta["size"],
                "mtime_ns": meta["mtime_ns"],
                "chunk_size": self.chunk_size,
                "chunks": meta["chunks"],
            }
            _write_json(target, {"files": files})
            self.cached_files += 1
        except (OSError, ValueError):
            pass  # a read-only library still serves; it just hashes again next time


def _read_line(rf: Any) -> Optional[Dict[str, Any]]:
    line = rf.readline(MAX_LINE)
    if not line:
        return None
    doc = json.loads(line)
    if not isinstance(doc, dict):
        raise ValueError("not an object")
    return doc


def _send_line(sock: socket.socket, obj: Dict[str, Any]) -> None:
    sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")


def _listen(bind: str, port: int) -> Tuple[socket.socket, str]:
    """Listen on the host's inventory address (the network the copy is meant to use); fall back
    to every address when that one is not on this host (NAT, a name resolving elsewhere)."""
    candidates: List[Tuple[Any, str]] = []
    if bind:
        try:
            for fam, _t, _p, _c, sa in socket.getaddrinfo(bind, port, 0, socket.SOCK_STREAM):
                candidates.append((fam, str(sa[0])))
        except socket.gaierror:
            pass
    candidates.append((socket.AF_INET, "0.0.0.0"))
    last: Optional[OSError] = None
    for fam, addr in candidates:
        s = socket.socket(fam, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((addr, port))
            s.listen(64)
            return s, addr
        except OSError as exc:
            s.close()
            last = exc
    raise AgentError(f"cannot listen on port {port}: {last}", "listen_failed")


def serve_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """Serve the named models until told to stop, idle for `idle_timeout`, or killed."""
    root = args["root"]
    chunk_size = int(args.get("chunk_size") or DEFAULT_CHUNK)
    idle = float(args.get("idle_timeout") or 120)
    models, missing, real_paths = list_models(root, list(args.get("models") or []), chunk_size)
    if missing and not args.get("allow_missing"):
        raise AgentError(
            f"not in {root}: {', '.join(missing)} (it has: {', '.join(_available(root)) or 'nothing'})",
            "not_found",
        )
    sock, bound = _listen(str(args.get("bind") or ""), int(args.get("port") or 0))
    port = sock.getsockname()[1]
    token = secrets.token_urlsafe(24)
    served = _Served(root, models, real_paths, token, chunk_size, idle)
    served.listener = sock
    start = time.monotonic()
    # With allow_missing, the controller starts this server while it plans (saving a round
    # trip) and turns a missing model into its own error; nothing is served for those.
    _emit(
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
    sock.settimeout(0.5)
    reason = "shutdown"
    try:
        while not served.stop.is_set():
            try:
                conn, addr = sock.accept()
            except socket.timeout:  # noqa: UP041 (on Python < 3.10 it is not TimeoutError)
                if served.active == 0 and time.monotonic() - served.last > idle:
                    reason = "idle"
                    break
                continue
            except OSError:
                if served.stop.is_set():
                    break  # shut down by a client's "shutdown" (see _Served.handle)
                raise
            served.touch()
            threading.Thread(target=served.handle, args=(conn, str(addr[0])), daemon=True).start()
    finally:
        sock.close()
    deadline = time.monotonic() + 10
    while served.active and time.monotonic() < deadline:
        time.sleep(0.05)
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


# ---------------------------------------------------------------------------------------------
# The cache side: pulling


class _Transfer(Exception):
    pass


class _Plan:
    """One model's copy: its files, the chunks still to fetch, and what a resume kept."""

    def __init__(self, cache: Cache, model: Dict[str, Any], chunk_size: int, source: str) -> None:
        self.name = check_name(model["name"])
        self.kind = model.get("kind", "dir")
        self.files: List[Dict[str, Any]] = model["files"]
        for f in self.files:
            rel = f["path"]
            if not (rel == self.name or rel.startswith(self.name + "/")) or ".." in rel.split("/"):
                raise AgentError(f"file {rel!r} is not inside model {self.name!r}", "bad_args")
        self.source = source
        self.cache = cache
        # The chunk size the storage host's cached hashes (if any) were computed with.
        self.listed_chunk_size = int(model.get("chunk_size") or chunk_size)
        old = _load_state(cache, self.name)
        # A resumed copy keeps the chunk size it started with, so its verified chunks still count.
        self.chunk_size = int(old.get("chunk_size") or chunk_size) if old else chunk_size
        # pinned/last_used of a model `cache verify` took apart for repair, restored on commit.
        self.keep: Dict[str, Any] = dict((old or {}).get("keep") or {})
        self.state: Dict[str, Any] = {
            "model": self.name,
            "kind": self.kind,
            "chunk_size": self.chunk_size,
            "source": source,
            "keep": self.keep,
            "files": {},
        }
        self.tasks: List[Tuple[str, int, int, int]] = []  # (path, index, offset, length)
        self.bytes = sum(int(f["size"]) for f in self.files)
        self.resumed_bytes = 0
        self.resumed_chunks = 0
        self.fetched_bytes = 0
        self.fetched_chunks = 0
        self.expected: Dict[str, List[Optional[str]]] = {}
        self.fds: Dict[str, int] = {}
        self.committed = False
        self._old = old

    def prepare(self, buf: memoryview) -> None:
        """Re-verify what an earlier run kept, drop what no longer matches, list what is left."""
        cache, part = self.cache, self.cache.partial_path(self.name)
        want_dir = self.kind == "dir"
        if os.path.lexists(part) and (os.path.isdir(part) and not os.path.islink(part)) != want_dir:
            _rmtree(part)
        old_files = (self._old or {}).get("files", {})
        wanted = {f["path"] for f in self.files}
        if want_dir and os.path.isdir(part):
            for dirpath, _dirs, names in os.walk(part):
                for n in names:
                    full = os.path.join(dirpath, n)
                    rel = self.name + "/" + os.path.relpath(full, part).replace(os.sep, "/")
                    if rel not in wanted:
                        os.unlink(full)  # the source no longer has it
        for f in self.files:
            rel, size = f["path"], int(f["size"])
            ranges = chunk_ranges(size, self.chunk_size)
            known = f.get("chunks") if self.listed_chunk_size == self.chunk_size else None
            if not known or len(known) != len(ranges):
                known = None
            self.expected[rel] = list(known) if known else [None] * len(ranges)
            ppath = cache.file_path(rel, partial=True)
            prev = old_files.get(rel)
            done: Dict[str, str] = {}
            if (
                isinstance(prev, dict)
                and prev.get("size") == size
                and prev.get("mtime_ns") == f.get("mtime_ns")
                and os.path.isfile(ppath)
            ):
                for key, sha in (prev.get("done") or {}).items():
                    idx = int(key)
                    if idx >= len(ranges) or (known and known[idx] != sha):
                        continue
                    off, length = ranges[idx]
                    if _hash_range(ppath, off, length, buf) == sha:
                        done[str(idx)] = sha
                        self.resumed_bytes += length
                        self.resumed_chunks += 1
            self.state["files"][rel] = {"size": size, "mtime_ns": f.get("mtime_ns"), "done": done}
            for idx, (off, length) in enumerate(ranges):
                if str(idx) not in done:
                    self.tasks.append((rel, idx, off, length))

    def need_bytes(self) -> int:
        """Space still to allocate: whole pages of every file less what the partial copy holds."""
        need = 0
        for f in self.files:
            ppath = self.cache.file_path(f["path"], partial=True)
            need += max(0, page_round(int(f["size"])) - _disk_bytes(ppath))
        return need

    def open_files(self) -> None:
        for f in self.files:
            ppath = self.cache.file_path(f["path"], partial=True)
            os.makedirs(os.path.dirname(ppath), exist_ok=True)
            fd = os.open(ppath, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(fd).st_size != int(f["size"]):
                os.ftruncate(fd, int(f["size"]))  # holes cost nothing until written
            self.fds[f["path"]] = fd

    def close_files(self) -> None:
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()

    def complete(self) -> bool:
        for f in self.files:
            st = self.state["files"][f["path"]]
            if len(st["done"]) != len(chunk_ranges(int(f["size"]), self.chunk_size)):
                return False
        return True

    def commit(self) -> None:
        """Every chunk verified: rename the copy into place, then list it in the manifest."""
        cache = self.cache
        for f in self.files:
            ppath = cache.file_path(f["path"], partial=True)
            if os.path.getsize(ppath) != int(f["size"]):
                raise AgentError(f"{ppath} has the wrong size after the copy", "size_mismatch")
        part, dest = cache.partial_path(self.name), cache.model_path(self.name)
        if self.kind == "dir" and not os.path.exists(part):
            os.makedirs(part)  # a folder model with no files is still a model
        old = cache.models().get(self.name, {})
        trash = None
        if os.path.lexists(dest):
            trash = os.path.join(cache.meta, "trash", f"{self.name}.{os.getpid()}.{time.monotonic_ns()}")
            os.rename(dest, trash)
        os.rename(part, dest)
        now = _now()
        files = []
        for f in self.files:
            st = self.state["files"][f["path"]]
            n = len(chunk_ranges(int(f["size"]), self.chunk_size))
            files.append(
                {
                    "path": f["path"],
                    "size": int(f["size"]),
                    "mtime_ns": f.get("mtime_ns"),
                    "chunks": [st["done"][str(i)] for i in range(n)],
                }
            )
        entry = {
            "name": self.name,
            "kind": self.kind,
            "files": files,
            "bytes": self.bytes,
            "chunk_size": self.chunk_size,
            "hash": "sha256",
            "source": f"{self.source}/{self.name}",
            "synced_at": now,
            "verified_at": now,
            "last_used": old.get("last_used") or self.keep.get("last_used") or now,
            "pinned": bool(old.get("pinned", self.keep.get("pinned", False))),
        }

        def put(models: Dict[str, Dict[str, Any]]) -> None:
            models[self.name] = entry

        cache.update(put)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(cache.state_path(self.name))
        if trash:
            _rmtree(trash)
        self.committed = True

    def summary(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "bytes": self.bytes,
            "chunk_size": self.chunk_size,
            "chunks": sum(len(chunk_ranges(int(f["size"]), self.chunk_size)) for f in self.files),
            "fetched_bytes": self.fetched_bytes,
            "fetched_chunks": self.fetched_chunks,
            "resumed_bytes": self.resumed_bytes,
            "resumed_chunks": self.resumed_chunks,
            "committed": self.committed,
            "path": self.cache.model_path(self.name),
        }


class _Puller:
    """N streams taking chunks off one queue; each stream is its own TCP connection."""

    def __init__(
        self,
        plans: List[_Plan],
        address: str,
        port: int,
        token: str,
        streams: int,
        stop_after: int,
    ) -> None:
        self.plans = {p.name: p for p in plans}
        self.queue: Deque[Tuple[_Plan, Tuple[str, int, int, int]]] = deque(
            (p, t) for p in plans for t in p.tasks
        )
        self.address = address
        self.port = port
        self.token = token
        self.streams = max(1, min(streams, len(self.queue)))
        self.stop_after = stop_after
        self.lock = threading.Lock()
        self.state_lock = threading.Lock()
        self.abort = threading.Event()
        self.errors: List[str] = []
        self.fetched = 0
        self.chunks = 0
        self.retries = 0

    def connect(self) -> Tuple[socket.socket, Any]:
        try:
            sock = socket.create_connection((self.address, self.port), timeout=30)
        except OSError as exc:
            raise _Transfer(
                f"cannot connect to the storage host at {self.address}:{self.port}: {exc.strerror or exc}"
            ) from None
        sock.settimeout(120)  # a stalled source fails the copy instead of hanging it
        rf = sock.makefile("rb", buffering=BLOCK)
        _send_line(sock, {"token": self.token, "protocol": PROTOCOL})
        hello = _read_line(rf)
        if not hello or not hello.get("ok"):
            raise _Transfer(
                f"the storage host refused the connection: {(hello or {}).get('error', 'closed')}"
            )
        return sock, rf

    def worker(self) -> None:
        sock = None
        try:
            sock, rf = self.connect()
            buf = memoryview(bytearray(BLOCK))
            while not self.abort.is_set():
                with self.lock:
                    if not self.queue:
                        return
                    plan, task = self.queue.popleft()
                for attempt in range(3):
                    try:
                        self.fetch(sock, rf, buf, plan, task)
                        break
                    except _Mismatch as exc:
                        if attempt == 2:
                            raise _Transfer(str(exc)) from None
                        with self.lock:
                            self.retries += 1
        except _Transfer as exc:
            self.fail(str(exc))
        except (OSError, ValueError) as exc:
            self.fail(f"the connection to {self.address}:{self.port} broke: {exc}")
        finally:
            if sock is not None:
                sock.close()

    def fail(self, message: str) -> None:
        with self.lock:
            self.errors.append(message)
        self.abort.set()

    def fetch(
        self, sock: socket.socket, rf: Any, buf: memoryview, plan: _Plan, task: Tuple[str, int, int, int]
    ) -> None:
        rel, idx, offset, length = task
        _send_line(sock, {"op": "get", "path": rel, "offset": offset, "length": length})
        head = _read_line(rf)
        if head is None:
            raise _Transfer("the storage host closed the connection")
        if not head.get("ok"):
            raise _Transfer(f"the storage host refused {rel}: {head.get('error')}")
        fd = plan.fds[rel]
        h = hashlib.sha256()
        pos, left = offset, length
        while left:
            n = rf.readinto(buf[: min(BLOCK, left)])
            if not n:
                raise _Transfer(f"the storage host stopped sending {rel} at byte {pos}")
            h.update(buf[:n])
            view = buf[:n]
            while view:
                w = os.pwrite(fd, view, pos)
                view = view[w:]
                pos += w
            left -= n
            with self.lock:
                self.fetched += n
        tail = _read_line(rf)
        digest = h.hexdigest()
        if tail is None or tail.get("sha256") != digest:
            raise _Mismatch(f"chunk {idx} of {rel} arrived damaged (sha256 differs from the sender's)")
        expected = plan.expected[rel][idx]
        if expected is not None and expected != digest:
            raise _Transfer(
                f"chunk {idx} of {rel} on the storage host no longer matches its cached hash; "
                "the file changed there without a new mtime. Run the sync again: the hashes are rebuilt"
            )
        with self.state_lock:
            plan.state["files"][rel]["done"][str(idx)] = digest
            plan.fetched_bytes += length
            plan.fetched_chunks += 1
            # Recorded only after the chunk's bytes are written and verified: a crash at any point
            # leaves a state that the next run can trust (it re-verifies anyway).
            _write_json(plan.cache.state_path(plan.name), plan.state)
            with self.lock:
                self.chunks += 1
                chunks = self.chunks
        if self.stop_after and chunks >= self.stop_after:
            # Test hook (LABCTL_CACHE_TEST_STOP_AFTER on the controller): die as a crash would,
            # with no cleanup, to prove that an interrupted copy resumes.
            os.kill(os.getpid(), signal.SIGKILL)


class _Mismatch(Exception):
    pass


def _read_token(args: Dict[str, Any]) -> str:
    if args.get("token_file"):
        path = str(args["token_file"])
        try:
            with open(path) as f:
                token = f.read().strip()
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return token
    return str(args.get("token") or "")


def _shutdown_source(address: str, port: int, token: str) -> None:
    try:
        with socket.create_connection((address, port), timeout=5) as s:
            s.settimeout(5)
            rf = s.makefile("rb")
            _send_line(s, {"token": token})
            if _read_line(rf):
                _send_line(s, {"op": "shutdown"})
                _read_line(rf)
    except (OSError, ValueError):
        pass  # the controller closes the server's channel anyway


def pull_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """Evict what the controller planned, then copy the models from the storage host."""
    cache = Cache(args["cache"])
    address, port = str(args["address"]), int(args["port"])
    token = _read_token(args)
    chunk_size = int(args.get("chunk_size") or DEFAULT_CHUNK)
    streams = max(1, int(args.get("streams") or 2))
    source = str(args.get("source") or f"{address}:{port}")
    stop_after = int(args.get("stop_after_chunks") or 0)
    started = time.monotonic()
    try:
        with cache.sync_lock():
            result = _pull_locked(cache, args, address, port, token, chunk_size, streams, source, stop_after)
    finally:
        if args.get("shutdown_source", True):
            _shutdown_source(address, port, token)
    result["seconds_total"] = round(time.monotonic() - started, 3)
    return result


def _pull_locked(
    cache: Cache,
    args: Dict[str, Any],
    address: str,
    port: int,
    token: str,
    chunk_size: int,
    streams: int,
    source: str,
    stop_after: int,
) -> Dict[str, Any]:
    buf = memoryview(bytearray(BLOCK))
    t0 = time.monotonic()
    cache.empty_trash()
    plans = [_Plan(cache, m, chunk_size, source) for m in args.get("models") or []]
    for p in plans:
        p.prepare(buf)
    verify_s = time.monotonic() - t0
    need = sum(p.need_bytes() for p in plans)
    space = cache.space(args.get("size_gb"))
    manifest = cache.models()
    evict = [n for n in args.get("evict") or [] if n in manifest and not manifest[n].get("pinned")]
    stale = [n for n in args.get("evict_partials") or [] if n not in {p.name for p in plans}]
    can_free = sum(_disk_bytes(cache.model_path(n)) for n in evict)
    can_free += sum(_disk_bytes(cache.partial_path(n)) for n in stale)
    if need > space["free_bytes"] + can_free:
        raise AgentError(
            f"{cache.path} needs {need} more bytes for {', '.join(p.name for p in plans)} but has "
            f"{space['free_bytes']} free and the planned evictions free {can_free}; nothing was copied",
            "cache_full",
        )
    evicted = []
    for n in stale:
        evicted.append({"name": n, "bytes": cache.remove_partial(n), "partial": True})
    for n in evict:
        if space["free_bytes"] + sum(e["bytes"] for e in evicted) >= need:
            break  # the controller planned from older numbers: evict no more than needed
        evicted.append({"name": n, "bytes": cache.remove(n)})
    free = cache.space(args.get("size_gb"))["free_bytes"]
    if need > free:
        raise AgentError(
            f"{cache.path} needs {need} more bytes but has {free} free; nothing was copied", "cache_full"
        )
    total = sum(p.bytes for p in plans)
    base = sum(p.resumed_bytes for p in plans)
    to_fetch = sum(length for p in plans for (_r, _i, _o, length) in p.tasks)
    puller = _Puller(plans, address, port, token, streams, stop_after)
    for p in plans:
        p.open_files()
        with puller.state_lock:
            _write_json(cache.state_path(p.name), p.state)
    t1 = time.monotonic()
    threads = [threading.Thread(target=puller.worker, daemon=True) for _ in range(puller.streams)]
    if puller.queue:
        for t in threads:
            t.start()
    else:
        threads = []

    def progress(final: bool = False) -> None:
        _emit(
            {
                "event": "progress",
                "done": base + puller.fetched,
                "total": total,
                "fetched": puller.fetched,
                "to_fetch": to_fetch,
                "resumed": base,
                "elapsed": round(time.monotonic() - t1, 3),
                "final": final,
            }
        )

    progress()
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(0.25)
            if t.is_alive():
                break
        progress()
    transfer_s = time.monotonic() - t1
    progress(final=True)
    for p in plans:
        p.close_files()
    for p in plans:
        if p.complete():
            p.commit()
    if puller.errors:
        kept = sum(len(f["done"]) for p in plans if not p.committed for f in p.state["files"].values())
        done_models = [p.name for p in plans if p.committed]
        raise AgentError(
            f"{puller.errors[0]}; {kept} verified chunks are kept in {cache.meta}/partial"
            + (f" and {', '.join(done_models)} completed" if done_models else "")
            + "; run the sync again to resume",
            "transfer_failed",
        )
    return {
        "cache": cache.path,
        "source": source,
        "address": address,
        "port": port,
        "streams": puller.streams,
        "chunk_size": chunk_size,
        "models": [p.summary() for p in plans],
        "evicted": evicted,
        "fetched_bytes": puller.fetched,
        "resumed_bytes": base,
        "retries": puller.retries,
        "seconds": round(transfer_s, 3),
        "verify_seconds": round(verify_s, 3),
        "rate_bytes_per_s": round(puller.fetched / transfer_s) if transfer_s > 0 and puller.fetched else 0,
    }


# ---------------------------------------------------------------------------------------------
# Maintenance: evict, pin, touch, verify


def evict_command(args: Dict[str, Any]) -> Dict[str, Any]:
    cache = Cache(args["cache"])
    force = bool(args.get("force"))
    # Under the sync lock: a running copy must not lose its partial files or its planned room.
    with cache.sync_lock():
        cache.empty_trash()
        return _evict_locked(cache, list(args.get("models") or []), force)


def _evict_locked(cache: Cache, names: List[str], force: bool) -> Dict[str, Any]:
    models = cache.models()
    out: Dict[str, List[Any]] = {"evicted": [], "not_cached": [], "pinned": []}
    for name in names:
        check_name(name)
        entry = models.get(name)
        if entry is None:
            if os.path.lexists(cache.partial_path(name)) or os.path.exists(cache.state_path(name)):
                out["evicted"].append({"name": name, "bytes": cache.remove_partial(name), "partial": True})
            else:
                out["not_cached"].append(name)
            continue
        if entry.get("pinned") and not force:
            out["pinned"].append(name)
            continue
        out["evicted"].append({"name": name, "bytes": cache.remove(name)})
    return out


def pin_command(args: Dict[str, Any]) -> Dict[str, Any]:
    cache = Cache(args["cache"])
    name = check_name(args.get("model"))
    pinned = bool(args.get("pinned", True))

    def set_pin(models: Dict[str, Dict[str, Any]]) -> Optional[bool]:
        if name not in models:
            return None
        was = bool(models[name].get("pinned"))
        models[name]["pinned"] = pinned
        return was

    was = cache.update(set_pin)
    if was is None:
        raise AgentError(f"{name} is not in the cache {cache.path}", "not_cached")
    return {"model": name, "pinned": pinned, "changed": was != pinned}


def touch(cache_path: str, model: str) -> Optional[float]:
    """Mark `model` used now (LRU eviction goes by this); None when it is not cached.

    For the loader and benchmarks on the host: `from labctl.agent.cache import touch`.
    """
    cache = Cache(cache_path, create=False)
    name = check_name(model)
    now = _now()

    def mark(models: Dict[str, Dict[str, Any]]) -> Optional[float]:
        if name not in models:
            return None
        models[name]["last_used"] = now
        return now

    if name not in cache.models():
        return None  # no write (and no lock) for a model that is not cached
    when: Optional[float] = cache.update(mark)
    return when


def touch_path(path: str) -> Optional[float]:
    """`touch` for a file or folder inside a cache, found by walking up to the `.labctl` folder."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    while True:
        if os.path.isfile(os.path.join(parent, META, "manifest.json")):
            rel = os.path.relpath(path, parent)
            return touch(parent, rel.split(os.sep)[0])
        if parent in ("/", ""):
            return None
        parent = os.path.dirname(parent)


def touch_command(args: Dict[str, Any]) -> Dict[str, Any]:
    if args.get("path") and not args.get("cache"):
        when = touch_path(str(args["path"]))
        return {"path": args["path"], "touched": when is not None, "last_used": when}
    when = touch(str(args.get("cache")), str(args.get("model")))
    return {"model": args.get("model"), "touched": when is not None, "last_used": when}


def verify_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """Re-hash cached models against the manifest. With `repair`, a corrupt model leaves the
    manifest and goes back to the partial folder with its good chunks recorded, so the next
    sync fetches only the bad ones."""
    cache = Cache(args["cache"])
    repair = bool(args.get("repair", True))
    buf = memoryview(bytearray(BLOCK))
    results = []
    with cache.sync_lock():
        cache.empty_trash()
        models = cache.models()
        names = list(args.get("models") or sorted(models))
        for name in names:
            check_name(name)
            entry = models.get(name)
            if entry is None:
                results.append({"name": name, "status": "not_cached"})
                continue
            results.append(_verify_one(cache, entry, buf, repair))
    return {"cache": cache.path, "models": results}


def _verify_one(cache: Cache, entry: Dict[str, Any], buf: memoryview, repair: bool) -> Dict[str, Any]:
    name = entry["name"]
    cs = int(entry.get("chunk_size") or DEFAULT_CHUNK)
    start = time.monotonic()
    bad: List[Dict[str, Any]] = []
    state_files: Dict[str, Any] = {}
    checked = 0
    for f in entry.get("files", []):
        rel, size = f["path"], int(f["size"])
        path = cache.file_path(rel)
        ranges = chunk_ranges(size, cs)
        chunks = f.get("chunks") or []
        done: Dict[str, str] = {}
        bad_idx: List[int] = []
        actual = os.path.getsize(path) if os.path.isfile(path) else None
        for idx, (off, length) in enumerate(ranges):
            sha = _hash_range(path, off, length, buf) if actual is not None else None
            checked += length if sha else 0
            if sha is not None and idx < len(chunks) and sha == chunks[idx]:
                done[str(idx)] = sha
            else:
                bad_idx.append(idx)
        if actual is None or actual != size or bad_idx:
            bad.append({"path": rel, "chunks": bad_idx, "size": actual, "expected_size": size})
        state_files[rel] = {"size": size, "mtime_ns": f.get("mtime_ns"), "done": done}
    seconds = round(time.monotonic() - start, 3)
    if not bad:
        now = _now()

        def mark(models: Dict[str, Dict[str, Any]]) -> None:
            if name in models:
                models[name]["verified_at"] = now

        cache.update(mark)
        return {
            "name": name,
            "status": "ok",
            "bytes": entry.get("bytes"),
            "seconds": seconds,
            "verified_at": now,
        }
    out = {
        "name": name,
        "status": "corrupt",
        "bytes": entry.get("bytes"),
        "bad": bad,
        "bad_chunks": sum(len(b["chunks"]) for b in bad),
        "chunk_size": cs,
        "seconds": seconds,
        "moved_to_partial": False,
    }
    if repair:
        # Out of the manifest first: from here on nobody is told the model is usable.
        cache.update(lambda models: models.pop(name, None))
        cache.remove_partial(name)
        os.rename(cache.model_path(name), cache.partial_path(name))
        for b in bad:
            if b["size"] is not None and b["size"] != b["expected_size"]:
                os.truncate(cache.file_path(b["path"], partial=True), b["expected_size"])
        state = {
            "model": name,
            "kind": entry.get("kind", "dir"),
            "chunk_size": cs,
            "source": entry.get("source"),
            "keep": {"pinned": bool(entry.get("pinned")), "last_used": entry.get("last_used")},
            "files": state_files,
        }
        _write_json(cache.state_path(name), state)
        out["moved_to_partial"] = True
        out["pinned"] = bool(entry.get("pinned"))
    return out
