"""What a serving host records of its orchestra: warm.json (the models kept warm, replaced whole)
and history.jsonl (one line per rotation, trimmed past a size). Standard library only, Python 3.8."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

from ..core import paths
from ..core.fsutil import write_atomic

HISTORY_KEEP = 50  # entries orchestra.state returns
# Past HISTORY_TRIM_BYTES, history.jsonl is cut to its newest entries (at most HISTORY_TRIM_KEEP).
HISTORY_TRIM_BYTES = 1 << 20
HISTORY_TRIM_KEEP = 1000


def read_warm() -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """(warm.json's document, None), (None, why it cannot be used), or (None, None) if absent."""
    path = paths.WARM_STATE
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc}"
    except ValueError as exc:
        return None, f"{path} is damaged (not JSON: {exc}); the next orchestra.commit replaces it"
    if not isinstance(doc, dict):
        return (
            None,
            f"{path} is damaged (a JSON {type(doc).__name__}, not an object); the next orchestra.commit replaces it",
        )
    return doc, None


def read_history(keep: int = HISTORY_KEEP) -> List[Dict[str, Any]]:
    """The newest `keep` entries of history.jsonl, newest last; a torn or damaged line is skipped."""
    try:
        with open(paths.ORCHESTRA_HISTORY, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - (1 << 18)))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    if size > 1 << 18 and lines:
        lines = lines[1:]  # the first line read may be cut
    entries = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    return entries[-keep:] if keep else []


def append_history(entry: Dict[str, Any]) -> None:
    path = paths.ORCHESTRA_HISTORY
    line = (json.dumps(entry, sort_keys=True, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if size > HISTORY_TRIM_BYTES:
        kept = read_history(HISTORY_TRIM_KEEP)
        data = "".join(json.dumps(e, sort_keys=True, separators=(",", ":")) + "\n" for e in kept)
        write_atomic(path, data.encode())
