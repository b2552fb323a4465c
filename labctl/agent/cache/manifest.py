"""A model cache on this host: its layout, manifest and room, and the small commands on it.

`Cache` names every path of the layout (see the package's docstring) and owns the manifest,
read-modify-written under a lock because the loader touches it while a sync runs. The
helpers here (atomic JSON, chunk ranges, disk usage) serve the pull and verify as well.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ..core import paths
from ..core.errors import AgentError
from ..core.fsutil import write_json
from ..core.spec import NUMBER_OR_NULL, Opt, Or, command

# What this feature's answers share (labctl/agent/core/spec.py's shape language).
CACHE_FILE = {"path": "str", "size": "int", "mtime_ns?": "int?"}
CACHE_MODEL = {
    "name?": "str",
    "files?": [CACHE_FILE],
    "bytes?": "int?",
    "chunk_size?": "int?",
    "present?": "bool",
    "disk_bytes?": "int?",
    # What the host's manifest.json holds, as far as the agent checks it (a damaged one is set
    # aside there); the rest only shows.
    "last_used?": "num?",
    "verified_at?": "num?",
    "pinned?": "any",
    "source?": "any",
}
REPAIRS = ["str"]
EVICTED = [{"name": "str", "bytes": "int?", "partial?": "bool"}]

META = paths.CACHE_META
MANIFEST_VERSION = 1
DEFAULT_CHUNK = 64 << 20
BLOCK = 1 << 20  # bytes moved per read/hash/send step: big enough that Python's overhead vanishes
PAGE = 4096  # tmpfs allocates whole pages
GIB = 1 << 30


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
    """A model is a file or folder directly inside the storage folder: one plain path component
    (paths.component_problem), and not a hidden one: META lives there too."""
    problem = paths.component_problem(name)
    if problem is None and name.startswith("."):
        problem = "it starts with '.', as labctl's own files there do"
    if problem:
        raise AgentError(
            f"{name!r} is not a model name ({problem}): give the name of a file or folder directly inside "
            "the storage folder (no '/', not starting with '.')",
            "bad_name",
        )
    return name


def inside(path: str, root: str) -> bool:
    return path != root and path.startswith(root.rstrip("/") + "/")


def timestamp() -> float:
    return round(time.time(), 3)


def read_json(path: str) -> Optional[Any]:
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


def emit(event: Dict[str, Any]) -> None:
    """One JSON line on stderr: the controller reads these while the command runs."""
    sys.stderr.write(json.dumps(event, sort_keys=True, separators=(",", ":")) + "\n")
    sys.stderr.flush()


def rmtree(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def hash_range(path: str, offset: int, length: int, buf: memoryview) -> Optional[str]:
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


def disk_bytes(path: str) -> int:
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


def set_aside(path: str) -> str:
    """Rename a damaged file to PATH.damaged-TIME (kept for a person to look at); the new name."""
    base = "{}.damaged-{}".format(path, time.strftime("%Y%m%dT%H%M%S"))
    target, n = base, 1
    while os.path.lexists(target):
        n += 1
        target = f"{base}.{n}"
    os.rename(path, target)
    return target


def _empty_manifest() -> Dict[str, Any]:
    return {"version": MANIFEST_VERSION, "models": {}}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_time(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def entry_problem(name: Any, entry: Any) -> Optional[str]:
    """What makes a manifest entry unusable (None when it is sound): the shape pull writes."""
    if not isinstance(entry, dict):
        return f"is a {type(entry).__name__}, not an object"
    if entry.get("name") != name:
        return f"names {entry.get('name')!r}"
    files = entry.get("files")
    if not isinstance(files, list):
        return "has no list of files"
    for f in files:
        if not (
            isinstance(f, dict)
            and isinstance(f.get("path"), str)
            and _is_int(f.get("size"))
            and f["size"] >= 0
            and isinstance(f.get("chunks", []), list)
            and all(isinstance(c, str) for c in f.get("chunks", []))
        ):
            return "has a file that is not {path, size, chunks}"
    cs = entry.get("chunk_size", DEFAULT_CHUNK)
    if not _is_int(cs) or cs <= 0:
        return f"has chunk_size {cs!r}"
    if not all(_is_time(entry.get(k)) for k in ("last_used", "verified_at", "synced_at")):
        return "has a time that is not a number"
    if not _is_int(entry.get("bytes", 0)):
        return "has bytes that is not a number"
    return None


def state_problem(doc: Any) -> Optional[str]:
    """What makes a partial copy's state file unusable (None when it is sound)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), dict):
        return "it is not an object with a 'files' object"
    cs = doc.get("chunk_size", DEFAULT_CHUNK)
    if not _is_int(cs) or cs <= 0:
        return f"its chunk_size is {cs!r}"
    for rel, f in doc["files"].items():
        if not (isinstance(f, dict) and _is_int(f.get("size")) and f["size"] >= 0):
            return f"its file {rel!r} is not {{size, done}}"
        done = f.get("done", {})
        if not isinstance(done, dict) or not all(
            isinstance(k, str) and k.isascii() and k.isdigit() and isinstance(v, str) for k, v in done.items()
        ):
            return f"its file {rel!r} has a 'done' that is not chunk number: hash"
    if not isinstance(doc.get("keep", {}), dict):
        return "its 'keep' is not an object"
    return None


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
        self.repairs: List[str] = []  # damaged local state found and repaired, for the answer
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

    def _read_manifest(self) -> Tuple[Dict[str, Any], List[str]]:
        """The manifest as found, with only its well-formed entries, and what was wrong with it."""
        try:
            doc = read_json(self.manifest_path)
        except ValueError as exc:
            return _empty_manifest(), [f"it is not valid JSON ({exc})"]
        except OSError as exc:
            raise AgentError(f"cannot read {self.manifest_path}: {exc.strerror}", "bad_manifest") from None
        if doc is None:
            return _empty_manifest(), []
        if not isinstance(doc, dict) or not isinstance(doc.get("models"), dict):
            return _empty_manifest(), ["it is not an object with a 'models' object"]
        problems = []
        good = {}
        for name, entry in doc["models"].items():
            why = entry_problem(name, entry)
            if why:
                problems.append(f"its entry {name!r} {why}")
            else:
                good[name] = entry
        doc["models"] = good
        return doc, problems

    def load_manifest(self, locked: bool = False) -> Dict[str, Any]:
        """The manifest. A damaged one (not JSON, wrong types: nothing labctl wrote) is set aside
        as manifest.json.damaged-TIME, rewritten with its well-formed entries only, and the repair
        recorded in `self.repairs` for the command's answer. `locked`: the caller holds the
        manifest lock."""
        doc, problems = self._read_manifest()
        if not problems:
            return doc
        if not locked:
            with _flock(os.path.join(self.meta, "manifest.lock")):
                return self.load_manifest(locked=True)
        kept = set_aside(self.manifest_path)
        write_json(self.manifest_path, doc)
        dropped = (
            "no model entry was kept" if not doc["models"] else f"kept {len(doc['models'])} sound entries"
        )
        self.repairs.append(
            f"{self.manifest_path} was damaged ({'; '.join(problems)}): set aside as {kept} and rebuilt "
            f"({dropped}); sync the models it lost again"
        )
        return doc

    def reported(self) -> Dict[str, Any]:
        """For a command's answer: the repairs it made, when it made any."""
        return {"repairs": list(self.repairs)} if self.repairs else {}

    def models(self) -> Dict[str, Dict[str, Any]]:
        models: Dict[str, Dict[str, Any]] = self.load_manifest()["models"]
        return models

    def update(self, fn: Callable[[Dict[str, Dict[str, Any]]], Any]) -> Any:
        """Read-modify-write the manifest under its lock (the loader touches it concurrently)."""
        with _flock(os.path.join(self.meta, "manifest.lock")):
            doc = self.load_manifest(locked=True)
            out = fn(doc["models"])
            doc["version"] = MANIFEST_VERSION
            write_json(self.manifest_path, doc)
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
            used = disk_bytes(self.path)
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
        freed = disk_bytes(path)
        self.update(lambda models: models.pop(name, None))
        if os.path.lexists(path):
            trash = os.path.join(self.meta, "trash", f"{name}.{os.getpid()}.{time.monotonic_ns()}")
            os.rename(path, trash)  # the name disappears at once; the bytes go next
            rmtree(trash)
        return freed

    def empty_trash(self) -> None:
        """Finish removals a crash interrupted (callers hold the sync lock)."""
        trash = os.path.join(self.meta, "trash")
        for n in os.listdir(trash) if os.path.isdir(trash) else []:
            rmtree(os.path.join(trash, n))

    def remove_partial(self, name: str) -> int:
        freed = disk_bytes(self.partial_path(name))
        rmtree(self.partial_path(name))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.state_path(name))
        return freed


