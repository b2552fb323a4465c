"""`llama_cpp`: llama.cpp's `llama-server` on a host, built there from pinned sources.

    - llama_cpp: {}                          # CUDA for the host's GPUs, else CPU
    - llama_cpp: {cuda: cpu, jobs: 2}        # CPU-only, whatever GPUs the host has
    - llama_cpp: {cuda: "61,70", nvcc: /usr/local/cuda-12.4/bin/nvcc}

The sources are llama-cpp-python's sdist from PyPI (it vendors llama.cpp), pinned by version and
sha256. The controller downloads it once into its cache (`sdist_cache()`) and pushes
it to each host that lacks it: hosts need no index and no network, one download serves the lab,
and every host builds the very same bytes. The host builds `llama-server` alone, static, with no
web UI and nothing fetched, into PREFIX/bin/llama-server beside a build.json manifest, and puts
it in place only once it runs (labctl/agent/provision/llama_cpp.py).

For GPUs it compiles CUDA kernels for each distinct compute capability the host reports
(nvidia-smi, else the inventory), with the host's nvcc, and refuses a toolkit that cannot compile
for one of them before anything is built: CUDA 13 dropped Maxwell, Pascal and Volta (a Tesla P40
needs CUDA 12.x), and an old toolkit lacks newer GPUs.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from pydantic import Field

from labctl.agent.provision.llama_cpp import (
    COMMITS,
    DEFAULT_VERSION,
    PINNED,
    ROOT,
    SDIST_DIR,
    SERVER,
    build_args,
    cmake_args,
    cuda_archs,
    default_prefix,
    flavor,
    manifest_mismatch,
    parse_cap,
    sm,
    toolkit_covers,
)
from labctl.inventory.model import HostPath
from labctl.output.errors import HostError, LabctlError
from labctl.provision.resource import Change, Params, PlanError, Probes, Resource, State, probe_error
from labctl.provision.resources.torch_env import declared_caps, progress_line

if TYPE_CHECKING:
    from labctl.hosts.fanout import HostRun

BUILD_TIMEOUT_S = 3600  # a CPU build: minutes on 2 cores
CUDA_BUILD_TIMEOUT_S = 4 * 3600  # CUDA kernels for two architectures: an hour or more on few cores


def sdist_name(version: str) -> str:
    return f"llama_cpp_python-{version}.tar.gz"


def sdist_cache() -> Path:
    """Where the controller keeps the sdists it pushes (XDG_CACHE_HOME/labctl/llama.cpp)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "labctl" / "llama.cpp"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cached_sdist(
    version: str, sha256: str, cache: Optional[Path] = None, python: str = sys.executable
) -> Path:
    """The sdist of llama-cpp-python `version` in the cache, downloaded by pip if missing, and
    checked against `sha256` either way."""
    folder = cache or sdist_cache()
    path = folder / sdist_name(version)
    if path.is_file() and _sha256(path) == sha256:
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=folder) as tmp:
        argv = [
            python,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--disable-pip-version-check",
        ]
        argv += ["-d", tmp, f"llama-cpp-python=={version}"]
        proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        got = Path(tmp) / sdist_name(version)
        if proc.returncode != 0 or not got.is_file():
            why = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["it wrote no sdist"]
            raise LabctlError(
                f"pip could not download llama-cpp-python {version}'s sources: {why[0]}",
                f"Put {sdist_name(version)} (from PyPI) into {folder} by hand, e.g. `pip download --no-deps "
                f"--no-binary :all: llama-cpp-python=={version} -d {folder}` where PyPI is reachable.",
            )
        digest = _sha256(got)
        if digest != sha256:
            raise LabctlError(
                f"the downloaded {sdist_name(version)} has sha256 {digest}, not the pinned {sha256}.",
                "Check the index pip uses (a mirror serving other bytes); nothing was kept.",
            )
        os.replace(got, path)
    return path


