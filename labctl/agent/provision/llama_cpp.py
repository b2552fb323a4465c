"""Host side of the `llama_cpp` resource: llama.cpp's `llama-server`, built here from pinned sources.

The sources are the PyPI sdist of llama-cpp-python (a pinned version, checked by sha256), which
carries llama.cpp under vendor/llama.cpp: one file that pip's index keeps forever and that the
controller can fetch once and hand to every host. Only the `llama-server` target is built, with
everything that would reach the network at build or run time turned off (the web UI's download
from Hugging Face, HTTPS, FetchContent), static, so the installed binary runs from its folder.

A build runs in `.NAME.build-PID` beside its prefix; the binary and `build.json` go to
`.NAME.partial-PID`, which is renamed to the prefix once `llama-server --version` runs there.
A failed or killed build leaves no prefix behind (the next run removes what a killed one left),
and an install whose manifest matches (version, sources' sha256, CUDA architectures) is kept.
While it builds, progress lines go to stderr (`{"event": "progress", ...}`, as torch_env's) and
the tools' output to `NAME.log` beside the prefix.

The pure parts (which toolkit compiles for which GPU, which architectures a build needs and
covers, the cmake command line) are used by the controller's plan as well.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..cache.manifest import emit
from ..core import procs
from ..core.errors import AgentError
from ..core.fsutil import write_json
from ..core.spec import NUMBER, Or, Takes, command

# One folder per build: ROOT/<version>-<cpu|cuda-61_70>, where the orchestra's engine looks for
# llama-server (labctl/agent/orchestra/host.py ENGINE_ROOTS). Programs, not labctl's state: /opt.
ROOT = "/opt/labctl/llama.cpp"
SDIST_DIR = ROOT + "/src"  # the sdists the controller pushed
SERVER = "bin/llama-server"
MANIFEST = "build.json"
# llama-cpp-python sdists this code has built, by sha256 of the file on PyPI.
PINNED = {"0.3.36": "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"}
# ... and the llama.cpp commit each vendors (for the plan to show; the build reads it from the sdist).
COMMITS = {"0.3.36": "0c1e570"}
DEFAULT_VERSION = "0.3.36"
HEARTBEAT_S = 10.0
STEP_WORDS = {
    "check": "checking the sources",
    "unpack": "unpacking llama.cpp",
    "configure": "configuring the build",
    "compile": "compiling llama-server",
    "install": "installing",
    "done": "done",
}
BUILD_TIMEOUT_S = 3600.0  # a CPU build takes minutes on 2 cores; CUDA kernels take far longer
CUDA_BUILD_TIMEOUT_S = 4 * 3600.0
# Parts of the sdist no build reads: model vocabularies for tests, docs, images (115 of 217 MB).
SKIP_DIRS = ("models", "docs", "media", "benches")

Cap = Tuple[int, int]
Version = Tuple[int, int]

# Compute capability -> (the first CUDA toolkit whose nvcc compiles for it, the first that no longer
# does). From NVIDIA's release notes: CUDA 11.0 removed sm_30/32, 12.0 Kepler's sm_35/37, and 13.0
# everything before Turing (Maxwell sm_5x, Pascal sm_6x, Volta sm_70/72); sm_101 became sm_110.
ARCH_TOOLKITS: Dict[Cap, Tuple[Version, Optional[Version]]] = {
    (3, 0): ((4, 2), (11, 0)),
    (3, 2): ((6, 0), (11, 0)),
    (3, 5): ((5, 0), (12, 0)),
    (3, 7): ((6, 5), (12, 0)),
    (5, 0): ((6, 0), (13, 0)),
    (5, 2): ((6, 5), (13, 0)),
    (5, 3): ((7, 0), (13, 0)),
    (6, 0): ((8, 0), (13, 0)),
    (6, 1): ((8, 0), (13, 0)),
    (6, 2): ((8, 0), (13, 0)),
    (7, 0): ((9, 0), (13, 0)),
    (7, 2): ((10, 0), (13, 0)),
    (7, 5): ((10, 0), None),
    (8, 0): ((11, 0), None),
    (8, 6): ((11, 1), None),
    (8, 7): ((11, 4), None),
    (8, 9): ((11, 8), None),
    (9, 0): ((11, 8), None),
    (10, 0): ((12, 8), None),
    (10, 1): ((12, 8), (13, 0)),
    (10, 3): ((12, 9), None),
    (11, 0): ((13, 0), None),
    (12, 0): ((12, 8), None),
    (12, 1): ((12, 9), None),
}


# -- pure parts --------------------------------------------------------------------------------


def parse_cap(cc: Any) -> Cap:
    """(major, minor) of "6.1", "61", 61 or (6, 1)."""
    if isinstance(cc, (tuple, list)):
        return int(cc[0]), int(cc[1])
    text = str(cc).strip()
    if "." in text:
        major, _, minor = text.partition(".")
        return int(major), int(minor)
    if not (text.isascii() and text.isdigit() and len(text) >= 2):
        raise ValueError(f"{cc!r} is not a compute capability")
    return int(text[:-1]), int(text[-1])


def sm(cc: Cap) -> str:
    return f"sm_{cc[0]}{cc[1]}"


def parse_nvcc_version(text: str) -> Optional[str]:
    """ "12.4" from `nvcc --version`'s "Cuda compilation tools, release 12.4, V12.4.131"."""
    m = re.search(r"release ([0-9]+)\.([0-9]+)", text or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def _version(text: str) -> Optional[Version]:
    m = re.match(r"^\s*([0-9]+)\.([0-9]+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def toolkit_covers(nvcc_version: str, cc: Any, gpu: str = "") -> Tuple[Optional[bool], str]:
    """Whether the nvcc of CUDA `nvcc_version` compiles for compute capability `cc`, and why not:
    (True, ""), (False, reason with the toolkit to install), or (None, why it is not known)."""
    cap = parse_cap(cc)
    name = f"{sm(cap)} ({gpu})" if gpu else sm(cap)
    have = _version(nvcc_version)
    if have is None:
        return None, f"nvcc's version {nvcc_version!r} is not one labctl reads"
    known = ARCH_TOOLKITS.get(cap)
    if known is None:
        return None, f"labctl does not know which CUDA toolkits compile for {name}"
    first, dropped = known
    shown = f"{have[0]}.{have[1]}"
    if have < first:
        return (
            False,
            f"CUDA {shown} cannot compile for {name}: that came in CUDA {first[0]}.{first[1]}; install it or newer",
        )
    if dropped is not None and have >= dropped:
        last = f"{dropped[0] - 1}.x" if dropped[1] == 0 else f"older than {dropped[0]}.{dropped[1]}"
        return False, f"CUDA {shown} cannot compile for {name}; install CUDA {last}"
    return True, ""


def cuda_archs(caps: Sequence[Any]) -> List[str]:
    """CMAKE_CUDA_ARCHITECTURES entries for GPUs of `caps`: one per distinct capability, sorted
    ("61", "70"). A plain entry compiles both the GPU's code and PTX, which newer GPUs can JIT."""
    return [f"{a}{b}" for a, b in sorted({parse_cap(c) for c in caps})]


def flavor(archs: Sequence[str]) -> str:
    """The build's name part: "cpu" or "cuda-61_70"."""
    return "cuda-" + "_".join(archs) if archs else "cpu"


def default_prefix(version: str, archs: Sequence[str]) -> str:
    return f"{ROOT}/{version}-{flavor(archs)}"


def build_covers(archs: Sequence[str], cc: Any) -> Optional[str]:
    """How a build for `archs` runs on a GPU of `cc`: "sass" (its own machine code), "ptx" (JIT-
    compiled from an older architecture's PTX when first loaded: slower to start, and without the
    newer GPU's instructions), or None (it does not)."""
    cap = parse_cap(cc)
    how: Optional[str] = None
    for a in archs:
        m = re.match(r"^([0-9]+)([0-9])[af]?(-real|-virtual)?$", str(a))
        if not m:
            continue
        built = (int(m.group(1)), int(m.group(2)))
        real = m.group(3) != "-virtual"
        ptx = m.group(3) != "-real"
        if real and built[0] == cap[0] and built[1] <= cap[1]:
            return "sass"
        if ptx and built <= cap:
            how = "ptx"
    return how


def cuda_check(
    archs: Sequence[str], gpus: Sequence[Dict[str, Any]], nvcc_version: Optional[str]
) -> Dict[str, Any]:
    """Each GPU against a build for `archs` and the host's nvcc: {"gpus": [...], "problems": [...]}."""
    out: List[Dict[str, Any]] = []
    problems: List[str] = []
    for g in gpus:
        cap = parse_cap(g["compute_capability"])
        name = str(g.get("name") or "")
        entry: Dict[str, Any] = {"name": name, "compute_capability": f"{cap[0]}.{cap[1]}"}
        entry["build"] = build_covers(archs, cap) if archs else None
        if archs and entry["build"] is None:
            problems.append(f"the build ({', '.join(archs)}) has no code for {sm(cap)} ({name})")
        if nvcc_version:
            ok, why = toolkit_covers(nvcc_version, cap, name)
            entry["nvcc"], entry["nvcc_reason"] = ok, why
            if ok is False:
                problems.append(why)
        out.append(entry)
    return {"gpus": out, "problems": problems}


def cmake_args(
    src: str,
    build: str,
    version: str,
    archs: Sequence[str],
    nvcc: Optional[str] = None,
    ninja: bool = False,
    commit: str = "",
) -> List[str]:
    """The configure command: llama-server alone, static, nothing fetched at build or run time."""
    argv = ["cmake", "-S", src, "-B", build] + (["-G", "Ninja"] if ninja else [])
    argv += [
        "-DCMAKE_BUILD_TYPE=Release",
        # Static libllama/libggml: the binary needs only libc, libstdc++, libgomp (and CUDA's).
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_APP=OFF",
        "-DLLAMA_BUILD_TOOLS=ON",  # llama-server lives under tools/
        "-DLLAMA_BUILD_SERVER=ON",
        # The web UI is either built with npm or downloaded from a Hugging Face bucket at build
        # time; with both off the server embeds an empty asset table and serves the API only.
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_OPENSSL=OFF",  # no HTTPS client (model downloads), no libssl to find on the host
        "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
        "-DGGML_CCACHE=OFF",
        # The build runs on the host it serves, so the CPU code may use all of this CPU's
        # instructions (AVX2, AVX-512 ...): several times faster than the x86-64 baseline.
        "-DGGML_NATIVE=ON",
        # The sdist's .git file points at a submodule folder it does not carry, and a folder above
        # may be another repository: name the commit (read from the sdist) instead of asking git.
        "-DLLAMA_BUILD_NUMBER=0",
        f"-DLLAMA_BUILD_COMMIT={commit or 'llama-cpp-python-' + version}",
    ]
    if archs:
        argv += ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=" + ";".join(archs)]
        if nvcc:
            argv.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
    else:
        argv.append("-DGGML_CUDA=OFF")
    return argv


def build_args(build: str, jobs: int) -> List[str]:
    return ["cmake", "--build", build, "--target", "llama-server", "-j", str(jobs)]


def manifest_mismatch(
    manifest: Optional[Dict[str, Any]], version: str, sha256: str, archs: Sequence[str]
) -> Optional[str]:
    """Why the install a manifest describes is not the one wanted; None when it is."""
    if not manifest:
        return "nothing is installed there"
    if manifest.get("version") != version:
        return f"it holds llama-cpp-python {manifest.get('version')}'s llama.cpp, not {version}'s"
    if manifest.get("source_sha256") != sha256:
        return "it was built from other sources (another sha256)"
    if list(manifest.get("cuda_archs") or []) != list(archs):
        return f"it was built for {flavor(manifest.get('cuda_archs') or [])}, not {flavor(archs)}"
    return None


def sdist_version(path: str) -> Optional[str]:
    m = re.match(r"^llama_cpp_python-([0-9][0-9A-Za-z.+-]*)\.tar\.gz$", os.path.basename(path))
    return m.group(1) if m else None


# -- reading the host --------------------------------------------------------------------------


def _run(argv: List[str], timeout: float = 30.0) -> Tuple[Optional[int], str]:
    try:
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout
        )
    except FileNotFoundError as e:
        return 127, str(e)
    except PermissionError as e:
        return 126, str(e)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:g} s"
    return proc.returncode, proc.stdout.decode("utf-8", "replace")


