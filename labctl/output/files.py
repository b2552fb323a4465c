"""Files a command writes for its user, never half of one (through the agent's `fsutil.write_atomic`).

`write_output` is the one for files a command writes for its user (`-o`, `--out`, `--plot`,
`--textfile`, run records, `init`): a full or read-only folder is named with its fix, and the
old file stays whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from labctl.agent.core import fsutil


def write_output(path: Path, data: str | bytes, mode: int = 0o644, flag: str = "") -> None:
    """`write_atomic`, with a failed write named (LabctlError, exit 1) instead of an OSError;
    `flag` is the option that named the file (`--textfile`), when one did."""
    import errno
    import shlex

    from labctl.output.errors import DISK_FULL, LabctlError

    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fsutil.write_atomic(str(path), data.encode() if isinstance(data, str) else data, mode=mode)
    except OSError as e:
        folder = shlex.quote(str(path.parent))
        full = errno.errorcode.get(e.errno or 0, "") in DISK_FULL
        raise LabctlError(
            f"{flag + ' ' if flag else ''}{path.parent}: cannot write {path.name} there ({e.strerror or e}); "
            f"{'the old ' + path.name + ' is left as it was' if existed else 'nothing was written'}.",
            f"Free space there (`df -h {folder}` shows what is left), then run the command again."
            if full
            else f"Make {folder} writable for this user (`ls -ld {folder}`), then run the command again.",
        ) from None


def save_figure(fig: Any, path: Path, dpi: int) -> None:
    """A matplotlib figure saved through `write_output` (its format from the file's suffix):
    savefig writing in place left half a PNG, or a traceback, in a full folder."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, dpi=dpi, format=path.suffix.lstrip(".").lower() or "png")
    write_output(path, buf.getvalue())
