"""The trainer's client for the sandbox service: run programs against their tests in batches.

    from labctl.agent.sandbox.client import load_service
    sandbox = load_service()              # $LABCTL_SANDBOX_SERVICE or client.json
    results = sandbox.run([{"lang": "python", "source": code,
                            "tests": [{"stdin": "1 2\n", "expect": "3"}]}])
    results[0]["passed"], results[0]["total"]

Standard library only, Python 3.8: it ships in the agent zipapp, so a torchrun worker imports
it with nothing installed. The address and the token's file come from client.json, which
`labctl sandbox serve` writes on every host that trains; the token is read from its 0600 file
and sent as a bearer token, never printed.
"""

from __future__ import annotations

import http.client
import json
import os
from typing import Any, Dict, List, Mapping, Optional
from urllib.parse import urlsplit

from ..core.paths import SANDBOX_CLIENT

SLACK_S = 30.0  # on top of the programs' own time limits, for the queue and the containers


class SandboxError(Exception):
    """The service refused or could not answer: `monitor.status` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Sandbox:
    def __init__(self, url: str, token: str, timeout_s: float = 10.0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{url!r} is not an http:// address")
        self.url = url
        self.host = parts.hostname
        self.port = parts.port or 80
        self._token = token
        self.timeout_s = timeout_s  # a program's limit when it names none (the service's default)

    def __repr__(self) -> str:  # the token stays out of logs and tracebacks
        return f"Sandbox({self.url!r})"

    def _request(self, method: str, path: str, body: Optional[bytes], timeout: float) -> Dict[str, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        headers = {"Authorization": "Bearer " + self._token}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise SandboxError(f"the sandbox service at {self.url} did not answer: {e}") from None
        finally:
            conn.close()
        try:
            doc = json.loads(data.decode("utf-8"))
        except ValueError:
            raise SandboxError(
                f"the sandbox service answered HTTP {resp.status} without JSON", resp.status
            ) from None
        if resp.status != 200:
            raise SandboxError(
                f"the sandbox service refused: HTTP {resp.status}: {doc.get('error')}", resp.status
            )
        return doc

    def health(self) -> Dict[str, Any]:
        return self._request("GET", "/health", None, 5.0)

    def run(self, programs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """Each program's result, in order: {lang, passed, total, tests: [{ok, exit_code,
        stdout, stderr, timed_out, truncated, wall_ms}], latency_ms} or {error} when it could
        not run. Waits as long as the slowest program could take, with the service's queue."""
        if not programs:
            return []
        worst = max(float(p.get("timeout") or self.timeout_s) * len(p.get("tests") or [1]) for p in programs)
        body = json.dumps({"programs": programs}).encode()
        doc = self._request("POST", "/v1/batch", body, worst * max(1, len(programs) // 8) + SLACK_S)
        results = doc.get("results")
        if not isinstance(results, list) or len(results) != len(programs):
            raise SandboxError("the sandbox service's answer does not have one result per program", 200)
        return results


def load_service(path: Optional[str] = None, environ: Optional[Mapping[str, str]] = None) -> Sandbox:
    """The service `labctl sandbox serve` announced on this host (default client.json, or
    $LABCTL_SANDBOX_SERVICE). OSError when a file cannot be read, ValueError when it is not
    the service's document."""
    env = os.environ if environ is None else environ
    path = path or env.get("LABCTL_SANDBOX_SERVICE") or SANDBOX_CLIENT
    with open(path, "rb") as f:
        doc = json.loads(f.read().decode("utf-8"))
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("url"), str)
        or not isinstance(doc.get("token_file"), str)
    ):
        raise ValueError(f"{path} is not a sandbox service file (no url and token_file)")
    with open(doc["token_file"], "rb") as f:
        token = f.read().decode("utf-8").strip()
    if not token:
        raise ValueError(f"{doc['token_file']} holds no token")
    return Sandbox(doc["url"], token)
