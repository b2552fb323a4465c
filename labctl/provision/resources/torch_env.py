"""`torch_env`: a virtualenv with a pinned torch whose CUDA build runs on every GPU of the host.

Recent CUDA builds of torch dropped old GPUs (the seed lab mixes Pascal P40/P4/P1000, a
Volta V100 and an Ampere RTX 3050), so the build is chosen from the GPUs' compute
capabilities, declared in the inventory and found by nvidia-smi. A build that lacks a
GPU's architecture is refused with the reason and the build to use; after install the
host itself checks `torch.cuda.get_arch_list()`, which is the final word.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any, Optional

from pydantic import Field

from labctl.agent import paths
from labctl.inventory.model import Host
from labctl.provision.resource import Change, Params, PlanError, Probes, Resource, State, register

Cap = tuple[int, int]

# Architectures in PyTorch's Linux x86 wheels, from its RELEASE.md support matrix and
# .ci/manywheel/build_cuda.sh. A cubin for sm_X.Y runs on X.Z with Z >= Y; PTX (compute_)
# is JIT-compiled for anything newer.
ARCHS_LEGACY = [(5, 0), (6, 0), (7, 0), (7, 5), (8, 0), (8, 6), (9, 0)]
ARCHS_CU128_EARLY = [(7, 0), (7, 5), (8, 0), (8, 6), (9, 0), (10, 0), (12, 0)]  # torch 2.7-2.9
ARCHS_MODERN = [(7, 5), (8, 0), (8, 6), (9, 0), (10, 0), (12, 0)]  # cu128 from 2.10, cu130

# Compute capability of GPUs named in inventories without one (lower-case substrings).
KNOWN_CAPS: dict[str, Cap] = {
    "p1000": (6, 1), "p40": (6, 1), "p4": (6, 1), "p100": (6, 0), "gtx 10": (6, 1),
    "v100": (7, 0), "titan v": (7, 0), "t4": (7, 5), "rtx 20": (7, 5), "a100": (8, 0),
    "rtx 30": (8, 6), "a10": (8, 6), "a40": (8, 6), "rtx 40": (8, 9), "l4": (8, 9), "l40": (8, 9),
    "h100": (9, 0), "h200": (9, 0), "b200": (10, 0), "rtx 50": (12, 0),
}  # fmt: skip


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def build_archs(version: str, variant: str) -> tuple[list[Cap], bool] | None:
    """(architectures, has PTX) of torch `version` built for `variant`; None if no such build."""
    v = version_tuple(version)
    if variant in ("cu118", "cu121", "cu124"):
        return (ARCHS_LEGACY, False) if v < (2, 7) else None
    if variant == "cu126":
        return (ARCHS_LEGACY, False) if v >= (2, 6) else None
    if variant == "cu128":
        if v < (2, 7):
            return None
        return (ARCHS_CU128_EARLY, False) if v < (2, 10) else (ARCHS_MODERN, False)
    if variant == "cu130":
        return (ARCHS_MODERN, True) if v >= (2, 9) else None
    return None


def variants_for(version: str) -> list[str]:
    """CUDA builds of `version`, newest first."""
    return [x for x in ("cu130", "cu128", "cu126", "cu124", "cu121", "cu118") if build_archs(version, x)]


def supports(archs: list[Cap], ptx: bool, cap: Cap) -> bool:
    if any(a[0] == cap[0] and a[1] <= cap[1] for a in archs):
        return True
    return ptx and any(a <= cap for a in archs)


def parse_cap(text: str) -> Cap:
    major, _, minor = text.strip().partition(".")
    return int(major), int(minor or 0)


def known_cap(name: str) -> Cap | None:
    """The compute capability of a GPU named `name`, from KNOWN_CAPS (longest match wins)."""
    lower = name.lower()
    found = [c for key, c in sorted(KNOWN_CAPS.items(), key=lambda kv: -len(kv[0])) if key in lower]
    return found[0] if found else None


def declared_caps(host: Host) -> list[tuple[str, Cap]]:
    out = []
    for g in host.gpus:
        if g.compute_capability:
            cap = parse_cap(g.compute_capability)
        else:
            known = known_cap(g.model)
            if known is None:
                raise PlanError(
                    f"the inventory does not give the compute capability of {g.model} on {host.name}.",
                    f'Add compute_capability to that GPU, e.g. {{model: {g.model}, compute_capability: "8.6"}}.',
                )
            cap = known
        out += [(g.model, cap)] * g.count
    return out


def choose_build(version: str, variant: str, gpus: list[tuple[str, Cap]]) -> str:
    """The variant to install: `variant` checked against every GPU, or the newest that fits (auto)."""
    if variant == "cpu":
        if gpus:
            raise PlanError(
                f"cuda: cpu would leave the host's GPUs ({', '.join(sorted({n for n, _ in gpus}))}) unused.",
                "Use cuda: auto to pick a CUDA build that runs on all of them.",
            )
        return "cpu"
    if variant == "auto":
        if not gpus:
            return "cpu"
        for candidate in variants_for(version):
            archs, ptx = build_archs(version, candidate) or ([], False)
            if all(supports(archs, ptx, cap) for _, cap in gpus):
                return candidate
        caps = ", ".join(f"{n} ({c[0]}.{c[1]})" for n, c in sorted(set(gpus)))
        raise PlanError(
            f"no CUDA build of torch {version} runs on all of {caps}.",
            "Pin an older torch version (cu126 builds keep Pascal and Volta), or exclude the oldest GPU's host.",
        )
    spec = build_archs(version, variant)
    if spec is None:
        raise PlanError(
            f"torch {version} has no {variant} build.",
            f"Builds of {version}: {', '.join(variants_for(version)) or 'none known'}, or cpu.",
        )
    archs, ptx = spec
    missing = [(n, c) for n, c in gpus if not supports(archs, ptx, c)]
    if missing:
        fit = [
            x
            for x in variants_for(version)
            if all(supports(*(build_archs(version, x) or ([], False)), c) for _, c in gpus)
        ]
        names = ", ".join(sorted({f"{n} (sm_{c[0]}{c[1]})" for n, c in missing}))
        built = " ".join(f"sm_{a}{b}" for a, b in archs)
        raise PlanError(
            f"torch {version}+{variant} has no kernels for {names}: that build targets {built}.",
            f"Use cuda: {fit[0]} (or cuda: auto)."
            if fit
            else "No CUDA build of this torch fits; pin an older torch.",
        )
    return variant


class TorchEnvParams(Params):
    version: str = Field(
        "2.13.0", pattern=r"^\d+\.\d+(\.\d+)?$", description="torch version, e.g. version: 2.13.0"
    )
    cuda: str = Field(
        "auto", pattern=r"^(auto|cpu|cu\d{3})$", description="auto, cpu, or a build such as cu126"
    )
    path: Optional[str] = Field(
        None, description=f"virtualenv path (default {paths.ENVS_DIR}/torch-VERSION-BUILD)"
    )
    python: Optional[str] = Field(
        None, description="interpreter to build the venv with (default: the host's python)"
    )
    index_url: Optional[str] = Field(
        None,
        description='pip index; default download.pytorch.org/whl/BUILD; "" uses the host\'s pip configuration',
    )
    packages: list[str] = Field(
        default_factory=list, description="more pip requirements, e.g. packages: [safetensors]"
    )


VERIFY = r"""
import json, os, sys, tempfile
import torch
want, gpus, record = sys.argv[1], int(sys.argv[2]), sys.argv[3]
info = {"version": torch.__version__, "cuda": torch.version.cuda, "python": sys.executable,
        "cuda_available": torch.cuda.is_available(),
        "arch_list": torch.cuda.get_arch_list() if torch.cuda.is_available() else []}
