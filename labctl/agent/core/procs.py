"""labctl's processes on a host, found by the tags in their environment and stopped by group.

A training run's processes carry LABCTL_RUN_ID, an orchestra server's LABCTL_ORCH_*; all carry
LABCTL_HOST, because the hosts of the simulated lab share one kernel. Reading /proc/*/environ
finds them whatever became of the process that started them (an SSH session long closed).
Standard library only, Python 3.8.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

Procs = List[Dict[str, Any]]


def environ(pid: int, keys: Sequence[str]) -> Optional[Dict[str, str]]:
    """The variables named in `keys` that process `pid` started with; None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:  # gone, or not ours to read
        return None
    wanted = {k.encode() for k in keys}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in wanted:
            env[key.decode()] = value.decode("utf-8", "replace")
    return env


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200]
    except OSError:
        return ""


def comm(pid: int) -> str:
    """The process's name as the kernel keeps it (its executable's, 15 characters); "" if gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def scan(keys: Sequence[str], want: Callable[[Dict[str, str]], bool]) -> Procs:
    """[{pid, pgid, cmd, env}] of every other process whose tags (`keys`) `want` accepts."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not (name.isascii() and name.isdigit()) or int(name) == me:
            continue
        env = environ(int(name), keys)
        # A zombie's environ reads empty: it is gone in all but name.
        if not env or not want(env):
            continue
        pid = int(name)
        try:
            pgid = os.getpgid(pid)
        except OSError:
            continue
        found.append({"pid": pid, "pgid": pgid, "cmd": cmdline(pid), "env": env})
    return found


def alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie nobody reaped (the init of a container may not) does not."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # The state follows the command name, which is in parentheses and may hold anything.
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    return state not in (b"Z", b"X", b"x")


def signal_all(procs: Procs, sig: int) -> None:
    # The groups first (torchrun and its workers share one), then stragglers that left it.
    for pgid in sorted({p["pgid"] for p in procs}):
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass
    for p in procs:
        try:
            os.kill(p["pid"], sig)
        except OSError:
            pass


def terminate(procs: Procs, rescan: Callable[[], Procs], grace: float) -> Tuple[Procs, Procs]:
    """SIGTERM `procs`, wait up to `grace` s, SIGKILL what `rescan` still finds; (killed, remaining).

    `killed`: what was still there after the grace and got SIGKILL; `remaining`: what even
    that left (5 s later), for the caller to report.
    """
    signal_all(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = procs
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = rescan()
    killed = left
    if left:
        signal_all(left, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = rescan()
    return killed, left


def wait_beating(
    proc: "subprocess.Popen[Any]", timeout: float, beat: float, on_beat: Callable[[], None]
) -> bool:
    """Wait for `proc`, calling `on_beat` every `beat` seconds (a long build's heartbeat); past
    `timeout` it is killed and reaped, and the answer is False."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            proc.wait(timeout=beat)
            return True
        except subprocess.TimeoutExpired:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                return False
            on_beat()