def find_nvcc(nvcc: str = "") -> Optional[str]:
    if nvcc:
        return nvcc if os.access(nvcc, os.X_OK) else shutil.which(nvcc)
    found = shutil.which("nvcc")
    if found:
        return found
    default = "/usr/local/cuda/bin/nvcc"
    return default if os.access(default, os.X_OK) else None


def nvcc_info(nvcc: str = "") -> Optional[Dict[str, Any]]:
    path = find_nvcc(nvcc)
    if path is None:
        return None
    rc, out = _run([path, "--version"])
    return {"path": path, "version": parse_nvcc_version(out) if rc == 0 else None}


def host_gpus() -> List[Dict[str, Any]]:
    """The host's GPUs as nvidia-smi names them (none where it is missing or fails)."""
    rc, out = _run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"])
    gpus: List[Dict[str, Any]] = []
    if rc != 0:
        return gpus
    for line in out.splitlines():
        name, _, cap = line.rpartition(",")
        if re.fullmatch(r"\s*[0-9]+\.[0-9]+\s*", cap, re.ASCII):
            gpus.append({"name": name.strip(), "compute_capability": cap.strip()})
    return gpus


def server_version(binary: str) -> Tuple[Optional[str], Optional[str]]:
    """(what `llama-server --version` printed, None) or (None, why it did not run)."""
    if not os.path.isfile(binary):
        return None, f"{binary} is missing"
    rc, out = _run([binary, "--version"])
    text = out.strip()
    if rc != 0 or "version:" not in text:
        return None, f"{binary} --version exited {rc}: {text[-300:]}"
    return text, None


