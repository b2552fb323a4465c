"""What every host command that starts one of labctl's own processes needs (a trainer, a model
server, the sandbox service): where the agent's code is, whether a port is free, and which
Python runs torch work. At the agent's root, as the host side of several features uses it.
Standard library only, Python 3.8.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple

from . import paths

# The agent's import root: the folder BOOT extracted beside the shipped zipapp
# (…/agent-x/labctl/agent/core/launch.py), or the zipapp itself where it could not (…/agent-x.pyz/…).
IMPORT_ROOT = os.path.abspath(__file__).rsplit(os.sep, 4)[0]


def port_state(port: int) -> Dict[str, Any]:
    """Whether a TCP port (the rendezvous, a model server's) is free here; port 0 asks for a free one."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # TIME_WAIT from a previous run must not count as taken; a listener still does.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", port))
        return {"port": s.getsockname()[1], "free": True}
    except OSError as exc:
        return {"port": port, "free": False, "error": os.strerror(exc.errno or errno.EADDRINUSE)}
    finally:
        s.close()


def torch_env_facts() -> Dict[str, Any]:
    """The virtualenv `labctl provision` built (torch_env), as its last verification recorded it."""
    try:
        with open(paths.TORCH_ENV_RECORD) as f:
            record: Dict[str, Any] = json.load(f)
    except FileNotFoundError:
        return {"provisioned": False}
    record["provisioned"] = True
    return record


def torch_python(given: Optional[str]) -> Tuple[str, str]:
    """(interpreter, source) for torch work here: the one given, else the torch_env that
    `labctl provision` built, else the python this agent runs with (the inventory's)."""
    if given:
        return given, "given"
    env = torch_env_facts()
    if env.get("provisioned"):
        return str(env.get("python") or sys.executable), "torch_env"
    return sys.executable, "inventory"


def start_detached(argv: List[str], env: Dict[str, str], log: str, header: str) -> "subprocess.Popen[bytes]":
    """`argv` in a session of its own (closing the SSH channel that started it does not reach
    it), its output appended to `log` after `header`. OSError when it cannot be run: the reason
    is in the log too."""
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "ab") as out:
        out.write(header.encode())
        out.flush()
        try:
            return subprocess.Popen(
                argv,
                env=env,
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            out.write(f"cannot run {argv[0]}: {exc.strerror or exc}\n".encode())
            raise
