"""Start, find and stop the sandbox service on its host, and hand its token to the trainers.

The service runs detached (its own session, so the SSH channel that started it can close)
and is found again by the tags in its environment, LABCTL_LAB, LABCTL_HOST and
LABCTL_SANDBOX_PORT, as the orchestra's model servers are. Its token is made here, once, in a
0600 file; the controller reads it from this host's agent and writes it (on the SSH channel's stdin) into a 0600
file on each training host, never into a command line, a log or its output. Standard library only, Python 3.8.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import sys
import time
from typing import Any, Dict, List, Optional

from ..core import paths, procs
from ..core.errors import AgentError
from ..core.fsutil import write_atomic, write_json
from ..core.launch import IMPORT_ROOT, port_state, start_detached
from ..core.spec import Opt, command
from .pool import check_lab

# What this feature's answers share (labctl/agent/core/spec.py's shape language).
SANDBOX_SERVICE = {
    "state": "str",
    "pid": "int",
    "port": "int",
    "bind": "str",
    "langs": {"*": "str"},
    "token_made": "bool",
}

MODULE = "labctl.agent.sandbox.service"
TAGS = ("LABCTL_LAB", "LABCTL_HOST", "LABCTL_SANDBOX_PORT", "LABCTL_SANDBOX_CONFIG")
START_WAIT_S = 60.0


def _found(lab: str, host: str) -> procs.Procs:
    return procs.scan(
        TAGS,
        lambda env: (
            env.get("LABCTL_LAB") == lab
            and env.get("LABCTL_HOST") == host
            and bool(env.get("LABCTL_SANDBOX_PORT"))
        ),
    )


def _health(bind: str, port: int, timeout: float = 2.0) -> Optional[Dict[str, Any]]:
    address = "127.0.0.1" if bind in ("", "0.0.0.0") else bind
    conn = http.client.HTTPConnection(address, port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        return json.loads(resp.read().decode()) if resp.status == 200 else None
    except (OSError, ValueError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def _running(lab: str, host: str) -> Optional[Dict[str, Any]]:
    found = _found(lab, host)
    if not found:
        return None
    leader = min(found, key=lambda p: p["pid"])
    port = int(leader["env"]["LABCTL_SANDBOX_PORT"])
    config: Dict[str, Any] = {}
    try:
        with open(leader["env"].get("LABCTL_SANDBOX_CONFIG") or "") as f:
            config = json.load(f)
    except (OSError, ValueError):
        pass
    bind = str(config.get("bind") or "")
    return {
        "pid": leader["pid"],
        "pgid": leader["pgid"],
        "port": port,
        "bind": bind,
        "config": config,
        "health": _health(bind, port),
        "procs": found,
    }


def ensure_token() -> bool:
    """Make the service's token file (0600) unless it is there: True when made now."""
    try:
        st = os.stat(paths.SANDBOX_TOKEN)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(paths.SANDBOX_TOKEN), exist_ok=True)
        write_atomic(paths.SANDBOX_TOKEN, secrets.token_urlsafe(32).encode() + b"\n", mode=0o600)
        return True
    if st.st_mode & 0o077:
        os.chmod(paths.SANDBOX_TOKEN, 0o600)  # ours: tightened, never widened
    return False


def _log_tail(lines: int = 20) -> str:
    try:
        with open(paths.SANDBOX_SERVICE_LOG, "rb") as f:
            f.seek(max(0, os.path.getsize(paths.SANDBOX_SERVICE_LOG) - 8192))
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return ""


def _view(r: Dict[str, Any], state: str) -> Dict[str, Any]:
    health = r.get("health") or {}
    return {
        "state": state,
        "pid": r["pid"],
        "port": r["port"],
        "bind": r["bind"],
        "health": health.get("state"),
        "langs": health.get("langs") or {},
        "served": health.get("served") or {},
    }


