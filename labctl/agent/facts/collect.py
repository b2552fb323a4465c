"""`facts.collect`: what this host has, gathered in one process.

Each section is gathered on its own thread, so the slow ones (nvidia-smi, docker, importing
torch) overlap, and on its own terms: a section that raises or overruns records
`{"error": ..., "kind": ...}` and the rest still come back.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Tuple

from .. import AGENT_VERSION
from ..core import dockersock
from ..core.errors import AgentError
from ..core.gpus import GPU, gather_gpus, torch_facts
from ..core.launch import torch_env_facts
from ..core.parsers import memory_from_meminfo, parse_cpuinfo, parse_meminfo, parse_os_release
from ..core.spec import Opt, command
from .nics import gather_nics
from .storage import gather_disks, gather_mounts

# What this feature's answers share (labctl/agent/core/spec.py's shape language).
ERROR_ENTRY = {"error": "any"}  # what a section that failed holds instead of its value


TORCH = {
    "installed?": "bool",
    "version?": "str?",
    "cuda?": "str?",
    "cuda_available?": "bool",
    "arch_list?": ["str"],
    "nccl?": "str?",
    "error?": "str?",
    "cuda_error?": "str?",
}
NIC = {
    "name": "str",
    "operstate?": "str?",
    "speed_mbps?": "num?",
    "addresses?": ["str"],
    "is_bond?": "bool",
    "master?": "str?",
    "virtual?": "bool",
    "bond?": ({"mode?": "str?", "mii_status?": "str?", "slaves?": [{"name?": "str?"}]}, "null"),
}
FACTS = {
    "os?": {"system?": "str?", "distro?": ({"id?": "str?", "version_id?": "str?"}, "null")},
    "cpu?": {"logical_cpus?": "int?", "physical_cores?": "int?", "model?": "str?"},
    "memory?": {"total_bytes?": "int", "available_bytes?": "int"},
    "gpu_source?": "str",
    "gpus?": ([GPU], ERROR_ENTRY),
    "nics?": ([NIC], ERROR_ENTRY),
    "mounts?": (
        [
            {
                "mountpoint": "str",
                "fstype?": "str?",
                "size_bytes?": "int?",
                "used_bytes?": "int?",
                "free_bytes?": "int?",
            }
        ],
        ERROR_ENTRY,
    ),
    "disks?": ([{"size_bytes?": "int?", "removable?": "bool?"}], ERROR_ENTRY),
    "python?": {"version?": "str"},
    "torch?": TORCH,
    "torch_env?": {},  # the provisioning record on the host, shown as it is
    "docker?": {"cli?": "str?", "server_version?": "str?"},
    "labctl?": {},
}

DOCKER_TIMEOUT_S = 3.0
DEFAULT_TIMEOUT_S = 30.0
DOCKER_SOCKET = "/var/run/docker.sock"


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def os_facts() -> Dict[str, Any]:
    # os.uname, not platform.uname: on 3.8 the latter also runs `uname -p` in a subprocess.
    uname = os.uname() if hasattr(os, "uname") else platform.uname()
    # Both are tuples in the same order: system, node, release, version, machine.
    system, _node, release, kernel, machine = tuple(uname)[:5]
    distro: Dict[str, Any] = {"id": None, "version_id": None, "pretty_name": None}
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            os_release = parse_os_release(_read(path))
        except OSError:
            continue
        distro = {
            "id": os_release.get("ID"),
            "version_id": os_release.get("VERSION_ID"),
            "pretty_name": os_release.get("PRETTY_NAME"),
        }
        break
    uptime = None
    try:
        uptime = float(_read("/proc/uptime").split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return {
        "system": system,
        "release": release,
        "kernel": kernel,
        "distro": distro,
        "hostname": socket.gethostname(),
        "arch": machine,
        "uptime_s": uptime,
        "systemd": os.path.isdir("/run/systemd/system"),
    }


def cpu_facts() -> Dict[str, Any]:
    info = parse_cpuinfo(_read("/proc/cpuinfo"))
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    load = None
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        pass
    info.update({"cpu_count": os.cpu_count(), "usable_cpus": usable, "load_avg": load})
    return info


def memory_facts() -> Dict[str, Any]:
    return memory_from_meminfo(parse_meminfo(_read("/proc/meminfo")))


def gpu_facts() -> Dict[str, Any]:
    source, gpus = gather_gpus()
    return {"source": source, "gpus": gpus}


def python_facts() -> Dict[str, Any]:
    return {
        "version": platform.python_version(),
        "executable": sys.executable,
        "implementation": platform.python_implementation(),
        "prefix": sys.prefix,
        "venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix),
    }


def _local_daemon() -> bool:
    """Whether the docker CLI here would talk to the daemon on DOCKER_SOCKET: no DOCKER_HOST and
    no context of the CLI's config pointing elsewhere (then only the CLI knows where it goes)."""
    if os.environ.get("DOCKER_HOST") or os.environ.get("DOCKER_CONTEXT"):
        return False
    config = os.path.join(os.environ.get("DOCKER_CONFIG") or os.path.expanduser("~/.docker"), "config.json")
    try:
        with open(config) as f:
            current = json.load(f).get("currentContext")
    except (OSError, ValueError, AttributeError):
        return True
    return current in (None, "", "default")


