"""`cache.verify`: re-hash cached models against the manifest's chunk hashes."""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List

from ..core.fsutil import write_json
from ..core.spec import Opt, Or, command
from .manifest import BLOCK, DEFAULT_CHUNK, REPAIRS, Cache, check_name, chunk_ranges, hash_range, timestamp


@command(
    takes={"cache": "str", "models": Or(["any"], []), "repair": Opt("bool", True)},
    answers={
        "models": [
            {
                "name": "str",
                "status": "str",
                "bytes?": "int?",
                "seconds?": "num",
                "bad?": [{"path": "str", "chunks": ["int"]}],
                "chunk_size?": "int",
                "moved_to_partial?": "bool",
            }
        ],
        "repairs?": REPAIRS,
    },
)
def verify_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """Re-hash cached models against the manifest. With `repair`, a corrupt model leaves the
    manifest and goes back to the partial folder with its good chunks recorded, so the next
    sync fetches only the bad ones."""
    cache = Cache(args["cache"])
    repair = args["repair"]
    buf = memoryview(bytearray(BLOCK))
    results = []
    with cache.sync_lock():
        cache.empty_trash()
        models = cache.models()
        names = list(args["models"] or sorted(models))
        for name in names:
            check_name(name)
            entry = models.get(name)
            if entry is None:
                results.append({"name": name, "status": "not_cached"})
                continue
            results.append(_verify_one(cache, entry, buf, repair))
    return {"cache": cache.path, "models": results, **cache.reported()}


def _verify_one(cache: Cache, entry: Dict[str, Any], buf: memoryview, repair: bool) -> Dict[str, Any]:
    name = entry["name"]
    cs = int(entry.get("chunk_size") or DEFAULT_CHUNK)
    start = time.monotonic()
    # Gone from the disk while the manifest still lists it (deleted by hand, a tmpfs remounted
    # empty): every chunk is bad, and the repair fetches it again like a corrupt one.
    missing = not os.path.lexists(cache.model_path(name))
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
            sha = hash_range(path, off, length, buf) if actual is not None else None
            checked += length if sha else 0
            if sha is not None and idx < len(chunks) and sha == chunks[idx]:
                done[str(idx)] = sha
            else:
                bad_idx.append(idx)
        if actual is None or actual != size or bad_idx:
            bad.append({"path": rel, "chunks": bad_idx, "size": actual, "expected_size": size})
        state_files[rel] = {"size": size, "mtime_ns": f.get("mtime_ns"), "done": done}
    seconds = round(time.monotonic() - start, 3)
    if not bad and not missing:
        now = timestamp()

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
        "status": "missing" if missing else "corrupt",
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
        if not missing:
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
        write_json(cache.state_path(name), state)
        out["moved_to_partial"] = True
        out["pinned"] = bool(entry.get("pinned"))
    return out