class Folder(Cache):
    """A plain folder as a pull's destination (a checkpoint's two files), with no manifest.

    Same layout as a cache (partial copies and their state under `meta`, a hidden folder
    inside it, so a resumed copy finds them), but a committed file is only renamed into the
    folder: nothing is listed. `finish` drops `meta` once everything landed.
    """

    def __init__(self, path: str, meta_name: str = ".labctl-pull") -> None:
        if not isinstance(path, str) or not path.startswith("/"):
            raise AgentError(f"the destination folder {path!r} is not absolute", "bad_args")
        if not meta_name.startswith(".") or "/" in meta_name:
            raise AgentError(f"{meta_name!r} is not a hidden folder name", "bad_args")
        self.path = path.rstrip("/") or "/"
        self.meta = os.path.join(self.path, meta_name)
        self.repairs = []
        for sub in ("", "partial", "state", "trash"):
            os.makedirs(os.path.join(self.meta, sub), exist_ok=True)

    def models(self) -> Dict[str, Dict[str, Any]]:
        return {}

    def update(self, fn: Callable[[Dict[str, Dict[str, Any]]], Any]) -> Any:
        return fn({})

    def space(self, size_gb: Optional[float]) -> Dict[str, Any]:
        sv = os.statvfs(self.path)
        return {
            "mounted": False,
            "fstype": None,
            "capacity_bytes": sv.f_blocks * sv.f_frsize,
            "used_bytes": (sv.f_blocks - sv.f_bfree) * sv.f_frsize,
            "free_bytes": sv.f_bavail * sv.f_frsize,
        }

    def finish(self) -> None:
        rmtree(self.meta)


