"""What the sandbox leaves on its host: a snapshot before and after, and their comparison.

A snapshot holds labctl's sandbox containers (label `labctl.sandbox=1`, narrowed by more labels,
e.g. one pool's), the processes tied to a sandbox (in a container's cgroup, or running as the
sandbox user 65534 anywhere), the free bytes of Docker's root and /tmp, and MemAvailable.
`compare` names what a run left: a claimed container still there, a process that outlived its
run or lives outside any container, disk or memory not back within a tolerance. Idle pool
containers (`labctl-sbx-*`) are expected: the pool refills itself.
Standard library only, Python 3.8.
"""

from __future__ import annotations

import os
import re
import socket
import time
from typing import Any, Dict, List, Optional, Sequence

from ..core.errors import AgentError
from ..core.procs import cmdline
from ..core.spec import Opt, Or, command
from .docker import SOCKET as DOCKER_SOCKET
from .docker import Client, DockerError

SANDBOX_LABEL = "labctl.sandbox=1"
SANDBOX_UID = 65534
IDLE_PREFIX = "labctl-sbx-"
DISK_TOLERANCE = 256 << 20
# Memory moves with everything else on the host (page cache, other work): the check is for a
# sandbox's memory not given back, which is hundreds of MiB per container.
MEMORY_TOLERANCE = 512 << 20
_CONTAINER_ID = re.compile(r"(?:docker[-/]|containers/)([0-9a-f]{64})")

Snapshot = Dict[str, Any]


def containers(labels: Sequence[str], sock: str = DOCKER_SOCKET) -> List[Dict[str, Any]]:
    """[{id, name, state, labels}] of every container (running or not) carrying all `labels`."""
    rows = Client(sock, timeout=10.0).list(list(labels), running_only=False)
    return [
        {
            "id": r["Id"],
            "name": (r.get("Names") or ["?"])[0].lstrip("/"),
            "state": r.get("State", ""),
            "labels": r.get("Labels") or {},
        }
        for r in rows
    ]


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _process(pid: int) -> Optional[Dict[str, Any]]:
    """{pid, start, uid, container, cmd} of `pid`; None when it is gone or not a sandbox's."""
    stat = _read(f"/proc/{pid}/stat")
    status = _read(f"/proc/{pid}/status")
    if not stat or not status:
        return None
    uid = -1
    for line in status.splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[1])
            break
    found = _CONTAINER_ID.search(_read(f"/proc/{pid}/cgroup"))
    container = found.group(1) if found else None
    if container is None and uid != SANDBOX_UID:
        return None
    # The start time (clock ticks after boot) tells a process from a later one given the same pid.
    start = int(stat.rsplit(")", 1)[1].split()[19])
    return {"pid": pid, "start": start, "uid": uid, "container": container, "cmd": cmdline(pid)}


def processes() -> List[Dict[str, Any]]:
    """Every process in a container's cgroup or running as the sandbox user."""
    found = []
    me = os.getpid()
    for name in os.listdir("/proc"):
        if name.isascii() and name.isdigit() and int(name) != me:
            proc = _process(int(name))
            if proc is not None:
                found.append(proc)
    return found


def _free(path: str) -> Optional[int]:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def mem_available() -> Optional[int]:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def snapshot(labels: Sequence[str] = (), sock: str = DOCKER_SOCKET) -> Snapshot:
    """The host now, for the sandbox containers carrying `labels` besides labctl's own."""
    wanted = [SANDBOX_LABEL, *[lb for lb in labels if lb != SANDBOX_LABEL]]
    docker_error = None
    rows: List[Dict[str, Any]] = []
    root = "/var/lib/docker"
    try:
        rows = containers(wanted, sock)
        root = Client(sock, timeout=10.0).request("GET", "/info").get("DockerRootDir") or root
    except (OSError, ValueError, DockerError) as e:
        docker_error = str(e)
    return {
        "time": time.time(),
        "hostname": socket.gethostname(),
        "labels": wanted,
        "docker_error": docker_error,
        "containers": rows,
        "processes": processes(),
        "disk": {path: _free(path) for path in (root, "/tmp")},
        "mem_available": mem_available(),
    }


def _idle(c: Dict[str, Any]) -> bool:
    return str(c.get("name", "")).startswith(IDLE_PREFIX) and c.get("state") in ("created", "running")