@command(
    takes={
        "lab": "str",
        "host": "str",
        "bind": "str",
        "port": "int",
        "langs": {},
        "limits": {},
        "pool": "int",
        "concurrency": "int",
    },
    answers=SANDBOX_SERVICE,
)
def start_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """sandbox.serve {lab, host, bind, port, langs, limits, pool, concurrency} ->
    {state: started | running | restarted, pid, port, bind, health, langs, token_made}.

    Idempotent: a service already running with this config is left as it is; one with
    another config is stopped and started again with this one.
    """
    lab, host = check_lab(args["lab"]), args["host"]
    # the lab too: the service's pools hold that lab's containers only
    config = {k: args[k] for k in ("lab", "bind", "port", "langs", "limits", "pool", "concurrency")}
    config["token_file"] = paths.SANDBOX_TOKEN
    token_made = ensure_token()
    before = _running(lab, host)
    state = "started"
    if before is not None:
        if before["config"] == config and (before["health"] or {}).get("state") == "ready" and not token_made:
            return dict(_view(before, "running"), token_made=False)
        _stop(lab, host, 10.0)
        state = "restarted"
    if not port_state(args["port"])["free"]:
        raise AgentError(
            f"port {args['port']} on {host} is taken by another program; pick another with --port", "port"
        )
    os.makedirs(os.path.dirname(paths.SANDBOX_SERVICE_CONFIG), exist_ok=True)
    write_json(paths.SANDBOX_SERVICE_CONFIG, config, mode=0o644)
    env = dict(os.environ)
    env.update(
        LABCTL_LAB=lab,
        LABCTL_HOST=host,
        LABCTL_SANDBOX_PORT=str(args["port"]),
        LABCTL_SANDBOX_CONFIG=paths.SANDBOX_SERVICE_CONFIG,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(p for p in (IMPORT_ROOT, env.get("PYTHONPATH")) if p),
    )
    argv = [sys.executable, "-m", MODULE, "--config", paths.SANDBOX_SERVICE_CONFIG]
    header = f"--- {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {lab}/{host}\n"
    try:
        proc = start_detached(argv, env, paths.SANDBOX_SERVICE_LOG, header)
    except OSError as exc:
        raise AgentError(f"cannot run {argv[0]} on {host}: {exc.strerror or exc}", "start_failed") from None
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AgentError(
                f"the sandbox service on {host} exited ({proc.returncode}) as it started:\n{_log_tail()}",
                "start_failed",
            )
        health = _health(args["bind"], args["port"], timeout=1.0)
        if health and health.get("state") == "ready":
            now = _running(lab, host)
            if now is not None:
                return dict(_view(now, state), token_made=token_made)
        time.sleep(0.2)
    raise AgentError(
        f"the sandbox service on {host} did not answer ready within {START_WAIT_S:g} s:\n{_log_tail()}",
        "start_failed",
    )


def _stop(lab: str, host: str, grace: float) -> List[int]:
    found = _found(lab, host)
    if not found:
        return []
    procs.terminate(found, lambda: _found(lab, host), grace)
    return sorted({p["pid"] for p in found})


@command(
    takes={"lab": "str", "host": "str", "grace": Opt("num", 30.0)},
    answers={"stopped": ["int"]},
)
def stop_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """sandbox.serve_stop {lab, host, grace} -> {stopped: [pids]}: SIGTERM (the batches in
    flight finish), SIGKILL what is left after `grace` s. Nothing running: stopped is []."""
    return {"stopped": _stop(args["lab"], args["host"], args["grace"])}


@command(
    takes={"lab": "str", "host": "str"},
    answers={"state": "str", "pid?": "int", "port?": "int", "bind?": "str"},
)
def state_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """sandbox.serve_state {lab, host} -> {state: running | stopped, ...}."""
    r = _running(args["lab"], args["host"])
    if r is None:
        return {"state": "stopped"}
    return _view(r, "running")


@command(
    takes={},
    answers={"token": "str"},
)
def token_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """sandbox.token {} -> {token}: the service's token, for the controller to hand on to the
    training hosts' agents (it is never shown or logged)."""
    try:
        with open(paths.SANDBOX_TOKEN, "rb") as f:
            return {"token": f.read().decode().strip()}
    except FileNotFoundError:
        raise AgentError("no sandbox token here: start the service first", "no_token") from None


@command(
    takes={"service": {}},
    answers={"service": "str", "token_file": "str"},
)
def client_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """sandbox.client {service: {url, host, langs}} -> {service, token_file}: on a training
    host, the service's address (0644) where the trainer's client reads it. The token itself
    arrived before, written by the controller straight into its 0600 file (its bytes on the SSH
    channel's stdin, never in a command line that `ps` would show); this checks it is there and
    private."""
    service = args["service"]
    if not isinstance(service.get("url"), str) or "token" in service:
        raise AgentError("service needs its url, and carries the token's file, never the token", "bad_args")
    try:
        st = os.stat(paths.SANDBOX_CLIENT_TOKEN)
    except FileNotFoundError:
        raise AgentError(
            f"no token at {paths.SANDBOX_CLIENT_TOKEN}: the controller copies it first", "no_token"
        ) from None
    if st.st_mode & 0o077:
        os.chmod(paths.SANDBOX_CLIENT_TOKEN, 0o600)
    doc = dict(service, token_file=paths.SANDBOX_CLIENT_TOKEN, updated=round(time.time(), 3))
    write_json(paths.SANDBOX_CLIENT, doc, mode=0o644, durable=True)
    return {"service": paths.SANDBOX_CLIENT, "token_file": paths.SANDBOX_CLIENT_TOKEN}


@command(
    takes={},
    answers={"removed": ["str"]},
)
def client_remove_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """sandbox.client_remove {} -> {removed}: the service is gone; so is its address here."""
    removed = []
    for path in (paths.SANDBOX_CLIENT, paths.SANDBOX_CLIENT_TOKEN):
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return {"removed": removed}
