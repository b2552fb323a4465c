"""Docker on a host, as the `sandbox` resource sees it: installed, answering, configured.

`provision.probe` reads it all in one go (the provision probe kind "sandbox"), with what the daemon holds
that labctl did not create (`foreign`: turning userns-remap on would hide it); `dockerd_op`
starts or restarts the daemon (the apply op "dockerd"): through systemd where it is PID 1, else
as a background process with its pid file and a log under /var/log/labctl. Standard library
only, Python 3.8.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from typing import Any, Dict, List, Optional

from ..core import paths, procs
from ..core.errors import AgentError
from ..core.fsutil import file_state
from . import LABEL_LANG, image_name
from .dockercli import docker

DAEMON_JSON = "/etc/docker/daemon.json"
DATA_ROOT = "/var/lib/docker"
PIDFILE = "/var/run/docker.pid"
FULL_UID_MAP = ["0", "0", "4294967295"]
# The label every sandbox container carries (labctl/sandbox/limits.py). A container made from a
# labctl image without it inherits labctl.lang from the image, yet it is someone else's.
LABEL_SANDBOX = "labctl.sandbox"


def daemon_answers(timeout: float = 15) -> Dict[str, Any]:
    """{"answering": True, "version": ...} or {"answering": False, "error": ...}."""
    try:
        r = docker(["version", "--format", "{{.Server.Version}}"], timeout=timeout)
    except AgentError as e:
        return {"answering": False, "error": e.message}
    if r.returncode != 0:
        err = (r.stderr or r.stdout).strip().splitlines()
        return {
            "answering": False,
            "error": err[-1] if err else f"docker version exited {r.returncode}",
        }
    return {"answering": True, "version": r.stdout.strip()}


def userns_support() -> Dict[str, Any]:
    """Whether dockerd could remap container root to an unprivileged range here, and why not.

    dockerd needs the whole uid range (a process already inside a user namespace with a
    partial map cannot hand out subordinate ids), user namespaces enabled in the kernel, and
    useradd/usermod to create `dockremap` with its /etc/subuid and /etc/subgid ranges.
    """
    try:
        with open("/proc/self/uid_map") as f:
            rows = [line.split() for line in f if line.strip()]
    except OSError as e:
        return {"ok": False, "why": f"cannot read /proc/self/uid_map ({e})"}
    if rows != [FULL_UID_MAP]:
        return {
            "ok": False,
            "why": f"this host already runs inside a user namespace (uid_map {rows})",
        }
    try:
        with open("/proc/sys/user/max_user_namespaces") as f:
            if int(f.read().strip() or 0) <= 0:
                return {
                    "ok": False,
                    "why": "the kernel has user namespaces off (user.max_user_namespaces = 0)",
                }
    except OSError:
        return {
            "ok": False,
            "why": "the kernel has no user namespaces (no /proc/sys/user/max_user_namespaces)",
        }
    for tool in ("useradd", "usermod"):
        if shutil.which(tool) is None:
            return {"ok": False, "why": f"no {tool} to create dockremap's /etc/subuid range"}
    return {"ok": True, "why": ""}


def _pid_of_dockerd() -> Optional[int]:
    """The running dockerd: its pid file's, else the one dockerd process /proc shows.

    A pid file can go while its daemon runs on (seen on a test machine), and a restart that
    cannot find the daemon would leave it running on the old daemon.json.
    """
    try:
        with open(PIDFILE) as f:
            pid = int(f.read().strip())
        if procs.comm(pid) == "dockerd" and procs.alive(pid):
            return pid
    except (OSError, ValueError):
        pass
    found = [
        int(n)
        for n in os.listdir("/proc")
        if n.isascii() and n.isdigit() and procs.comm(int(n)) == "dockerd" and procs.alive(int(n))
    ]
    return found[0] if len(found) == 1 else None


def _foreign_image_names(tags: List[str], labels: Dict[str, Any], image_id: str) -> List[str]:
    """How `docker images` names an image labctl did not make, or [] when it is labctl's.

    A labctl image tagged under another name (`docker tag`) is someone's reference to it: the
    other name is foreign, though the image is labctl's."""
    tags = [t for t in tags if t and t != "<none>:<none>"]
    if LABEL_LANG in (labels or {}):
        return [t for t in tags if t != image_name(str(labels[LABEL_LANG]))]
    return tags or [image_id.split(":")[-1][:12]]


def _foreign_of_daemon() -> Dict[str, Any]:
    from .docker import Client

    client = Client(timeout=30.0)
    containers = [
        (c.get("Names") or [c.get("Id", "?")[:12]])[0].lstrip("/")
        for c in client.request("GET", "/containers/json", query={"all": "1"}) or []
        if LABEL_SANDBOX not in (c.get("Labels") or {})
    ]
    images: List[str] = []
    for i in client.request("GET", "/images/json") or []:
        images += _foreign_image_names(i.get("RepoTags") or [], i.get("Labels") or {}, i.get("Id", ""))
    return {"containers": containers, "images": images, "source": "daemon"}


