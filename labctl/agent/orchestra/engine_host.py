"""The host's side of an orchestra engine's contract (labctl/orchestra/engines/): the program it
runs, found before a start; whether a llama.cpp build's CUDA archs cover the card it is placed
on; the GGUF file in a model's folder. Standard library only, Python 3.8.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..core.errors import AgentError
from ..core.gpus import GpuQueryError, gather_gpus
from ..provision.llama_cpp import ROOT as LLAMA_CPP_ROOT
from ..provision.llama_cpp import build_covers

# Where the llama_cpp provision resource installs its builds (one folder per version and CUDA archs).
ENGINE_ROOTS = {"llama-server": LLAMA_CPP_ROOT}


def weights_file(path: str) -> str:
    """The GGUF file an engine loads: `path` itself, or the one .gguf file in the folder `path`
    (the RAM cache holds folders)."""
    if not os.path.isdir(path):
        return path
    found = sorted(n for n in os.listdir(path) if n.endswith(".gguf") and not n.startswith("."))
    if len(found) != 1:
        what = "no .gguf file" if not found else f"{len(found)} .gguf files ({', '.join(found[:4])})"
        raise AgentError(
            f"{path} holds {what}; a GGUF model's folder holds exactly one (split files are not served)",
            "no_model",
        )
    return os.path.join(path, found[0])


def find_binary(binary: Any, host: str, engine: str) -> str:
    """The engine's program on this host: a path as given, else PATH, else the newest build under
    labctl's install root for it; AgentError "no_engine" naming how to get one."""
    import glob
    import shutil

    if not isinstance(binary, str) or not binary:
        raise AgentError("binary must be a program's name or path", "bad_args")
    if "/" in binary:
        if os.path.isfile(binary) and os.access(binary, os.X_OK):
            return binary
        found = None
    else:
        found = shutil.which(binary)
        root = ENGINE_ROOTS.get(binary)
        if found is None and root:
            builds = sorted(glob.glob(os.path.join(root, "*", "bin", binary)), key=os.path.getmtime)
            found = builds[-1] if builds else None
    if found is None:
        how = (
            "provision it (labctl provision -p playbooks/engines.yaml), or set server.binaries in the orchestra file"
            if binary.endswith("llama-server")
            else f"install {engine} there, or set server.binaries: {{{engine}: PATH}} in the orchestra file"
        )
        raise AgentError(f"{host} has no {binary} for engine {engine}: {how}", "no_engine")
    return found


def check_build_covers(binary: str, gpu: int, host: str, engine: str) -> None:
    """Refuse (kind "no_engine") a build whose manifest (build.json beside its bin/) says it was
    built without CUDA, or for archs that do not run on GPU `gpu`: it would fall back to the CPU
    or fail on its first kernel, after a long load."""
    manifest = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(binary))), "build.json")
    try:
        with open(manifest) as f:
            built = json.load(f)
    except (OSError, ValueError):
        return  # a build labctl did not make: its own error will say
    listed = built.get("cuda_archs") if isinstance(built, dict) else None
    # "61", 61 and "sm_61" alike: the manifest's entries as CMAKE_CUDA_ARCHITECTURES writes them.
    archs = ["".join(c for c in str(a) if c.isdigit()) for a in (listed if isinstance(listed, list) else [])]
    archs = [a for a in archs if len(a) >= 2]
    try:
        _, gpus = gather_gpus()
    except GpuQueryError:
        return
    card = next((g for g in gpus if g.get("index") == gpu), None)
    cap = str((card or {}).get("compute_capability") or "")
    if not cap:
        return
    major, _, minor = cap.partition(".")
    want = int(major) * 10 + int(minor or 0)
    name = (card or {}).get("name") or "GPU"
    if not archs:
        raise AgentError(
            f"{binary} is a CPU-only build, and {host} GPU {gpu} is a {name} ({cap}): provision "
            f"llama.cpp with CUDA for sm_{want} (labctl provision -p playbooks/engines.yaml)",
            "no_engine",
        )
    # Only the build's own machine code counts (a cubin runs on the same major version at an equal
    # or newer minor): the provision resource's test for the same manifest.
    if build_covers(archs, cap) != "sass":
        raise AgentError(
            f"{binary} was built for sm_{', sm_'.join(archs)}, which does not run on {host} "
            f"GPU {gpu}, a {name} ({cap}): rebuild it for sm_{want} (labctl provision -p playbooks/engines.yaml)",
            "no_engine",
        )