def docker_facts() -> Dict[str, Any]:
    cli = shutil.which("docker")
    facts: Dict[str, Any] = {
        "cli": cli,
        "socket": os.path.exists(DOCKER_SOCKET),
        "server_version": None,
    }
    if cli is None:
        return facts
    if facts["socket"] and _local_daemon():
        version, error = dockersock.server_version(DOCKER_SOCKET, DOCKER_TIMEOUT_S)
        if error == "timeout":
            error = f"docker version did not answer in {DOCKER_TIMEOUT_S:.0f} s"
        facts["server_version"] = version
        if error is not None:
            facts["server_error"] = error
        return facts
    try:
        proc = subprocess.run(
            [cli, "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=DOCKER_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        facts["server_error"] = f"docker version did not answer in {DOCKER_TIMEOUT_S:.0f} s"
        return facts
    version = proc.stdout.strip()
    if proc.returncode == 0 and version:
        facts["server_version"] = version
    else:
        lines = proc.stderr.strip().splitlines()
        facts["server_error"] = lines[-1][:300] if lines else f"docker version exited {proc.returncode}"
    return facts


# Section name -> gatherer, in the order they appear in the answer.
SECTIONS: Dict[str, Callable[[], Any]] = {
    "os": os_facts,
    "cpu": cpu_facts,
    "memory": memory_facts,
    "gpus": gpu_facts,
    "nics": gather_nics,
    "mounts": gather_mounts,
    "disks": gather_disks,
    "python": python_facts,
    "torch": torch_facts,
    "torch_env": torch_env_facts,
    "docker": docker_facts,
}
LINUX_ONLY = frozenset(("cpu", "memory", "nics", "mounts", "disks"))


def error_entry(exc: BaseException) -> Dict[str, str]:
    return {"error": f"{type(exc).__name__}: {exc}", "kind": type(exc).__name__}


class _SectionRun(threading.Thread):
    def __init__(self, name: str, gather: Callable[[], Any]) -> None:
        # Daemon: a section stuck past the deadline must not keep the process alive.
        super().__init__(name="facts-" + name, daemon=True)
        self.section = name
        self.gather = gather
        self.value: Any = None
        self.elapsed = 0.0

    def run(self) -> None:
        start = time.monotonic()
        try:
            self.value = self.gather()
        except Exception as exc:  # one section's failure is data, not a failed command
            self.value = error_entry(exc)
        self.elapsed = time.monotonic() - start


def _selected_sections(args: Dict[str, Any]) -> Tuple[List[str], bool]:
    """(sections to gather, whether torch was wanted but switched off by {"torch": false})."""
    names = args["sections"]
    if names is None:
        names = list(SECTIONS)
    elif not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise AgentError("'sections' must be a list of section names", "bad_args")
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise AgentError(
            "unknown section(s) {}; known: {}".format(", ".join(unknown), ", ".join(SECTIONS)), "bad_args"
        )
    torch_skipped = args["torch"] is False and "torch" in names
    if torch_skipped:
        names = [n for n in names if n != "torch"]
    return [n for n in SECTIONS if n in names], torch_skipped


@command(
    takes={
        "sections": Opt((["any"], "null"), None),
        "torch": Opt("bool", True),
        "timeout_s": Opt("num", DEFAULT_TIMEOUT_S),
    },
    answers=FACTS,
)
def gather_facts(args: Dict[str, Any]) -> Dict[str, Any]:
    """Run the selected sections concurrently and assemble the answer."""
    start = time.monotonic()
    timeout = args["timeout_s"]
    names, torch_skipped = _selected_sections(args)
    linux = sys.platform.startswith("linux")
    runs: List[_SectionRun] = []
    results: Dict[str, Any] = {}
    for name in names:
        if name in LINUX_ONLY and not linux:
            results[name] = {
                "error": "needs Linux /proc and /sys; host is " + sys.platform,
                "kind": "unsupported",
            }
            continue
        run = _SectionRun(name, SECTIONS[name])
        run.start()
        runs.append(run)
    deadline = start + timeout
    timings: Dict[str, float] = {}
    for run in runs:
        run.join(max(0.0, deadline - time.monotonic()))
        if run.is_alive():
            results[run.section] = {
                "error": f"did not finish within {timeout:g} s",
                "kind": "timeout",
            }
        else:
            results[run.section] = run.value
            timings[run.section] = round(run.elapsed, 4)

    facts: Dict[str, Any] = {}
    for name in SECTIONS:
        if name not in results:
            continue
        value = results[name]
        if name == "gpus":
            value, source = _split_gpus(value)
            facts["gpu_source"] = source
        facts[name] = value
    if torch_skipped:
        facts["torch"] = {"skipped": True}
    facts["labctl"] = {
        "agent_version": AGENT_VERSION,
        "collected_at": time.time(),
        "elapsed_s": round(time.monotonic() - start, 4),
        "sections_s": timings,
    }
    return facts


def _split_gpus(value: Dict[str, Any]) -> Tuple[Any, str]:
    if "error" in value:
        return value, "error"
    return value["gpus"], value["source"]


facts_command = gather_facts
