"""`provision.host_lock`: hold this host's provision lock for as long as the controller's run needs it.

Two changing runs on one host at once would both plan from the same state and both apply
(two tmpfs mounts stacked on one cache path). The controller runs this command on its own
channel before it reads the host's state and closes the channel when the host is done; the
flock then goes with the process (channel closed: labctl's watchdog kills it; the controller
gone: the parent check below). A second run waits for the lock, up to `wait` seconds, and is
told who holds it. Stdlib only, Python 3.8.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from typing import Any, Dict

from ..core import paths
from ..core.errors import AgentError
from ..core.spec import Opt, Or, command


def _emit(event: Dict[str, Any]) -> None:
    sys.stderr.write(json.dumps(event, sort_keys=True, separators=(",", ":")) + "\n")
    sys.stderr.flush()


def _holder(fd: int) -> Dict[str, Any]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        doc = json.loads(os.read(fd, 65536).decode("utf-8", "replace") or "{}")
    except (OSError, ValueError):
        doc = {}
    return doc if isinstance(doc, dict) else {}


@command(
    takes={"holder": Or({}, {}), "wait": Opt("num", 600.0), "path": Or("str", "")},
    answers={},
)
def lock_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """args: {"holder": {controller, pid, user, started}, "wait": seconds, "path": for tests}."""
    path = args["path"] or paths.provision_lock()
    wait = args["wait"]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            holder = _holder(fd)
            if time.monotonic() >= deadline:
                _emit({"event": "busy", "holder": holder, "path": path, "wait": wait})
                raise AgentError(f"{path} is held by another run", "busy") from None
            if not told:
                _emit({"event": "waiting", "holder": holder, "path": path, "wait": wait})
                told = True
            time.sleep(0.2)
    me = dict(args["holder"])
    me.update(host_pid=os.getpid(), locked_at=round(time.time(), 3))
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    _emit({"event": "locked", "path": path, "waited": told})
    parent = os.getppid()
    # Held until the controller closes the channel (the watchdog kills this process); a
    # controller that vanished without closing it leaves this process to the init process.
    while os.getppid() == parent:
        time.sleep(0.5)
    return {"released": "the controller went away"}
