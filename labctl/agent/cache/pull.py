"""The cache side of a copy: fetch chunks over parallel streams, verify each, commit whole models.

A model enters the manifest only once every chunk is verified (renamed into place from the
partial folder); each verified chunk is recorded as it lands, so a stopped copy resumes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import socket
import threading
import time
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Tuple

from ..core.errors import AgentError
from ..core.fsutil import write_json
from ..core.spec import NUMBER_OR_NULL, Opt, Or, command
from .manifest import (
    BLOCK,
    DEFAULT_CHUNK,
    EVICTED,
    Cache,
    Folder,
    check_name,
    chunk_ranges,
    disk_bytes,
    emit,
    hash_range,
    load_state,
    page_round,
    rmtree,
    timestamp,
)
from .serve import PROTOCOL, read_line, send_line


class _Transfer(Exception):
    pass


class _LocalWrite(Exception):
    """Writing into the cache failed (a full or read-only disk): the copy's fault is here, not
    the network's."""

    def __init__(self, exc: OSError) -> None:
        super().__init__(f"{exc.strerror or exc} writing {exc.filename}" if exc.filename else str(exc))
        self.kind = "disk_full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "write_failed"


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
        old = load_state(cache, self.name)
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
            rmtree(part)
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
                    if hash_range(ppath, off, length, buf) == sha:
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
            need += max(0, page_round(int(f["size"])) - disk_bytes(ppath))
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
        now = timestamp()
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
            rmtree(trash)
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
        self.kind = "transfer_failed"  # the first error's
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
        send_line(sock, {"token": self.token, "protocol": PROTOCOL})
        hello = read_line(rf)
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
        except _LocalWrite as exc:
            self.fail(str(exc), exc.kind)
        except (OSError, ValueError) as exc:
            self.fail(f"the connection to {self.address}:{self.port} broke: {exc}")
        finally:
            if sock is not None:
                sock.close()

    def fail(self, message: str, kind: str = "transfer_failed") -> None:
        with self.lock:
            if not self.errors:
                self.kind = kind
            self.errors.append(message)
        self.abort.set()

    def fetch(
        self, sock: socket.socket, rf: Any, buf: memoryview, plan: _Plan, task: Tuple[str, int, int, int]
    ) -> None:
        rel, idx, offset, length = task
        send_line(sock, {"op": "get", "path": rel, "offset": offset, "length": length})
        head = read_line(rf)
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
                try:
                    w = os.pwrite(fd, view, pos)
                except OSError as exc:
                    exc.filename = exc.filename or plan.cache.file_path(rel, partial=True)
                    raise _LocalWrite(exc) from None
                view = view[w:]
                pos += w
            left -= n
            with self.lock:
                self.fetched += n
        tail = read_line(rf)
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
            try:
                write_json(plan.cache.state_path(plan.name), plan.state)
            except OSError as exc:
                exc.filename = exc.filename or plan.cache.state_path(plan.name)
                raise _LocalWrite(exc) from None
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
    if args["token_file"]:
        path = args["token_file"]
        try:
            with open(path) as f:
                token = f.read().strip()
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return token
    return str(args["token"])


def _shutdown_source(address: str, port: int, token: str) -> None:
    try:
        with socket.create_connection((address, port), timeout=5) as s:
            s.settimeout(5)
            rf = s.makefile("rb")
            send_line(s, {"token": token})
            if read_line(rf):
                send_line(s, {"op": "shutdown"})
                read_line(rf)
    except (OSError, ValueError):
        pass  # the controller closes the server's channel anyway


@command(
    takes={
        "cache": Opt("str?", None),
        "into": Or("str", ""),
        "meta": Or("str", ".labctl-pull"),
        "address": "str",
        "port": "int",
        "token": Or("any", ""),
        "token_file": Or("str", ""),
        "chunk_size": Or("int", DEFAULT_CHUNK),
        "streams": Or("int", 2),
        "source": Or("str", ""),
        "stop_after_chunks": Or("int", 0),
        "shutdown_source": Opt("bool", True),
        "models": Or(["any"], []),
        "size_gb": Opt(NUMBER_OR_NULL, None),
        "evict": Or(["any"], []),
        "evict_partials": Or(["any"], []),
        "all_or_nothing": Opt("bool", False),
    },
    answers={
        "models": [
            {
                "name": "str",
                "bytes?": "int",
                "chunks": "int",
                "fetched_bytes": "int",
                "fetched_chunks": "int",
                "resumed_bytes": "int",
                "resumed_chunks": "int",
                "committed": "bool",
                "path": "str",
            }
        ],
        "evicted?": EVICTED,
        "fetched_bytes?": "int",
        "resumed_bytes?": "int",
        "retries?": "int",
        "streams?": "int",
        "chunk_size?": "int",
        "seconds?": "num",
        "verify_seconds?": "num",
        "rate_bytes_per_s?": "num",
    },
)
def pull_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """Evict what the controller planned, then copy the models from the storage host.

    `into` (instead of `cache`): copy plain files into that folder (a checkpoint's .pt and
    manifest), their partial copies under its hidden `meta` folder; with `all_or_nothing`,
    no file is renamed into place unless every one is complete, in the order given.
    """
    if not args["into"] and args["cache"] is None:
        raise AgentError("cache.pull: argument 'cache' (or 'into') is required", "bad_args")
    cache = Folder(args["into"], args["meta"]) if args["into"] else Cache(args["cache"])
    address, port = args["address"], args["port"]
    token = _read_token(args)
    chunk_size = args["chunk_size"]
    streams = max(1, args["streams"])
    source = args["source"] or f"{address}:{port}"
    stop_after = args["stop_after_chunks"]
    started = time.monotonic()
    try:
        with cache.sync_lock():
            result = _pull_locked(cache, args, address, port, token, chunk_size, streams, source, stop_after)
    finally:
        if args["shutdown_source"]:
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
    plans = [_Plan(cache, m, chunk_size, source) for m in args["models"]]
    for p in plans:
        p.prepare(buf)
    verify_s = time.monotonic() - t0
    need = sum(p.need_bytes() for p in plans)
    space = cache.space(args["size_gb"])
    manifest = cache.models()
    evict = [n for n in args["evict"] if n in manifest and not manifest[n].get("pinned")]
    stale = [n for n in args["evict_partials"] if n not in {p.name for p in plans}]
    can_free = sum(disk_bytes(cache.model_path(n)) for n in evict)
    can_free += sum(disk_bytes(cache.partial_path(n)) for n in stale)
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
    free = cache.space(args["size_gb"])["free_bytes"]
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
            write_json(cache.state_path(p.name), p.state)
    t1 = time.monotonic()
    threads = [threading.Thread(target=puller.worker, daemon=True) for _ in range(puller.streams)]
    if puller.queue:
        for t in threads:
            t.start()
    else:
        threads = []

    def progress(final: bool = False) -> None:
        emit(
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
    whole = all(p.complete() for p in plans)
    for p in plans:
        if p.complete() and (whole or not args["all_or_nothing"]):
            p.commit()
    if puller.errors:
        kept = sum(len(f["done"]) for p in plans if not p.committed for f in p.state["files"].values())
        done_models = [p.name for p in plans if p.committed]
        raise AgentError(
            f"{puller.errors[0]}; {kept} verified chunks are kept in {cache.meta}/partial"
            + (f" and {', '.join(done_models)} completed" if done_models else "")
            + "; run the sync again to resume",
            puller.kind,
        )
    if isinstance(cache, Folder) and whole:
        cache.finish()
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
