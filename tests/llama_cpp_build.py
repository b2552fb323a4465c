"""llama.cpp's llama-server for the tests and benchmarks: built CPU-only once per version, with the
host-side code the `llama_cpp` resource runs on hosts (labctl/agent/provision/llama_cpp.py), into
a cache that outlives the test run:

    ~/.cache/labctl-tests/llama.cpp-0.3.36-cpu/bin/llama-server   (+ build.json, the manifest)
    ~/.cache/labctl-tests/sdist/llama_cpp_python-0.3.36.tar.gz     (pip download, sha256-pinned)

The first run builds (about 8 minutes on 2 cores); later runs find the manifest matching and the
binary answering `--version`, and take a second. LABCTL_TEST_CACHE moves the cache. A lock file
keeps two test processes (xdist workers, a benchmark) from building it at once.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

from labctl.agent.provision.llama_cpp import DEFAULT_VERSION, PINNED, SERVER, build_command
from labctl.provision.resources.llama_cpp import cached_sdist

VERSION = DEFAULT_VERSION


def cache_dir() -> Path:
    env = os.environ.get("LABCTL_TEST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "labctl-tests"


def prefix(version: str = VERSION) -> Path:
    return cache_dir() / f"llama.cpp-{version}-cpu"


def sdist(version: str = VERSION) -> Path:
    return cached_sdist(version, PINNED[version], cache_dir() / "sdist")


def build(version: str = VERSION, jobs: int = 0) -> dict[str, Any]:
    """The cached CPU build of llama-server (made now if missing): build_command's answer, with
    the manifest (its build_seconds are those of the build that made it)."""
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"llama.cpp-{version}-cpu.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        args = {
            "sdist": str(sdist(version)),
            "prefix": str(prefix(version)),
            "jobs": jobs or os.cpu_count() or 1,
        }
        return build_command(args)


def llama_server(version: str = VERSION) -> Path:
    """The path of the cached llama-server binary, built first if needed."""
    return Path(build(version)["prefix"]) / SERVER


if __name__ == "__main__":
    # `make llama-server`: the cached build before the integration tests (the first takes minutes).
    import json
    import sys

    done = build()
    sys.stdout.write(
        json.dumps({k: done[k] for k in ("prefix", "built", "server_version") if k in done}) + "\n"
    )
