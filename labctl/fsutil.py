"""Local file writes that never leave half a file behind: the agent's one helper, for Paths."""

from __future__ import annotations

from pathlib import Path

from labctl.agent import fsutil


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` so a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fsutil.write_atomic(str(path), data.encode() if isinstance(data, str) else data, mode=mode)
