"""Running a hint's command exactly as a user would copy it: the tests of hints share these."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path


def hinted_all(out: str) -> list[list[str]]:
    """Every command a message names (`labctl ...` in backticks), as argv, in order."""
    return [shlex.split(c) for c in re.findall(r"`(labctl [^`]+)`", " ".join(out.split()))]


def as_written(
    inv: Path, argv: list[str], cwd: Path, answer: str | None = None
) -> subprocess.CompletedProcess[str]:
    """A hint's command run exactly as written; the inventory comes from $LABCTL_INVENTORY, as
    for a user who set it (hints name no -i). `answer`: typed on a terminal (a pty) to the
    questions it asks, as a person at the keyboard would."""
    assert argv[0] == "labctl", argv
    cmd = [sys.executable, "-m", "labctl", *argv[1:]]
    env = {**os.environ, "LABCTL_INVENTORY": str(inv)}
    if answer is None:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=cwd, env=env)
    return _on_a_terminal(cmd, cwd, env, answer)


def _on_a_terminal(
    cmd: list[str], cwd: Path, env: dict[str, str], answer: str
) -> subprocess.CompletedProcess[str]:
    import pty

    main, child = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=child, stdout=child, stderr=child, cwd=cwd, env=env, close_fds=True)
    os.close(child)
    out = b""
    answered = 0
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the child closed its end: it has exited
            break
        if not chunk:
            break
        out += chunk
        while out.count(b"[y/N]") > answered:  # each question once
            os.write(main, answer.encode() + b"\n")
            answered += 1
    os.close(main)
    rc = proc.wait(timeout=60)
    text = out.decode(errors="replace").replace("\r\n", "\n")
    return subprocess.CompletedProcess(cmd, rc, text, "")
