"""The docker command line, for what the Engine API client (`docker`) does not cover: image
builds and listings, the daemon's version. Shared by `daemon` and `image`."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any, List

from ..core.errors import AgentError


def docker(args: List[str], timeout: float = 30, stdin: Any = None) -> "subprocess.CompletedProcess[str]":
    """The docker CLI; a missing binary or a hung daemon is an AgentError naming it."""
    exe = shutil.which("docker")
    if exe is None:
        raise AgentError("the docker command is not installed on this host", "no_docker")
    try:
        return subprocess.run(
            [exe, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL if stdin is None else stdin,
        )
    except subprocess.TimeoutExpired:
        raise AgentError(f"docker {args[0]} did not answer in {timeout:g} s", "docker_hung") from None
