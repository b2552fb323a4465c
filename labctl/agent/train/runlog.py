"""A training run's logs as labctl reads them: the tail of a file, and the JSON events in it.

The trainer's rank 0 prints one JSON object per event ({"event": "step", ...}) to metrics.jsonl
and, behind torchrun's "[rank0]:" prefix, to the run's console.log. `train status` wants the
newest event, the host's `monitor.status` sample every step event of the tail. Standard library only,
Python 3.8.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence


def tail_lines(path: str, size: int) -> List[str]:
    """The whole lines in the last `size` bytes of `path`; [] when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            f.seek(max(0, end - size))
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[1:] if end > size else lines  # the first line of a cut tail is partial


def events(
    lines: Sequence[str], prefix: str = "", kinds: Optional[Sequence[str]] = None
) -> List[Dict[str, Any]]:
    """The JSON events (objects with "event") among `lines`, oldest first: only in lines that
    carry `prefix` (what follows it), and only of `kinds` when given."""
    out = []
    for line in lines:
        if prefix:
            _, sep, line = line.partition(prefix)
            if not sep:
                continue
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "event" in event and (kinds is None or event["event"] in kinds):
            out.append(event)
    return out
