"""One sshd per sim host: keys, config, private mounts, start, stop, and liveness checks."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import time
from pathlib import Path

from labctl.output.errors import HostError
from labctl.sim.commands import command_error, run
from labctl.sim.netns import namespace_pids, send_signal
from labctl.sim.plan import MANAGED_PATHS, HostPlan, sshd_config, start_script

SSHD = "/usr/sbin/sshd"


def require_sshd() -> str:
    if not os.access(SSHD, os.X_OK):
        raise HostError(
            f"labctl sim runs an sshd per host, and {SSHD} is not installed.",
            "Install it: apt-get install openssh-server.",
        )
    return SSHD


def ensure_keypair(path: Path, comment: str) -> bool:
    """An ed25519 key pair at `path` (+ .pub) with no passphrase; False when it was already there."""
    if path.exists() and path.with_name(path.name + ".pub").exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    path.chmod(0o600)
    return True


def public_key(path: Path) -> str:
    """'ssh-ed25519 AAAA...' of a key pair at `path`."""
    parts = path.with_name(path.name + ".pub").read_text().split()
    return f"{parts[0]} {parts[1]}"


class HostFiles:
    """Where one host's files live under DIR/hosts/NAME."""

    def __init__(self, sim_dir: Path, name: str) -> None:
        self.dir = sim_dir / "hosts" / name
        self.root = self.dir / "root"
        self.config = self.dir / "sshd_config"
        self.host_key = self.dir / "ssh_host_ed25519_key"
        self.pid_file = self.dir / "sshd.pid"
        self.log = self.dir / "sshd.log"


def prepare_host(sim_dir: Path, plan: HostPlan, authorized_keys: Path) -> tuple[HostFiles, bool]:
    """Host key, sshd_config and the host's private copies of the managed paths; True if the config changed.

    Existing copies are kept: a host's files survive `sim up` being run again.
    """
    f = HostFiles(sim_dir, plan.name)
    f.root.mkdir(parents=True, exist_ok=True)
    ensure_keypair(f.host_key, f"labctl-sim-{plan.name}")
    for mp in MANAGED_PATHS:
        target = f.root / mp.path.lstrip("/")
        if mp.is_file:
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                target.write_text(mp.initial)
        else:
            target.mkdir(parents=True, exist_ok=True)
    text = sshd_config(plan.address, str(f.host_key), str(f.pid_file), str(authorized_keys))
    changed = not f.config.exists() or f.config.read_text() != text
    if changed:
        f.config.write_text(text)
    return f, changed


def ensure_mount_points() -> list[str]:
    """Create on this machine the mount points the hosts bind over that do not exist yet; returns them.

    Only empty directories (or an empty file for a managed file) are created here; the content each
    host sees comes from its own copy.
    """
    created: list[str] = []
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    for mp in MANAGED_PATHS:
        p = Path(mp.path)
        if p.exists():
            continue
        if mp.is_file:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.touch()
        else:
            p.mkdir(parents=True, exist_ok=True)
        created.append(mp.path)
    return created


def is_alive(pid: int | None, files: HostFiles) -> bool:
    """True when `pid` is a running (not zombie) sshd started with this host's config."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[-1].split()[0]
        # sshd rewrites its title to "sshd: /usr/sbin/sshd -f CONFIG ... [listener] ...", one string.
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return state != "Z" and f"-f {files.config} ".encode() in cmdline + b" "


def stop(pid: int | None, files: HostFiles, timeout: float = 3.0) -> bool:
    """Stop this host's sshd listener (TERM, then KILL) and wait until it is gone; False if it was not running."""
    if not pid or not is_alive(pid, files):
        return False
    send_signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while is_alive(pid, files):
        if time.monotonic() > deadline:
            send_signal(pid, signal.SIGKILL)
            deadline = time.monotonic() + timeout
        time.sleep(0.02)
    return True


def read_pid(files: HostFiles) -> int | None:
    try:
        return int(files.pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def start(plan: HostPlan, files: HostFiles, timeout: float = 10.0) -> int:
    """Start the host's sshd in its network namespace with fresh private mount, UTS and PID namespaces.

    sshd is PID 1 of its host, so the host's processes see only each other in /proc, as on a
    machine of their own, and stopping sshd ends the whole host. It runs in the foreground (a
    PID 1 that daemonized would take its namespace down with it) under `setsid -f`, which returns
    at once. Its pid file, written once it listens, holds 1, its pid inside; the pid returned is
    the one this machine sees, found among the namespace's processes.
    """
    for stray in namespace_pids(plan.namespace):
        if is_alive(stray, files):  # a listener an interrupted run started but never recorded
            stop(stray, files)
    files.pid_file.unlink(missing_ok=True)
    log_start = files.log.stat().st_size if files.log.exists() else 0
    script = start_script(plan.name, str(files.root), require_sshd(), str(files.config), str(files.log))
    host = ["unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc", "--propagation", "private"]
    host += ["--", "sh", "-c", script]
    # unshare's own complaints go to the host's log too, where a failed start is read from.
    detached = f"exec >>{shlex.quote(str(files.log))} 2>&1 </dev/null; exec {shlex.join(host)}"
    cmd = ["ip", "netns", "exec", plan.namespace, "setsid", "-f", "sh", "-c", detached]
    proc = run(cmd, check=False, timeout=timeout)
    if proc.returncode != 0:
        raise command_error(cmd, proc)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if read_pid(files):
            listeners = [p for p in namespace_pids(plan.namespace) if is_alive(p, files)]
            if listeners:
                return listeners[0]
        log = _log_since(files, log_start)
        if "Cannot bind any address" in log or "fatal" in log.lower() or "unshare:" in log:
            break
        time.sleep(0.02)
    tail = " | ".join(_log_since(files, log_start).strip().splitlines()[-4:]) or "nothing in its log"
    raise HostError(
        f"sshd for sim host {plan.name} did not start (`{shlex.join(cmd[:5])} ...`): {tail}",
        f"See {files.log}.",
    )


def _log_since(files: HostFiles, offset: int) -> str:
    try:
        with open(files.log, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def probe(address: str, port: int = 22, timeout: float = 2.0) -> bool:
    """True when something at address:port answers with an SSH banner."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False