def _public(entry: Dict[str, Any]) -> Dict[str, Any]:
    """A manifest entry without its chunk hashes (which can run to thousands)."""
    out = {k: v for k, v in entry.items() if k != "files"}
    out["files"] = [{k: v for k, v in f.items() if k != "chunks"} for f in entry.get("files", [])]
    return out


def load_state(cache: Cache, name: str) -> Optional[Dict[str, Any]]:
    """A partial copy's state, or None: none yet, or a damaged one (set aside; the copy starts
    over, its chunks verified again)."""
    path = cache.state_path(name)
    try:
        doc = read_json(path)
        why = state_problem(doc) if doc is not None else None
    except ValueError as exc:
        why = f"it is not valid JSON ({exc})"
    if why is None:
        return doc if isinstance(doc, dict) else None
    kept = set_aside(path)
    cache.repairs.append(f"{path} was damaged ({why}): set aside as {kept}; the copy of {name} starts over")
    return None


@command(
    takes={"cache": "str", "size_gb": Opt(NUMBER_OR_NULL, None)},
    answers={
        "cache": "str",
        "exists": "bool",
        "mounted?": "bool",
        "fstype?": "str?",
        "capacity_bytes?": "int?",
        "used_bytes?": "int?",
        "free_bytes?": "int?",
        "models?": {"*": CACHE_MODEL},
        "partials?": [
            {
                "name": "str",
                "total_bytes?": "int",
                "done_bytes?": "int",
                "disk_bytes?": "int?",
                "chunk_size?": "int?",
                "files?": {"*": {"size?": "int?", "mtime_ns?": "int?"}},
                "source?": "any",
                "updated?": "num?",
            }
        ],
        "untracked?": ["str"],
        "now?": "time",
        "repairs?": REPAIRS,
    },
)
def state_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """What a cache holds and how much room it has; the controller plans from this."""
    path = args["cache"]
    if path.startswith("/") and not os.path.isdir(path):
        return {"cache": path, "exists": False}  # the controller says how to provision it
    cache = Cache(args["cache"], create=False)
    space = cache.space(args["size_gb"])
    models = {}
    for name, entry in cache.models().items():
        item = _public(entry)
        path = cache.model_path(name)
        item["present"] = os.path.lexists(path)
        item["disk_bytes"] = disk_bytes(path)
        models[name] = item
    partials = []
    part_dir = os.path.join(cache.meta, "partial")
    names = set(os.listdir(part_dir)) if os.path.isdir(part_dir) else set()
    state_dir = os.path.join(cache.meta, "state")
    if os.path.isdir(state_dir):
        names |= {n[: -len(".json")] for n in os.listdir(state_dir) if n.endswith(".json")}
    for name in sorted(names):
        st = load_state(cache, name) or {"files": {}}
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
                "disk_bytes": disk_bytes(cache.partial_path(name)),
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
        "now": timestamp(),
        **cache.reported(),
    }


