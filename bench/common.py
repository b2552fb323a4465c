"""What every benchmark script shares: the machine line, and publishing a result."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


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


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run a benchmark's command from the repository; a failure ends the benchmark with its output."""
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, **kw)
    if proc.returncode != 0:
        raise SystemExit(
            f"benchmark command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    proc = run(cmd)
    return time.perf_counter() - start, proc
