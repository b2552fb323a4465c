"""Running system commands for the sim: every failure becomes a HostError naming the command."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence

from labctl.output.errors import HostError


def require_root() -> None:
    if os.geteuid() != 0:
        raise HostError(
            "labctl sim needs root to create network namespaces.", "Run it as root, e.g. sudo labctl sim up."
        )


def require_tool(name: str, package: str) -> str:
    path = shutil.which(name) or (f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}") else None)
    if path is None:
        raise HostError(
            f"labctl sim needs `{name}`, which is not installed.", f"Install it: apt-get install {package}."
        )
    return path


def run(
    cmd: Sequence[str],
    *,
    check: bool = True,
    input: str | None = None,
    timeout: float = 30.0,
) -> subprocess.CompletedProcess[str]:
    """Run `cmd` without a shell and capture its output; with `check`, a non-zero exit is a HostError."""
    try:
        proc = subprocess.run(
            list(cmd),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise HostError(f"`{cmd[0]}` is not installed (needed for `{shlex.join(cmd)}`).") from None
    except subprocess.TimeoutExpired:
        raise HostError(f"`{shlex.join(cmd)}` did not finish within {timeout:g} s.") from None
    if check and proc.returncode != 0:
        raise command_error(cmd, proc)
    return proc


def command_error(cmd: Sequence[str], proc: subprocess.CompletedProcess[str]) -> HostError:
    detail = (proc.stderr or proc.stdout or "").strip()
    return HostError(
        f"`{shlex.join(cmd)}` failed (exit {proc.returncode})" + (f": {detail}" if detail else "."),
    )