try:
    info["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
except Exception:
    info["nccl"] = None
if not torch.__version__.startswith(want):
    sys.exit("installed torch %s, wanted %s" % (torch.__version__, want))
if gpus and not info["cuda_available"]:
    sys.exit("torch %s cannot use this host's GPUs (torch.cuda.is_available() is False)" % torch.__version__)
fd, tmp = tempfile.mkstemp(dir=os.path.dirname(record))
with os.fdopen(fd, "w") as f:
    json.dump(info, f)
os.chmod(tmp, 0o644)
os.replace(tmp, record)
print(json.dumps(info))
"""


@register
class TorchEnv(Resource):
    type_name = "torch_env"
    params_model = TorchEnvParams
    description = "a virtualenv with a pinned torch built for every GPU on the host"
    params: TorchEnvParams

    def label(self) -> str:
        return f"torch_env {self.params.version} ({self.params.cuda})"

    def probes(self) -> Probes:
        return {
            "gpus": {
                "kind": "command",
                "cmd": "nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null; true",
            },
            "record": {"kind": "file", "path": paths.TORCH_ENV_RECORD},
        }

    def found_caps(self, state: State) -> list[tuple[str, Cap]]:
        out = []
        for line in (state.get("gpus") or {}).get("stdout", "").splitlines():
            name, _, cap = line.rpartition(",")
            if re.fullmatch(r"\s*\d+\.\d+\s*", cap):
                out.append((name.strip(), parse_cap(cap)))
        return out

    def plan(self, state: State) -> Change:
        p = self.params
        found = self.found_caps(state)
        gpus = found or declared_caps(self.host)  # what the host reports wins over what is declared
        build = choose_build(p.version, p.cuda, gpus)
        path = p.path or f"{paths.ENVS_DIR}/torch-{p.version}-{build}"
        record = state.get("record") or {}
        current: dict[str, Any] = {}
        if record.get("exists") and record.get("text"):
            try:
                current = json.loads(record["text"])
            except ValueError:
                current = {}
        if (
            str(current.get("version", "")).startswith(p.version)
            and current.get("python") == f"{path}/bin/python"
        ):
            return Change()
        python = p.python or self.host.python
        index = p.index_url if p.index_url is not None else f"https://download.pytorch.org/whl/{build}"
        pip = [f"{path}/bin/python", "-m", "pip", "install", "-q", f"torch=={p.version}", *p.packages]
        if index:
            pip += ["--index-url", index]
        change = Change()
        change.add(
            f"create {path} with torch {p.version}+{build} ({len(gpus)} GPU{'s' if len(gpus) != 1 else ''})",
            {"op": "mkdir", "path": paths.ENVS_DIR, "mode": 0o755},
            {"op": "run", "argv": [python, "-m", "venv", path], "timeout": 300},
            {"op": "run", "argv": pip, "timeout": 3600},
            {
                "op": "run",
                "argv": [
                    f"{path}/bin/python",
                    "-c",
                    VERIFY,
                    p.version,
                    str(len(gpus)),
                    paths.TORCH_ENV_RECORD,
                ],
                "timeout": 300,
            },
        )
        change.diffs.append(f"+ {shlex.join(pip)}\n")
        return change
