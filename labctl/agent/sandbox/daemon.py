"""Docker on a host, as the `sandbox` resource sees it: installed, answering, configured.

`probe` reads it all in one go (the provision probe kind "sandbox"); `dockerd_op` starts or
restarts the daemon (the apply op "dockerd"): through systemd where it is PID 1, else as a
background process with its pid file and a log under /var/log/labctl. Standard library only,
Python 3.8.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from typing import Any, Dict, List, Optional

from .. import paths
from ..commands import AgentError

DAEMON_JSON = "/etc/docker/daemon.json"
PIDFILE = "/var/run/docker.pid"
FULL_UID_MAP = ["0", "0", "4294967295"]


def docker(args: List[str], timeout: float = 30, stdin: Any = None) -> "subprocess.CompletedProcess[str]":
    """The docker CLI; a missing binary or a hung daemon is an AgentError naming it."""
    exe = shutil.which("docker")
    if exe is None:
        raise AgentError("the docker command is not installed on this host", "no_docker")
    try:
        return subprocess.run(
            [exe, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL if stdin is None else stdin,
        )
    except subprocess.TimeoutExpired:
        raise AgentError(f"docker {args[0]} did not answer in {timeout:g} s", "docker_hung") from None


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
    try:
        with open(PIDFILE) as f:
            pid = int(f.read().strip())
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() == "dockerd":
                return pid
    except (OSError, ValueError):
        pass
    return None


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
    try:
        with open(DAEMON_JSON) as f:
            out["daemon_json"] = {"exists": True, "text": f.read()}
    except FileNotFoundError:
        out["daemon_json"] = {"exists": False}
    out["daemon"] = (
        daemon_answers() if out["docker"] else {"answering": False, "error": "docker is not installed"}
    )
    out["images"] = {}
    if out["daemon"]["answering"]:
        try:
            out["images"] = {i["lang"]: i for i in list_images() if i.get("image")}
        except AgentError as e:
            out["daemon"] = {"answering": False, "error": e.message}
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
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.2)
    if os.path.exists(f"/proc/{pid}"):
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