def read_manifest(prefix: str) -> Optional[Dict[str, Any]]:
    try:
        with open(os.path.join(prefix, MANIFEST), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def describe_install(prefix: str) -> Dict[str, Any]:
    manifest = read_manifest(prefix)
    out: Dict[str, Any] = {"prefix": prefix, "exists": os.path.isdir(prefix), "manifest": manifest}
    out["server_version"], out["error"] = server_version(os.path.join(prefix, SERVER))
    out["installed"] = bool(manifest) and out["error"] is None
    return out


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def probe(p: Dict[str, Any]) -> Dict[str, Any]:
    """What is installed: p = {root?, prefix?, nvcc?, sdist?} -> every build under root (or the one
    prefix), the sdist's sha256, the GPUs, nvcc, and the build tools; each build's CUDA check."""
    root = p.get("root") or ROOT
    prefixes: List[str] = []
    if p.get("prefix"):
        prefixes.append(p["prefix"])
    elif os.path.isdir(root):
        for name in sorted(os.listdir(root)):
            full = os.path.join(root, name)
            if not name.startswith(".") and os.path.isfile(os.path.join(full, MANIFEST)):
                prefixes.append(full)
    gpus = host_gpus()
    nvcc = nvcc_info(p.get("nvcc") or "")
    installs = {}
    for prefix in prefixes:
        entry = describe_install(prefix)
        archs = (entry["manifest"] or {}).get("cuda_archs") or []
        if gpus:
            entry["cuda"] = cuda_check(archs, gpus, (nvcc or {}).get("version"))
        installs[prefix] = entry
    sdist: Dict[str, Any] = {}
    if p.get("sdist"):
        path = p["sdist"]
        sdist = {"path": path, "exists": os.path.isfile(path)}
        if sdist["exists"]:
            sdist["sha256"] = sha256_of(path)
    return {
        "installs": installs,
        "sdist": sdist,
        "gpus": gpus,
        "nvcc": nvcc,
        "tools": {n: shutil.which(n) for n in ("cmake", "c++", "cc", "ninja")},
        "cpus": os.cpu_count() or 1,
    }


# -- building ----------------------------------------------------------------------------------


class Failed(Exception):
    def __init__(self, cause: str, hint: str = "") -> None:
        super().__init__(cause)
        self.cause = cause
        self.hint = hint


def remove_stale(parent: str, base: str) -> List[str]:
    """Build, partial and old folders of `base` whose builder is gone (killed, or a reboot)."""
    removed = []
    pattern = re.compile(re.escape("." + base) + r"\.(build|partial|old)-([0-9]+)\Z")
    for name in os.listdir(parent) if os.path.isdir(parent) else []:
        m = pattern.match(name)
        if m and (int(m.group(2)) == os.getpid() or not procs.alive(int(m.group(2)))):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            removed.append(name)
    return removed


def extract_llama_cpp(sdist: str, dest: str) -> Tuple[str, Optional[str]]:
    """Unpack the sdist's vendor/llama.cpp (less what no build reads) into `dest`: its path, and
    the llama.cpp commit the sdist was made from (its git submodule's HEAD, which it carries)."""
    real_dest = os.path.realpath(dest)
    commit: Optional[str] = None
    with tarfile.open(sdist, "r:gz") as tar:
        members = []
        top = ""
        for m in tar.getmembers():
            parts = m.name.split("/")
            if parts[1:] == [".git", "modules", "vendor", "llama.cpp", "HEAD"] and m.isfile():
                f = tar.extractfile(m)
                head = f.read(100).decode("ascii", "replace").strip() if f else ""
                commit = head if re.fullmatch(r"[0-9a-f]{40}", head) else None
                continue
            if len(parts) < 3 or parts[1:3] != ["vendor", "llama.cpp"]:
                continue
            top = parts[0]
            if len(parts) > 3 and parts[3] in SKIP_DIRS:
                continue
            target = os.path.realpath(os.path.join(dest, m.name))
            if not (m.isfile() or m.isdir()) or not target.startswith(real_dest + os.sep):
                raise Failed(f"{sdist} holds {m.name!r}, a link or a path outside its folder")
            members.append(m)
        if not members:
            raise Failed(f"{sdist} has no vendor/llama.cpp: not a llama-cpp-python sdist")
        tar.extractall(dest, members=members)
    return os.path.join(dest, top, "vendor", "llama.cpp"), commit


class Build:
    """One build of llama-server into a prefix (see the module's docstring)."""

    def __init__(self, args: Dict[str, Any]) -> None:
        self.args = args
        self.prefix = os.path.abspath(args["prefix"])
        self.parent, self.base = os.path.split(self.prefix)
        self.work = os.path.join(self.parent, f".{self.base}.build-{os.getpid()}")
        self.partial = os.path.join(self.parent, f".{self.base}.partial-{os.getpid()}")
        self.log_path = os.path.join(self.parent, self.base + ".log")
        self.archs = [str(a) for a in args["cuda_archs"]]
        self.start = time.monotonic()
        self.step = ""
        self.step_start = self.start
        self.log: Any = None

    def progress(self, step: Optional[str] = None, detail: str = "") -> None:
        now = time.monotonic()
        if step is not None:
            self.step, self.step_start = step, now
        emit(
            {
                "event": "progress",
                "step": self.step,
                "what": STEP_WORDS.get(self.step, self.step),
                "elapsed": round(now - self.start, 1),
                "step_elapsed": round(now - self.step_start, 1),
                "detail": detail[:300],
            }
        )

    def tool(self, argv: List[str], timeout: float, what: str) -> None:
        """Run `argv` with its output into the log, reporting its last line every HEARTBEAT_S."""
        self.log.write(f"\n$ {' '.join(argv)}\n")
        self.log.flush()
        env = dict(os.environ)
        # git must not read a repository that happens to hold the build folder (a checkout):
        # the version then named would be that repository's commit.
        env["GIT_CEILING_DIRECTORIES"] = self.parent
        mark = self.log.tell()
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=env
        )
        beat = float(self.args.get("heartbeat_s") or HEARTBEAT_S)
        if not procs.wait_beating(proc, timeout, beat, lambda: self.progress(detail=self._last_line())):
            raise Failed(f"{what} ran past {timeout:.0f} s", "Look at the log for where it stalled.")
        if proc.returncode != 0:
            raise Failed(f"{what} exited {proc.returncode}: {self._error_line(mark)}")

    def _tail(self, since: int = 0) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(max(since, os.path.getsize(self.log_path) - 65536))
            return f.read().decode("utf-8", "replace")

    def _last_line(self) -> str:
        lines = [line for line in self._tail().splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""

    def _error_line(self, since: int) -> str:
        lines = [line.strip() for line in self._tail(since).splitlines() if line.strip()]
        for line in lines:
            if re.search(r"(error|Error|ERROR)\b", line):
                return line[:500]
        return lines[-1][:500] if lines else "it printed nothing"

    def check_tools(self) -> Tuple[Optional[str], Optional[str]]:
        """(nvcc, its version) for a CUDA build, (None, None) for a CPU one; Failed if a tool is
        missing or the toolkit cannot compile for an architecture asked for."""
        missing = [n for n in ("cmake", "c++") if shutil.which(n) is None]
        if missing:
            raise Failed(
                f"{' and '.join(missing)} not found on this host",
                "Install a compiler and cmake (apt-get install build-essential cmake).",
            )
        if not self.archs:
            return None, None
        nvcc = find_nvcc(self.args.get("nvcc") or "")
        if nvcc is None:
            raise Failed(
                "a CUDA build needs nvcc, and it is neither on PATH nor /usr/local/cuda/bin/nvcc",
                "Install a CUDA toolkit (12.x for Pascal or Volta GPUs), or give the resource nvcc: PATH.",
            )
        rc, out = _run([nvcc, "--version"])
        version = parse_nvcc_version(out) if rc == 0 else None
        for a in self.archs:
            ok, why = toolkit_covers(version or "", a)
            if ok is False:
                raise Failed(why, "Point nvcc: at a toolkit that compiles for every GPU of the host.")
        return nvcc, version

    def run(self) -> Dict[str, Any]:
        args = self.args
        sdist = os.path.abspath(args["sdist"])
        version = args["version"] or sdist_version(sdist)
        if not version:
            raise Failed(
                f"{sdist} is not named like an sdist of llama-cpp-python (llama_cpp_python-X.Y.Z.tar.gz)"
            )
        if not os.path.isfile(sdist):
            raise Failed(
                f"the sources {sdist} are not on this host", "The controller pushes them before it builds."
            )
        self.progress("check", f"sha256 of {os.path.basename(sdist)}")
        digest = sha256_of(sdist)
        want = args["sha256"] or PINNED.get(version)
        if want and digest != want:
            raise Failed(
                f"{sdist} has sha256 {digest}, not the pinned {want}",
                "Remove it; the controller pushes the pinned sdist again.",
            )
        have = describe_install(self.prefix)
        if have["installed"] and manifest_mismatch(have["manifest"], version, digest, self.archs) is None:
            return {
                "prefix": self.prefix,
                "built": False,
                "manifest": have["manifest"],
                "server_version": have["server_version"],
            }
        if os.path.lexists(self.prefix) and not os.path.isfile(os.path.join(self.prefix, MANIFEST)):
            raise Failed(
                f"{self.prefix} exists and is not a llama.cpp build of labctl's; it is not replaced",
                "Move it away, or give the resource another prefix:.",
            )
        nvcc, nvcc_version = self.check_tools()
        os.makedirs(self.parent, mode=0o755, exist_ok=True)
        stale = remove_stale(self.parent, self.base)
        with open(self.log_path, "w") as self.log:
            if stale:
                self.log.write(f"removed folders a stopped build left: {', '.join(stale)}\n")
            try:
                info = self._build(sdist, version, digest, nvcc, nvcc_version)
            finally:
                shutil.rmtree(self.work, ignore_errors=True)
                shutil.rmtree(self.partial, ignore_errors=True)
        self.progress("done", f"{self.prefix} in {info['manifest']['build_seconds']:.0f} s")
        return info

    def _build(
        self, sdist: str, version: str, digest: str, nvcc: Optional[str], nvcc_version: Optional[str]
    ) -> Dict[str, Any]:
        self.progress("unpack", sdist)
        os.makedirs(self.work)
        src, commit = extract_llama_cpp(sdist, os.path.join(self.work, "src"))
        build = os.path.join(self.work, "build")
        jobs = int(self.args["jobs"] or os.cpu_count() or 1)
        timeout = float(self.args["timeout"] or (CUDA_BUILD_TIMEOUT_S if self.archs else BUILD_TIMEOUT_S))
        ninja = shutil.which("ninja") is not None
        configure = cmake_args(src, build, version, self.archs, nvcc, ninja, commit[:7] if commit else "")
        self.progress("configure", " ".join(configure[5:]))
        self.tool(configure, 600, "cmake (configure)")
        self.progress("compile", f"llama-server with {jobs} jobs")
        self.tool(
            build_args(build, jobs), max(60.0, timeout - (time.monotonic() - self.start)), "cmake --build"
        )
        built = os.path.join(build, SERVER)
        if not os.path.isfile(built):
            raise Failed(f"the build finished without {SERVER}")
        self.progress("install", self.prefix)
        os.makedirs(os.path.join(self.partial, "bin"))
        shutil.copy2(built, os.path.join(self.partial, SERVER))
        for name in ("LICENSE",):
            if os.path.isfile(os.path.join(src, name)):
                shutil.copy2(os.path.join(src, name), os.path.join(self.partial, name))
        text, err = server_version(os.path.join(self.partial, SERVER))
        if err:
            raise Failed(f"the new llama-server does not run: {err}")
        manifest = {
            "version": version,
            "source_sha256": digest,
            "llama_cpp_commit": commit,
            "cuda_archs": self.archs,
            "nvcc": nvcc_version,
            "nvcc_path": nvcc,
            "built_at": time.time(),
            "build_seconds": round(time.monotonic() - self.start, 1),
            "jobs": jobs,
            "cmake_args": configure[5:],
            "server_version": text,
        }
        write_json(os.path.join(self.partial, MANIFEST), manifest, mode=0o644)
        os.chmod(self.partial, 0o755)
        old = os.path.join(self.parent, f".{self.base}.old-{os.getpid()}")
        if os.path.lexists(self.prefix):
            os.rename(self.prefix, old)
        os.rename(self.partial, self.prefix)
        shutil.rmtree(old, ignore_errors=True)
        # Verified where it now lives: a binary that only ran from the partial name is no install.
        text, err = server_version(os.path.join(self.prefix, SERVER))
        if err:
            shutil.rmtree(self.prefix, ignore_errors=True)
            raise Failed(f"llama-server does not run from {self.prefix}: {err}")
        return {"prefix": self.prefix, "built": True, "manifest": manifest, "server_version": text}


def build(args: Dict[str, Any]) -> Dict[str, Any]:
    """Build llama-server into args["prefix"] (see Build); AgentError("llama_cpp") names the cause
    and the log. Arguments as `build_command` takes them, all of them present."""
    b = Build(args)
    try:
        return b.run()
    except Failed as e:
        log = b.log_path if b.log is not None else ""
        emit({"event": "failed", "step": b.step, "error": e.cause, "hint": e.hint, "log": log})
        raise AgentError(f"{e.cause}." + (f" Full log: {log}" if log else ""), "llama_cpp") from None


BUILD_SPEC = {
    "sdist": "str",
    "prefix": "str",
    "cuda_archs": Or(["any"], []),
    "jobs": Or("int", 0),
    "version": Or("str", ""),
    "sha256": Or("str", ""),
    "nvcc": Or("str", ""),
    "timeout": Or(NUMBER, 0),
    "heartbeat_s": Or(NUMBER, 0),
}


@command(
    takes=BUILD_SPEC,
    answers={"prefix": "str", "built": "bool", "manifest": {}, "server_version": "str?"},
)
def build_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """args: {sdist, prefix, cuda_archs?, jobs?, version?, sha256?, nvcc?, timeout?} ->
    {prefix, built, manifest, server_version}; `built` is false when the install was kept."""
    return build(args)


@command(
    takes={"root": Or("str", ""), "prefix": Or("str", ""), "nvcc": Or("str", ""), "sdist": Or("str", "")},
    answers={
        "installs": {"*": {"prefix": "str", "installed": "bool", "manifest": ({}, "null"), "error": "str?"}},
        "gpus": [{"name": "str", "compute_capability": "cap"}],
        "nvcc": ({"path": "str", "version": "str?"}, "null"),
    },
)
def probe_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """args: {root?, prefix?, nvcc?, sdist?} -> see `provision.probe`."""
    return probe(args)


def build_op(op: Dict[str, Any]) -> str:
    """The `llama_cpp` apply op (the resource's plan): build, or keep what matches."""
    args = Takes(BUILD_SPEC).apply({k: v for k, v in op.items() if k != "op"}, "llama_cpp")
    info = build(args)
    if not info["built"]:
        return f"kept {info['prefix']} (it matches)"
    return f"built llama-server into {info['prefix']} in {info['manifest']['build_seconds']:.0f} s"
