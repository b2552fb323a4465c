"""The Docker daemon's version asked over its unix socket: what `docker version` says, without
starting the docker CLI, a Go program that costs tens of milliseconds of CPU on every call (the
facts section pays it on every host of every `labctl facts`). Standard library only, Python 3.8.
"""

from __future__ import annotations

import http.client
import json
import socket
from typing import Optional, Tuple

SOCKET = "/var/run/docker.sock"
# The CLI's own words for the two ways a local daemon is not there to answer.
NOT_RUNNING = "Cannot connect to the Docker daemon at unix://{path}. Is the docker daemon running?"
DENIED = "permission denied while trying to connect to the Docker daemon socket at unix://{path}"


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("docker", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


def server_version(path: str = SOCKET, timeout: float = 3.0) -> Tuple[Optional[str], Optional[str]]:
    """(the daemon's version, None), or (None, why there is none) in the CLI's words where it
    has them. A daemon that takes longer than `timeout` answers (None, "timeout")."""
    conn = _UnixHTTP(path, timeout)
    try:
        conn.request("GET", "/version")
        resp = conn.getresponse()
        status, body = resp.status, resp.read(1 << 20)
    except socket.timeout:  # noqa: UP041 (on Python < 3.10 it is not TimeoutError; before OSError)
        return None, "timeout"
    except PermissionError:
        return None, DENIED.format(path=path)
    except (ConnectionRefusedError, FileNotFoundError):
        return None, NOT_RUNNING.format(path=path)
    except (OSError, http.client.HTTPException) as exc:
        return None, f"cannot talk to the Docker daemon at unix://{path}: {exc}"
    finally:
        conn.close()
    if status != 200:
        return None, f"the Docker daemon at unix://{path} answered HTTP {status} to GET /version"
    try:
        version = json.loads(body.decode("utf-8", "replace")).get("Version")
    except (ValueError, AttributeError):
        version = None
    if not isinstance(version, str) or not version:
        return None, f"the Docker daemon at unix://{path} named no version"
    return version, None
