"""Gather the wheels `make gpu-check` needs on a GPU machine that has no network.

That machine brings PyTorch, safetensors, typer, rich, PyYAML, prometheus-client, nvidia-ml-py
and psutil, on CPython 3.12 for x86-64; labctl also needs pydantic, paramiko and what they
pull in, and the `hf` extra (transformers, tokenizers, gguf, jinja2) for the orchestra_hf section. This downloads labctl's core dependencies and everything they require, at exactly
the versions installed in this checkout's venv (so the GPU run imports what the tests
tried), as wheels for CPython 3.12 on manylinux x86-64 into `.whl/` (ignored by git; name it
where the checkout is copied to the GPU machine). bench/gpu_check.sh installs them there.

    .venv/bin/python bench/gpu_wheels.py            # -> .whl/*.whl
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution, requires
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# The GPU machine's interpreter and platform; manylinux tags from newest to oldest glibc,
# since pip matches a wheel's tag exactly.
PYTHON = "3.12"
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (39, 38, 35, 34, 31, 28, 27, 24, 17)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]
# Where the requirement markers are evaluated: the GPU machine, not this one.
TARGET_ENV = {
    "python_version": PYTHON,
    "python_full_version": PYTHON + ".3",
    "platform_system": "Linux",
    "sys_platform": "linux",
    "platform_machine": "x86_64",
    "platform_python_implementation": "CPython",
    "implementation_name": "cpython",
    "os_name": "posix",
    "extra": "",
}


def _requirement(text: str) -> Any:
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip vendors it
        from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment,unused-ignore]
    return Requirement(text)


# Extras whose packages the GPU run imports too: the orchestra_hf section serves a Hugging Face model.
EXTRAS = ("hf",)
# What the GPU machine's own PyTorch install brings: its versions stay (another numpy beside its
# torch could break it), so these are neither downloaded nor followed.
PROVIDED = {"torch", "numpy", "safetensors"}


def closure(root: str) -> dict[str, str]:
    """name -> installed version for `root`'s core requirements, those of its EXTRAS, and theirs."""
    found: dict[str, str] = {}
    todo = [r for r in requires(root) or []]
    for extra in EXTRAS:
        wanted = {**TARGET_ENV, "extra": extra}
        for r in requires(root) or []:
            req = _requirement(r)
            if req.marker is not None and req.marker.evaluate(wanted):
                todo.append(req.name)  # the marker names the extra: taken here, without it
    while todo:
        req = _requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate(TARGET_ENV):
            continue
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name in found or name in PROVIDED or name.startswith("nvidia-"):
            continue
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            raise SystemExit(f"{name} is not installed in this venv: run `make install` first") from None
        found[name] = dist.version
        todo += dist.requires or []
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dest", type=Path, default=REPO / ".whl", help="folder for the wheels (default .whl)")
    args = ap.parse_args()
    pins = closure("labctl")
    if args.dest.exists():
        shutil.rmtree(args.dest)  # one version of each: two would stop the whole install there
    args.dest.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", PYTHON, "--implementation", "cp", "-d", str(args.dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    cmd += [f"{n}=={v}" for n, v in sorted(pins.items())]
    print(f"downloading {len(pins)} wheels for CPython {PYTHON} x86-64: " + ", ".join(sorted(pins)))
    subprocess.run(cmd, check=True)
    wheels = sorted(args.dest.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    print(f"{len(wheels)} wheels, {size / 2**20:.1f} MiB in {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