def compare(
    before: Snapshot,
    after: Snapshot,
    disk_tolerance: int = DISK_TOLERANCE,
    memory_tolerance: int = MEMORY_TOLERANCE,
) -> Dict[str, Any]:
    """What `after` holds that `before` did not: {clean, problems, containers_left, processes_left}."""
    problems: List[str] = []
    if after.get("docker_error"):
        problems.append(f"Docker could not be asked: {after['docker_error']}")
    had = {(c["id"], c["name"]) for c in before.get("containers", [])}
    left = [c for c in after.get("containers", []) if not _idle(c) and (c["id"], c["name"]) not in had]
    for c in left:
        problems.append(f"container {c['name']} ({c['id'][:12]}, {c['state']}) left behind")

    ours_now = {c["id"]: c for c in after.get("containers", [])}
    ours_before = {c["id"] for c in before.get("containers", [])}
    old = {(p["pid"], p["start"]) for p in before.get("processes", [])}
    stray = []
    for p in after.get("processes", []):
        if (p["pid"], p["start"]) in old:
            continue
        cid = p.get("container")
        if cid is None:
            why = f"runs as uid {p['uid']} outside any container"
        elif cid in ours_now and not _idle(ours_now[cid]):
            why = f"still running in {ours_now[cid]['name']}"
        elif cid in ours_before and cid not in ours_now:
            why = f"outlived its container {cid[:12]}"
        else:
            continue  # an idle pool container's, or a container that is not ours to judge
        stray.append(p)
        problems.append(f"process {p['pid']} ({p['cmd'][:60] or '?'}) {why}")

    for path, free in (after.get("disk") or {}).items():
        was = (before.get("disk") or {}).get(path)
        if was is not None and free is not None and free < was - disk_tolerance:
            problems.append(f"{path}: {(was - free) >> 20} MiB less free than before")
    was_mem, mem = before.get("mem_available"), after.get("mem_available")
    if was_mem is not None and mem is not None and mem < was_mem - memory_tolerance:
        problems.append(f"memory: {(was_mem - mem) >> 20} MiB less available than before")
    return {
        "clean": not problems,
        "problems": problems,
        "containers_left": left,
        "processes_left": stray,
        "hostname": after.get("hostname", ""),
    }


def settle(
    before: Snapshot,
    wait_s: float = 20.0,
    interval_s: float = 0.5,
    disk_tolerance: int = DISK_TOLERANCE,
    memory_tolerance: int = MEMORY_TOLERANCE,
    sock: str = DOCKER_SOCKET,
) -> Dict[str, Any]:
    """Compare until the host is clean or `wait_s` passed: a used container is removed in the
    background, so right after a run it may still be there."""
    deadline = time.monotonic() + wait_s
    while True:
        after = snapshot(before.get("labels", ()), sock)
        report = compare(before, after, disk_tolerance, memory_tolerance)
        if report["clean"] or time.monotonic() >= deadline:
            report["after"] = after
            return report
        time.sleep(interval_s)


@command(
    takes={
        "action": Opt("str", "snapshot"),
        "socket": Or("str", DOCKER_SOCKET),
        "labels": Or(["any"], []),
        "before": Opt("any", None),
        "wait_s": Opt("num", 20.0),
        "disk_tolerance": Opt("int", DISK_TOLERANCE),
        "memory_tolerance": Opt("int", MEMORY_TOLERANCE),
    },
    answers={},
)
def hostcheck_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """`sandbox.hostcheck`: {action: snapshot, labels} → {snapshot};
    {action: compare, before, wait_s, disk_tolerance, memory_tolerance} → the comparison."""
    action = args["action"]
    sock = args["socket"]
    if action == "snapshot":
        return {"snapshot": snapshot([str(x) for x in args["labels"]], sock)}
    if action == "compare":
        before = args["before"]
        if not isinstance(before, dict):
            raise AgentError("compare needs `before`: a snapshot from action=snapshot", "bad_args")
        return settle(
            before,
            args["wait_s"],
            disk_tolerance=args["disk_tolerance"],
            memory_tolerance=args["memory_tolerance"],
            sock=sock,
        )
    raise AgentError(f"unknown action {action!r}: snapshot or compare", "bad_args")
