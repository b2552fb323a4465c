"""Where the cache's source server listens: the storage host's inventory address, never loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import REPO


@contextmanager
def cache_server(root: Path, bind: str) -> Iterator[dict[str, Any]]:
    """The real agent's cache_serve in its own process, serving an empty library."""
    args = {"root": str(root), "models": [], "bind": bind, "idle_timeout": 30}
    proc = subprocess.Popen(
        [sys.executable, "-m", "labctl.agent", "cache_serve", json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stderr is not None
        info = json.loads(proc.stderr.readline())
        assert info["event"] == "listening", info
        yield info
    finally:
        proc.kill()
        proc.wait()


def test_a_storage_host_whose_name_resolves_to_loopback_serves_on_every_address(tmp_path: Path) -> None:
    # "localhost" stands for a host whose own name resolves to 127.0.1.1 on itself (Debian's
    # /etc/hosts): a source server there would listen where the pulling host can never connect.
    with cache_server(tmp_path, "localhost") as info:
        assert info["address"] == "0.0.0.0"
    with cache_server(tmp_path, "127.0.0.1") as info:  # an address given as such is taken as it is
        assert info["address"] == "127.0.0.1"