# ---------------------------------------------------------------------------------------------
# Maintenance: evict, pin, touch (verify is in verify.py)


@command(
    takes={"cache": "str", "models": Or(["any"], []), "force": Opt("bool", False)},
    answers={"evicted": EVICTED, "not_cached": ["str"], "pinned": ["str"], "repairs?": REPAIRS},
)
def evict_command(args: Dict[str, Any]) -> Dict[str, Any]:
    cache = Cache(args["cache"])
    force = args["force"]
    # Under the sync lock: a running copy must not lose its partial files or its planned room.
    with cache.sync_lock():
        cache.empty_trash()
        out: Dict[str, Any] = _evict_locked(cache, list(args["models"]), force)
    out.update(cache.reported())
    return out


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


@command(
    takes={"cache": "str", "model": "any", "pinned": Opt("bool", True)},
    answers={"model": "str", "pinned": "bool", "changed": "bool", "repairs?": REPAIRS},
)
def pin_command(args: Dict[str, Any]) -> Dict[str, Any]:
    cache = Cache(args["cache"])
    name = check_name(args["model"])
    pinned = args["pinned"]

    def set_pin(models: Dict[str, Dict[str, Any]]) -> Optional[bool]:
        if name not in models:
            return None
        was = bool(models[name].get("pinned"))
        models[name]["pinned"] = pinned
        return was

    was = cache.update(set_pin)
    if was is None:
        raise AgentError(f"{name} is not in the cache {cache.path}", "not_cached")
    return {"model": name, "pinned": pinned, "changed": was != pinned, **cache.reported()}


def touch(cache_path: str, model: str) -> Optional[float]:
    """Mark `model` used now (LRU eviction goes by this); None when it is not cached.

    For the loader and benchmarks on the host: `from labctl.agent.cache.manifest import touch`.
    """
    cache = Cache(cache_path, create=False)
    name = check_name(model)
    now = timestamp()

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


@command(
    takes={"cache": Or("str", ""), "model": Opt("any", None), "path": Or("str", "")},
    answers={"touched": "bool", "last_used?": "time?"},
)
def touch_command(args: Dict[str, Any]) -> Dict[str, Any]:
    if args["path"] and not args["cache"]:
        when = touch_path(args["path"])
        return {"path": args["path"], "touched": when is not None, "last_used": when}
    when = touch(args["cache"], str(args["model"]))
    return {"model": args["model"], "touched": when is not None, "last_used": when}