def _read_json(path: str) -> Any:
    with open(path, "rb") as f:
        return json.loads(f.read().decode("utf-8", "replace"))


def foreign_on_disk(root: str) -> Dict[str, Any]:
    """What a stopped daemon's data root holds that labctl did not make, read from its files
    (Docker's classic layout: containers/ID/config.v2.json, image/DRIVER/imagedb and
    repositories.json). A data root that is not there holds nothing: Docker never ran."""
    if not os.path.isdir(root):
        return {"containers": [], "images": [], "source": "disk"}
    containers = []
    cdir = os.path.join(root, "containers")
    for cid in sorted(os.listdir(cdir)) if os.path.isdir(cdir) else []:
        try:
            doc = _read_json(os.path.join(cdir, cid, "config.v2.json"))
        except (OSError, ValueError):
            containers.append(cid[:12])  # a container Docker cannot describe is still someone's
            continue
        if LABEL_SANDBOX not in ((doc.get("Config") or {}).get("Labels") or {}):
            containers.append(str(doc.get("Name") or cid[:12]).lstrip("/"))
    images: List[str] = []
    idir = os.path.join(root, "image")
    for driver in sorted(os.listdir(idir)) if os.path.isdir(idir) else []:
        tags: Dict[str, List[str]] = {}
        try:
            repos = _read_json(os.path.join(idir, driver, "repositories.json"))
        except FileNotFoundError:
            repos = {}
        for refs in (repos.get("Repositories") or {}).values():
            for ref, image_id in refs.items():
                if "@" not in ref:  # a digest reference names the same image as its tag
                    tags.setdefault(image_id, []).append(ref)
        content = os.path.join(idir, driver, "imagedb", "content", "sha256")
        for digest in sorted(os.listdir(content)) if os.path.isdir(content) else []:
            image_id = "sha256:" + digest
            try:
                labels = (_read_json(os.path.join(content, digest)).get("config") or {}).get("Labels")
            except (OSError, ValueError):
                labels = None
            images += _foreign_image_names(tags.get(image_id, []), labels or {}, image_id)
    return {"containers": containers, "images": images, "source": "disk"}


def foreign(answering: bool, daemon_json: Dict[str, Any]) -> Dict[str, Any]:
    """Containers and images that labctl did not create, from the daemon when it answers, else
    from its data root on disk; {"error": ...} when neither can be read."""
    try:
        if answering:
            return _foreign_of_daemon()
        doc = json.loads(daemon_json.get("text") or "{}") if daemon_json.get("exists") else {}
        root = doc.get("data-root") if isinstance(doc, dict) else None
        return foreign_on_disk(str(root or DATA_ROOT))
    except Exception as e:  # what cannot be read is reported, never taken for "nothing there"
        return {"error": f"{type(e).__name__}: {e}"}


def probe(p: Dict[str, Any]) -> Dict[str, Any]:
    """Everything the sandbox resource plans from, read once."""
    from .image import list_images

    out: Dict[str, Any] = {
        "uid": os.geteuid(),
        "apt": shutil.which("apt-get") is not None,
        "docker": shutil.which("docker"),
        "dockerd": shutil.which("dockerd"),
        "debootstrap": shutil.which("debootstrap"),
        # Where PID 1 is systemd the daemon is its docker.service; elsewhere labctl starts it.
        "systemd": os.path.isdir("/run/systemd/system"),
        "dockerd_pid": _pid_of_dockerd(),
        "userns": userns_support(),
    }
    # Mode and owner with the text: the plan keeps the file 0644, and compares what it reads.
    out["daemon_json"] = file_state({"path": DAEMON_JSON, "whole": True})  # merged into: any size
    out["daemon"] = (
        daemon_answers() if out["docker"] else {"answering": False, "error": "docker is not installed"}
    )
    out["images"] = {}
    if out["daemon"]["answering"]:
        try:
            out["images"] = {i["lang"]: i for i in list_images() if i.get("image")}
        except AgentError as e:
            out["daemon"] = {"answering": False, "error": e.message}
    out["foreign"] = foreign(out["daemon"]["answering"], out["daemon_json"])
    return out


def _log_tail(path: str, n: int = 6) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8000))
            lines = f.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def _wait_answering(seconds: float, proc: "Optional[subprocess.Popen[bytes]]" = None) -> Dict[str, Any]:
    deadline = time.monotonic() + seconds
    state = daemon_answers(timeout=10)
    while not state["answering"] and time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.5)
        state = daemon_answers(timeout=10)
    return state