class LlamaCppParams(Params):
    version: str = Field(
        DEFAULT_VERSION,
        pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$",
        description="llama-cpp-python version whose vendored llama.cpp is built, e.g. version: 0.3.36",
    )
    sha256: Optional[str] = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="sha256 of that sdist; needed only for a version labctl has no pin for",
    )
    cuda: str = Field(
        "auto",
        pattern=r"^(auto|cpu|[0-9]{2,3}(,[0-9]{2,3})*)$",
        description='auto (the host\'s GPUs, else CPU), cpu, or architectures, e.g. cuda: "61,70"',
    )
    prefix: Optional[HostPath] = Field(
        None, description=f"install folder (default {ROOT}/VERSION-cpu or VERSION-cuda-61_70)"
    )
    nvcc: Optional[str] = Field(
        None, description="the CUDA compiler (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc)"
    )
    jobs: int = Field(0, ge=0, description="parallel compile jobs (default 0: every CPU of the host)")
    timeout_s: Optional[int] = Field(
        None,
        gt=0,
        description=f"build time limit (default {BUILD_TIMEOUT_S} s, CUDA {CUDA_BUILD_TIMEOUT_S} s)",
    )


class LlamaCpp(Resource):
    type_name = "llama_cpp"
    params_model = LlamaCppParams
    description = "llama.cpp's llama-server, built on the host from pinned sources (CPU or its GPUs)"
    params: LlamaCppParams

    def label(self) -> str:
        return f"llama_cpp {self.params.version} ({self.params.cuda})"

    def sha256(self) -> str:
        p = self.params
        found = p.sha256 or PINNED.get(p.version)
        if not found:
            raise PlanError(
                f"labctl has no sha256 pinned for llama-cpp-python {p.version}.",
                f"Give it, e.g. sha256: <the sdist's sha256 on pypi.org>, or use version: {DEFAULT_VERSION}.",
            )
        return found

    def host_sdist(self) -> str:
        """Where the host keeps the sources: src/ beside the builds (ROOT/src by default)."""
        folder = (
            f"{posixpath.dirname(self.params.prefix.rstrip('/'))}/src" if self.params.prefix else SDIST_DIR
        )
        return f"{folder}/{sdist_name(self.params.version)}"

    def probes(self) -> Probes:
        return {
            "llama": {
                "kind": "llama_cpp",
                "root": ROOT,
                "prefix": self.params.prefix or "",
                "nvcc": self.params.nvcc or "",
                "sdist": self.host_sdist(),
            }
        }

    def gpus(self, found: dict[str, Any]) -> list[tuple[str, tuple[int, int]]]:
        """(name, capability) of each GPU: what nvidia-smi said on the host, else the inventory."""
        reported = [
            (str(g.get("name") or ""), parse_cap(g["compute_capability"])) for g in found.get("gpus") or []
        ]
        return reported or declared_caps(self.host)

    def archs(self, found: dict[str, Any]) -> tuple[list[str], list[tuple[str, tuple[int, int]]]]:
        cuda = self.params.cuda
        if cuda == "cpu":
            return [], []
        if cuda != "auto":
            return cuda_archs(cuda.split(",")), []
        gpus = self.gpus(found)
        return cuda_archs([c for _, c in gpus]), gpus

    def check_toolkit(
        self, found: dict[str, Any], archs: list[str], gpus: list[tuple[str, tuple[int, int]]]
    ) -> str:
        """The host's nvcc, refused where it cannot compile for one of `archs` (named by its GPU)."""
        nvcc = found.get("nvcc") or {}
        if not nvcc.get("path"):
            raise PlanError(
                f"a CUDA build ({', '.join(archs)}) needs nvcc, and {self.host.name} has none on PATH "
                "nor at /usr/local/cuda/bin/nvcc.",
                "Install a CUDA toolkit (12.x keeps Pascal and Volta), give nvcc: PATH, or use cuda: cpu.",
            )
        names = {f"{c[0]}{c[1]}": n for n, c in gpus}
        for a in archs:
            ok, why = toolkit_covers(str(nvcc.get("version") or ""), a, names.get(a, ""))
            if ok is False:
                raise PlanError(
                    f"{self.host.name}: {why}.",
                    "Point nvcc: at an older or newer toolkit as it says, or leave that GPU out with cuda: ARCHS.",
                )
        return str(nvcc["path"])

    def plan(self, state: State) -> Change:
        p = self.params
        err = probe_error(state, "llama")
        if err:
            raise PlanError(f"could not read llama.cpp's state on {self.host.name}: {err}")
        found = state.get("llama") or {}
        sha = self.sha256()
        archs, gpus = self.archs(found)
        nvcc = self.check_toolkit(found, archs, gpus) if archs else None
        prefix = p.prefix or default_prefix(p.version, archs)
        entry = (found.get("installs") or {}).get(prefix) or {}
        why = manifest_mismatch(entry.get("manifest"), p.version, sha, archs)
        if why is None and entry.get("installed"):
            return Change()
        if why is None:
            why = f"its llama-server does not run ({entry.get('error')})"
        change = Change()
        sdist = found.get("sdist") or {}
        if sdist.get("sha256") != sha:
            change.add(
                f"upload {sdist_name(p.version)} to {self.host_sdist()} (from the controller's cache)",
                {"op": "upload_sdist", "version": p.version, "sha256": sha, "path": self.host_sdist()},
            )
        jobs = p.jobs or int(found.get("cpus") or 1)
        timeout = p.timeout_s or (CUDA_BUILD_TIMEOUT_S if archs else BUILD_TIMEOUT_S)
        what = "CPU" if not archs else "CUDA " + ", ".join(sm(parse_cap(a)) for a in archs)
        change.add(
            f"build llama-server of llama-cpp-python {p.version} ({what}) into {prefix}: {why}",
            {
                "op": "llama_cpp",
                "sdist": self.host_sdist(),
                "sha256": sha,
                "version": p.version,
                "prefix": prefix,
                "cuda_archs": archs,
                "nvcc": nvcc or "",
                "jobs": jobs,
                "timeout": timeout,
            },
        )
        shown = cmake_args("SRC", "BUILD", p.version, archs, nvcc, commit=COMMITS.get(p.version, ""))
        change.diffs.append(f"+ {shlex.join(shown)}\n+ {shlex.join(build_args('BUILD', jobs))}\n")
        change.diffs.append(f"+ {prefix}/{SERVER}, {prefix}/build.json ({flavor(archs)})\n")
        return change

    def apply(self, run: HostRun, change: Change) -> None:
        """Push the sdist where the plan says the host lacks it, then the agent builds (progress
        shown as it comes and kept in `events`; a failure reported by its cause)."""
        from rich.markup import escape

        from labctl.hosts.agent_ship import AgentFailed, agent_event, call_agent

        ctx = run.ctx
        ops = []
        for op in change.ops:
            if op["op"] == "upload_sdist":
                local = cached_sdist(op["version"], op["sha256"])
                run.conn.put_bytes(local.read_bytes(), op["path"], mode=0o644, dir_mode=0o755)
            else:
                ops.append(op)
        failure: dict[str, Any] = {}

        def on_line(stream: str, line: str) -> None:
            event = agent_event(stream, line, "progress", "failed")
            if event is None:
                return
            self.events.append({k: v for k, v in event.items() if k != "hint"})
            if event["event"] == "failed":
                failure.update(event)
            elif not ctx.json_mode:
                ctx.console.print(
                    f"[dim]{escape(progress_line(run.host.name, self.label(), event))}[/]", soft_wrap=True
                )

        timeout = max(int(op.get("timeout") or BUILD_TIMEOUT_S) for op in ops) + 900 if ops else 600
        try:
            call_agent(run, "provision.apply", {"ops": ops}, timeout=timeout, on_line=on_line)
        except AgentFailed:
            if not failure:
                raise
            log = f" Full log: {run.host.name}:{failure['log']}." if failure.get("log") else ""
            raise HostError(f"{failure['error']}.{log}", str(failure.get("hint") or "")) from None
