"""What every benchmark script shares: the machine line, and publishing a result."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any


def machine() -> str:
    return (
        f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.system()} {platform.release()}"
    )


def update_section(path: Path, md: str, begin: str, end: str) -> None:
    """Replace the section between `begin` and `end` in `path` (append it if absent)."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + md + tail
    else:
        text = text.rstrip() + "\n\n" + md + "\n"
    path.write_text(text)


def publish(result: dict[str, Any], md: str, json_path: Path, out: Path | None, begin: str, end: str) -> None:
    """Write the JSON result, print the markdown, and update its section of `out` if given."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2))
    print(md)
    if out:
        update_section(out, md, begin, end)