def _stop_background(pid: int, seconds: float = 60) -> None:
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + seconds
    # procs.alive, not /proc/PID: a daemon whose parent never reaps it (a test session that
    # started it, an init that does not wait) stays a zombie in /proc after it has stopped.
    while procs.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if procs.alive(pid):
        raise AgentError(f"dockerd (pid {pid}) did not stop within {seconds:g} s of SIGTERM", "op_failed")


CANNOT_RUN = (
    "Docker needs root, a kernel with cgroups and overlay (or vfs) storage, and no container "
    "around it that forbids them; fix what the log names, then provision again."
)


def dockerd_op(op: Dict[str, Any]) -> str:
    """op: {"action": "start" | "restart", "systemd": bool, "wait": seconds, "rollback"?}.

    rollback: {"path": daemon.json, "backup": its copy from before, "existed": bool}: when
    the daemon does not come back with the new daemon.json, the old one is put back and the
    daemon started with it, so a bad setting never leaves the host without Docker.
    """
    try:
        return _start(op)
    except AgentError as e:
        rb = op.get("rollback")
        if not rb:
            raise
        failed = e.message
    if rb.get("existed"):
        shutil.copy2(rb["backup"], rb["path"])
    elif os.path.exists(rb["path"]):
        os.unlink(rb["path"])
    try:
        again = _start(dict(op, action="restart"))
    except AgentError as e2:
        raise AgentError(
            "{}\nThe previous {} was put back, but dockerd did not start with it either: {}\n{}".format(
                failed, rb["path"], e2.message, CANNOT_RUN
            ),
            "docker_cannot_run",
        ) from None
    raise AgentError(
        "dockerd did not start with the new {}: {}\nThe previous one was put back ({}).".format(
            rb["path"], failed, again
        ),
        "op_failed",
    )


def _start(op: Dict[str, Any]) -> str:
    action, wait = op.get("action", "start"), float(op.get("wait", 90))
    if op.get("systemd"):
        verb = "restart" if action == "restart" else "start"
        for argv in (["systemctl", "enable", "docker"], ["systemctl", verb, "docker"]):
            r = subprocess.run(argv, capture_output=True, text=True, timeout=wait)
            if r.returncode != 0:
                raise AgentError(
                    "{} exited {}: {}".format(
                        " ".join(argv), r.returncode, (r.stderr or r.stdout).strip()[-1500:]
                    ),
                    "op_failed",
                )
        state = _wait_answering(wait)
        if not state["answering"]:
            raise AgentError(
                "docker.service is up but the daemon does not answer: {} (journalctl -u docker says why)".format(
                    state["error"]
                ),
                "op_failed",
            )
        return "{}ed docker.service (Docker {})".format(verb, state["version"])
    exe = shutil.which("dockerd")
    if exe is None:
        raise AgentError("dockerd is not installed", "no_docker")
    pid = _pid_of_dockerd()
    if pid is not None and action == "restart":
        _stop_background(pid)
    elif action == "restart" and daemon_answers(timeout=10)["answering"]:
        # Saying "restarted" here would leave the daemon on its old settings unnoticed.
        raise AgentError(
            f"dockerd answers but labctl cannot find its process to restart it (no {PIDFILE} and not one "
            f"dockerd in /proc); restart it by hand so it reads {DAEMON_JSON}",
            "op_failed",
        )
    elif pid is not None or daemon_answers(timeout=10)["answering"]:
        return "dockerd was already running"
    os.makedirs(paths.LOG_DIR, exist_ok=True)
    with open(paths.DOCKERD_LOG, "ab") as log:
        log.write("--- labctl starts dockerd at {}\n".format(time.strftime("%Y-%m-%d %H:%M:%S")).encode())
        log.flush()
        # Its own session: the daemon outlives the agent and the SSH session that ran it.
        proc = subprocess.Popen(
            [exe, "--pidfile", PIDFILE],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    state = _wait_answering(wait, proc)
    if not state["answering"]:
        if proc.poll() is None:  # hung: not left behind holding the socket and pid file
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        rc = proc.poll()
        why = f"it exited {rc}" if rc is not None else f"it does not answer after {wait:g} s"
        raise AgentError(
            f"dockerd could not start ({why}); the end of {paths.DOCKERD_LOG}:\n"
            f"{_log_tail(paths.DOCKERD_LOG)}\n{CANNOT_RUN}",
            "docker_cannot_run",
        )
    return "{} dockerd in the background (pid {}, Docker {}, log {})".format(
        "restarted" if action == "restart" else "started", proc.pid, state["version"], paths.DOCKERD_LOG
    )
