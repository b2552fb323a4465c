"""The orchestra's agent commands on a serving host: start, watch, stop and record model servers.

A server is found by the tags in its environment (LABCTL_ORCH_MODEL, _PORT, _GPU, _STARTED,
LABCTL_HOST and LABCTL_LAB), never by a pid file: a rotation killed half-way leaves processes but
may leave no record, and the next one must still find them. Every lookup keeps to the processes
tagged for `args.lab` and `args.host`: one machine can be a host of two labs (two inventories
naming it alike), and neither lab's repair may take the other's servers for its own orphans. Each server runs in its own
session (it outlives the SSH channel that started it) and is stopped by process group.
Errors carry a kind the controller branches on: bad_args, no_model, port, running, start_failed.
Standard library only, Python 3.8; torch is only ever imported by the server process.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shlex
import socket
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from ..core import paths, procs
from ..core.errors import AgentError
from ..core.fsutil import write_json
from ..core.gpus import GpuQueryError, gather_gpus
from ..core.launch import IMPORT_ROOT, port_state, start_detached, torch_python
from ..core.spec import Opt, Or, command
from ..modelload.loader import model_files
from .answers import HealthAnswer, StartAnswer, StateAnswer, StopAnswer
from .engine_host import check_build_covers, find_binary, weights_file
from .records import append_history, read_history, read_warm

TAGS = (
    "LABCTL_LAB",
    "LABCTL_HOST",
    "LABCTL_ORCH_MODEL",
    "LABCTL_ORCH_PORT",
    "LABCTL_ORCH_GPU",
    "LABCTL_ORCH_STARTED",
)
SERVER_MODULE = "labctl.agent.orchestra.server"
PROBE_TIMEOUT_S = 2.0
POLL_S = 0.25
LOG_TAIL_LINES = 20
LOG_HEADER = "==== labctl orchestra.start "
# A model's name becomes a log file's name and a shell word: keep it to safe characters.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}\Z")
TEMPLATE_FIELDS = "{path} {port} {gpu} {name} {file} {binary}"
READY_PROMPT = "Hello"


# ---- arguments -------------------------------------------------------------------------------
# Each command's @command says which arguments it takes; these check what a type cannot say.

# The controller tags every orch_ command with the lab and the host (see labctl/orchestra/rotate.py).
_SERVERS_OF = {"lab": "any", "host": "any"}


def _host(args: Dict[str, Any]) -> str:
    host = args["host"]
    if not isinstance(host, str) or not host:
        raise AgentError(
            "host is required: the inventory name of this host (servers are tagged with it)", "bad_args"
        )
    return host


def _lab(args: Dict[str, Any]) -> str:
    lab = args["lab"]
    if not isinstance(lab, str) or not lab:
        raise AgentError("lab is required: the inventory's lab name (servers are tagged with it)", "bad_args")
    return lab


def _model_name(value: Any, field: str = "model") -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise AgentError(
            f"{field} must be a model name of letters, digits, '.', '_', '+' or '-' (got {value!r})",
            "bad_args",
        )
    return value


def _health_path(args: Dict[str, Any]) -> str:
    path = args["health_path"]
    if not path.startswith("/") or any(c.isspace() for c in path):
        raise AgentError(f"health_path must be a URL path such as /health, got {path!r}", "bad_args")
    return path


def _number(args: Dict[str, Any], key: str, default: float) -> float:
    value = args[key]
    if value is None:
        value = default
    if value < 0:
        raise AgentError(f"{key} must be a number of seconds, 0 or more, got {value!r}", "bad_args")
    return float(value)


def _gpu(value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AgentError(f"gpu must be a GPU index (0, 1, ...) or null for none, got {value!r}", "bad_args")
    return value


# ---- finding servers ---------------------------------------------------------------------------


def _int_tag(value: Optional[str]) -> Optional[int]:
    return int(value) if value and value.isascii() and value.isdigit() else None


def _of(env: Dict[str, str], lab: str, host: str) -> bool:
    return env.get("LABCTL_LAB") == lab and env.get("LABCTL_HOST") == host


def server_processes(lab: str, host: str, models: Optional[List[str]] = None) -> procs.Procs:
    """Every process tagged as an orchestra server of `lab`'s `host` (of `models` when given)."""

    def want(env: Dict[str, str]) -> bool:
        model = env.get("LABCTL_ORCH_MODEL")
        return bool(model) and _of(env, lab, host) and (models is None or model in models)

    return procs.scan(TAGS, want)


def servers(lab: str, host: str, models: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """One entry per server (process group): {model, gpu, port, pid, pgid, started, pids}."""
    return by_server(server_processes(lab, host, models))


def other_servers(lab: str, host: str, every: procs.Procs) -> List[Dict[str, Any]]:
    """The servers among `every` (all orchestra processes here) that another lab (or another
    host name) started: shown, never stopped. {lab, host, model, pid, port}; lab/host None for
    a server tagged without them."""
    found = [p for p in every if not _of(p["env"], lab, host)]
    tags = {p["pgid"]: p["env"] for p in found}
    return [
        {
            "lab": tags[s["pgid"]].get("LABCTL_LAB"),
            "host": tags[s["pgid"]].get("LABCTL_HOST"),
            "model": s["model"],
            "pid": s["pid"],
            "port": s["port"],
        }
        for s in by_server(found)
    ]


def by_server(found: procs.Procs) -> List[Dict[str, Any]]:
    """Tagged processes grouped into servers, one per process group.

    `pid` is the group's leader, the process orchestra.start started (a template's shell, or the
    server itself); its children (a template's server, a server's workers) are in `pids`.
    """
    groups: Dict[Tuple[str, int], List[Dict[str, Any]]] = {}
    for p in found:
        groups.setdefault((p["env"]["LABCTL_ORCH_MODEL"], p["pgid"]), []).append(p)
    out = []
    for (model, pgid), members in groups.items():
        leader = next((p for p in members if p["pid"] == pgid), min(members, key=lambda p: p["pid"]))
        env = leader["env"]
        try:
            started: Optional[float] = float(env.get("LABCTL_ORCH_STARTED", ""))
        except ValueError:
            started = None
        out.append(
            {
                "model": model,
                "gpu": _int_tag(env.get("LABCTL_ORCH_GPU")),
                "port": _int_tag(env.get("LABCTL_ORCH_PORT")),
                "pid": leader["pid"],
                "pgid": pgid,
                "started": started,
                "pids": sorted(p["pid"] for p in members),
            }
        )
    return sorted(out, key=lambda s: (s["model"], s["started"] or 0.0, s["pid"]))


def _state_of(health: Optional[Dict[str, Any]], loading_words: List[str]) -> Optional[str]:
    """The state a health answer says: labctl's {"state"}, or an engine's error text that means
    it is still loading (llama-server: 503 {"error": {"message": "Loading model"}})."""
    if health is None:
        return None
    if isinstance(health.get("state"), str):
        return str(health["state"])
    error = health.get("error")
    text = error.get("message") if isinstance(error, dict) else error
    if isinstance(text, str) and any(w in text.lower() for w in loading_words):
        return "loading"
    status = health.get("status")
    return status if isinstance(status, str) else None


def probe(
    port: Optional[int],
    health_path: str,
    timeout: float = PROBE_TIMEOUT_S,
    loading_words: Optional[List[str]] = None,
) -> Dict[str, Any]:
    """{healthy, health: the answer's JSON object or null, error, state} for GET health_path."""
    if port is None:
        return {"healthy": False, "health": None, "error": "the server has no port tag", "state": "unknown"}
    # http.client, not urllib: a host's http_proxy must not capture 127.0.0.1.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", health_path)
        resp = conn.getresponse()
        body = resp.read(1 << 16)
    except ConnectionRefusedError:
        return {
            "healthy": False,
            "health": None,
            "error": f"nothing listens on port {port} yet",
            "state": "starting",
        }
    except socket.timeout:  # noqa: UP041 (on Python < 3.10 it is not TimeoutError)
        return {
            "healthy": False,
            "health": None,
            "error": f"port {port}: no answer in {timeout:g} s",
            "state": "busy",
        }
    except (OSError, http.client.HTTPException) as exc:
        return {"healthy": False, "health": None, "error": f"port {port}: {exc}", "state": "starting"}
    finally:
        conn.close()
    try:
        doc = json.loads(body.decode("utf-8"))
    except ValueError:
        doc = None
    health = doc if isinstance(doc, dict) else None
    state = _state_of(health, loading_words or ["loading"])
    if resp.status == 200:
        return {"healthy": True, "health": health, "error": None, "state": "ready"}
    what = f" ({state})" if state else ""
    return {
        "healthy": False,
        "health": health,
        "error": f"GET {health_path} answered HTTP {resp.status}{what}",
        "state": state or "unhealthy",
    }


def first_token(port: int, model: str, timeout: float) -> Optional[str]:
    """None once a one-token completion answered through the OpenAI API, else why not: health
    alone can pass before an engine can answer (a model still compiling its first kernels)."""
    body = json.dumps({"model": model, "prompt": READY_PROMPT, "max_tokens": 1, "temperature": 0}).encode(
        "utf-8"
    )
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read(1 << 16)
    except (OSError, http.client.HTTPException) as exc:
        return f"POST /v1/completions: {exc}"
    finally:
        conn.close()
    try:
        doc = json.loads(data.decode("utf-8"))
    except ValueError:
        doc = None
    if resp.status != 200 or not isinstance(doc, dict) or not doc.get("choices"):
        message = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(message, dict):
            message = message.get("message")
        return f"a one-token completion answered HTTP {resp.status}" + (f": {message}" if message else "")
    return None


def _probe_all(entries: List[Dict[str, Any]], health_path: str) -> List[Dict[str, Any]]:
    """probe() for each entry's port at once: a state call costs one timeout, not one per server."""
    results: List[Dict[str, Any]] = [{} for _ in entries]

    def one(i: int) -> None:
        results[i] = probe(entries[i].get("port"), health_path)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(entries))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


# ---- logs and state files ----------------------------------------------------------------------


def log_path(model: str) -> str:
    return paths.child(paths.ORCHESTRA_LOGS, model, "the model") + ".log"


def log_tail(model: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines the server wrote since its last start (the older runs are history)."""
    try:
        with open(log_path(model), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - (1 << 16)))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    start = text.rfind(LOG_HEADER)
    if start >= 0:
        text = text[text.find("\n", start) + 1 :] if "\n" in text[start:] else ""
    return "\n".join(text.splitlines()[-lines:])


# ---- commands ----------------------------------------------------------------------------------


@command(
    takes={**_SERVERS_OF, "health_path": Or("str", "/health"), "gpus": Opt("bool", False)},
    answers=StateAnswer,
)
def state_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """orchestra.state {host, health_path="/health", gpus: bool}: warm.json, history, live servers, GPUs."""
    host, lab = _host(args), _lab(args)
    health_path = _health_path(args)
    warm, warm_error = read_warm()
    # One pass over /proc: this lab's servers and everyone else's.
    every = procs.scan(TAGS, lambda env: bool(env.get("LABCTL_ORCH_MODEL")))
    found = by_server([p for p in every if _of(p["env"], lab, host)])
    answers = _probe_all(found, health_path)
    for i, entry in enumerate(found):  # not zip(strict=): Python 3.8
        answer = answers[i]
        entry.update(healthy=answer["healthy"], health=answer["health"], error=answer["error"])
    out: Dict[str, Any] = {
        "warm": warm,
        "warm_error": warm_error,
        "history": read_history(),
        "servers": found,
        "others": other_servers(lab, host, every),
    }
    if args["gpus"]:
        try:
            out["gpu_source"], out["gpus"] = gather_gpus()
        except GpuQueryError as exc:
            out["gpu_source"], out["gpus"], out["gpu_error"] = "error", [], str(exc)
    return out


def _check_model_dir(path: str) -> None:
    """labctl's server needs a tinylm folder: config.json and safetensors weights."""
    if not os.path.isdir(path):
        raise AgentError(f"{path} is not a folder: labctl's server takes a model folder", "no_model")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise AgentError(
            f"{path} has no config.json: not a model folder labctl's server can load", "no_model"
        )
    try:
        model_files(path)
    except (OSError, ValueError) as exc:
        raise AgentError(f"{path}: {exc}", "no_model") from None


def _format(
    template: str,
    path: str,
    port: int,
    gpu: Optional[int],
    name: str,
    file: str = "",
    binary: str = "",
) -> str:
    values = {
        "path": path,
        "port": str(port),
        "gpu": "" if gpu is None else str(gpu),
        "name": name,
        "file": file or path,
        "binary": binary,
    }
    try:
        return template.format(**{k: shlex.quote(v) for k, v in values.items()})
    except (KeyError, IndexError, ValueError) as exc:
        raise AgentError(
            f"command template {template!r} cannot be filled ({type(exc).__name__}: {exc}); it may use "
            f"{TEMPLATE_FIELDS}, and a literal brace is written twice ({{{{ or }}}})",
            "bad_args",
        ) from None


@command(
    takes={
        **_SERVERS_OF,
        "model": "any",
        "gpu": Opt("any", None),
        "path": "any",
        "command": Opt("any", None),
        "python": Opt("any", None),
        "health_path": Or("str", "/health"),
        "port": Opt("any", None),
        "engine": Opt("any", None),
        "binary": Opt("any", None),
        "cuda_check": Opt("any", None),
        "loading_words": Opt("any", None),
        "ready_by_completion": Opt("bool", False),
    },
    answers=StartAnswer,
)
def start_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """orchestra.start {host, model, gpu, path, command, python, health_path, port, engine, binary,
    cuda_check} -> {pid, port, log, started, argv}.

    `port` (optional): the port to use, refused (kind "port") when taken; default a free one.
    `binary`: the engine's program (a path, or a name looked for on PATH and under labctl's
    install root), refused (kind "no_engine") where the host has none; `cuda_check`
    "build.json": the build's manifest must cover the placed GPU's compute capability.
    """
    host, lab = _host(args), _lab(args)
    model = _model_name(args["model"])
    gpu = _gpu(args["gpu"])
    _health_path(args)
    path = args["path"]
    if not isinstance(path, str) or not path:
        raise AgentError("path is required: the model's folder (or file) on this host", "bad_args")
    command = args["command"]
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise AgentError("command must be a template string (or null for labctl's server)", "bad_args")
    python = args["python"]
    if python is not None and (not isinstance(python, str) or not python):
        raise AgentError("python must be an interpreter's path (or null)", "bad_args")
    wanted = args["port"]
    if wanted is not None and (
        isinstance(wanted, bool) or not isinstance(wanted, int) or not 0 < wanted < 65536
    ):
        raise AgentError(
            f"port must be a TCP port (1-65535) or null for a free one, got {wanted!r}", "bad_args"
        )
    if not os.path.exists(path):
        raise AgentError(f"{path} does not exist on {host}: is the model in its cache?", "no_model")

    running = servers(lab, host, [model])
    if running:
        r = running[0]
        raise AgentError(
            f"{model} already has a server on {host} (pid {r['pid']}, port {r['port']}); stop it first",
            "running",
        )
    port_info = port_state(wanted or 0)
    if not port_info["free"]:
        raise AgentError(f"port {wanted} on {host} is taken ({port_info.get('error')})", "port")
    port = int(port_info["port"])

    env = dict(os.environ)
    engine = args["engine"] or ("labctl" if command is None else "command")
    if command is None:
        _check_model_dir(path)
        py, _ = torch_python(python)
        argv = [py, "-m", SERVER_MODULE, "--model-dir", path, "--port", str(port), "--name", model]
        # The server is part of the agent: it runs from the same zipapp (or source tree).
        env["PYTHONPATH"] = os.pathsep.join(p for p in (IMPORT_ROOT, env.get("PYTHONPATH")) if p)
    else:
        binary = find_binary(args["binary"], host, engine) if args["binary"] else ""
        if binary and args["cuda_check"] == "build.json" and gpu is not None:
            check_build_covers(binary, gpu, host, engine)
        file = weights_file(path) if "{file}" in command else path
        argv = ["sh", "-c", _format(command, path, port, gpu, model, file, binary)]
    started = round(time.time(), 3)
    env.update(
        {
            "LABCTL_LAB": lab,
            "LABCTL_HOST": host,
            "LABCTL_ORCH_MODEL": model,
            "LABCTL_ORCH_PORT": str(port),
            "LABCTL_ORCH_GPU": "" if gpu is None else str(gpu),
            "LABCTL_ORCH_STARTED": repr(started),
            "PYTHONUNBUFFERED": "1",
            # The placement's GPU indices are nvidia-smi's, which counts in PCI bus order.
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            # No GPU placed: none visible, so a server that would take GPU 0 runs on the CPU.
            "CUDA_VISIBLE_DEVICES": "" if gpu is None else str(gpu),
        }
    )
    log = log_path(model)
    os.makedirs(paths.ORCHESTRA_LOGS, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
    shown_gpu = "none" if gpu is None else gpu
    header = (
        f"{LOG_HEADER}{stamp} host={host} model={model} port={port} gpu={shown_gpu}: {shlex.join(argv)}\n"
    )
    try:
        proc = start_detached(argv, env, log, header)
    except OSError as exc:
        reason = f"cannot run {argv[0]}: {exc.strerror or exc}"
        raise AgentError(f"{model} on {host}: {reason}", "start_failed") from None
    return {
        "model": model,
        "pid": proc.pid,
        "port": port,
        "gpu": gpu,
        "log": log,
        "started": started,
        "argv": argv,
    }


def _emit(event: Dict[str, Any]) -> None:
    sys.stderr.write(json.dumps(event, sort_keys=True, separators=(",", ":")) + "\n")
    sys.stderr.flush()


def _alive(lab: str, host: str, model: str, pid: Optional[int]) -> bool:
    """The server still runs: its pid, still tagged as this model's (a reused pid is not), or any
    process of the model when no pid was given."""
    if pid is None:
        return bool(server_processes(lab, host, [model]))
    env = procs.environ(pid, TAGS) or {}
    return (
        procs.alive(pid)
        and env.get("LABCTL_ORCH_MODEL") == model
        and env.get("LABCTL_HOST") == host
        and env.get("LABCTL_LAB") == lab
    )


@command(
    takes={
        **_SERVERS_OF,
        "servers": "any",
        "timeout": Opt("num?", 300.0),
        "health_path": Or("str", "/health"),
    },
    answers=HealthAnswer,
    per_asked=("results", "servers"),
)
def health_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """orchestra.health {host, servers: [{model, port, pid}], timeout, health_path} -> {results}.

    Waits for every server at once until it answers 200, its process is gone (at once, with the
    log's tail), or `timeout` s passed. Progress: {"event": "health", "model", "state"} on stderr.
    """
    host, lab = _host(args), _lab(args)
    health_path = _health_path(args)
    timeout = _number(args, "timeout", 300.0)
    wanted = args["servers"]
    if not isinstance(wanted, list):
        raise AgentError("servers must be a list of {model, port, pid}", "bad_args")
    todo: List[Dict[str, Any]] = []
    for i, s in enumerate(wanted):
        if not isinstance(s, dict):
            raise AgentError(f"servers[{i}] must be an object {{model, port, pid}}", "bad_args")
        model = _model_name(s.get("model"), f"servers[{i}].model")
        port, pid = s.get("port"), s.get("pid")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise AgentError(f"servers[{i}].port must be a TCP port, got {port!r}", "bad_args")
        if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid < 1):
            raise AgentError(f"servers[{i}].pid must be a process id or null, got {pid!r}", "bad_args")
        path = s.get("health_path") or health_path
        if not isinstance(path, str) or not path.startswith("/"):
            raise AgentError(f"servers[{i}].health_path must be a URL path, got {path!r}", "bad_args")
        words = s.get("loading_words") or ["loading"]
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise AgentError(f"servers[{i}].loading_words must be a list of text", "bad_args")
        todo.append(
            {
                "model": model,
                "port": port,
                "pid": pid,
                "health_path": path,
                "loading_words": [w.lower() for w in words],
                "by_completion": bool(s.get("ready_by_completion")),
            }
        )

    results: List[Optional[Dict[str, Any]]] = [None] * len(todo)
    seen: Dict[int, str] = {}
    start = time.monotonic()
    deadline = start + timeout

    def finish(i: int, state: str, answer: Dict[str, Any], error: Optional[str]) -> None:
        s = todo[i]
        healthy = state == "ready"
        results[i] = {
            "model": s["model"],
            "port": s["port"],
            "pid": s["pid"],
            "healthy": healthy,
            "state": state,
            "seconds": round(time.monotonic() - start, 3),
            "health": answer.get("health"),
            "error": error,
            "log_tail": "" if healthy else log_tail(s["model"]),
        }
        _emit({"event": "health", "model": s["model"], "state": state})

    while True:
        for i, s in enumerate(todo):
            if results[i] is not None:
                continue
            alive = _alive(lab, host, s["model"], s["pid"])
            wait = min(PROBE_TIMEOUT_S, max(0.1, deadline - time.monotonic()))
            answer = probe(s["port"], s["health_path"], wait, s["loading_words"])
            if answer["healthy"] and alive and s["by_completion"]:
                why = first_token(s["port"], s["model"], max(wait, 30.0))
                if why is not None:
                    answer = dict(answer, healthy=False, state="warming", error=why)
            if answer["healthy"] and alive:
                finish(i, "ready", answer, None)
            elif not alive:
                what = f"pid {s['pid']}" if s["pid"] else "its process"
                finish(
                    i,
                    "exited",
                    answer,
                    f"{s['model']} on {host}: the server ({what}) is gone before it was healthy; "
                    f"its log {log_path(s['model'])} ends with the reason",
                )
            elif seen.get(i) != answer["state"]:
                seen[i] = answer["state"]
                _emit({"event": "health", "model": s["model"], "state": answer["state"]})
        if all(r is not None for r in results):
            break
        if time.monotonic() >= deadline:
            for i, s in enumerate(todo):
                if results[i] is None:
                    last = seen.get(i, "starting")
                    finish(
                        i,
                        "timeout",
                        {},
                        f"{s['model']} on {host}: not healthy after {timeout:g} s (last state: {last})",
                    )
            break
        time.sleep(POLL_S)
    return {"results": results}


@command(
    takes={**_SERVERS_OF, "models": Opt("any", None), "pids": Opt("any", None), "grace": Opt("num?", 30.0)},
    answers=StopAnswer,
)
def stop_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """orchestra.stop {host, models: [names] | null (all of the host's), pids: [server pids] | null,
    grace} -> {stopped, remaining, absent}.

    SIGTERM to each server's process group, SIGKILL to what is left after `grace` s.
    `pids` narrows it to those servers (a repair stops a second server of a model that also
    has the recorded one running). `absent`: models named that have no server here (stopping
    is idempotent, a repair's step).
    """
    host, lab = _host(args), _lab(args)
    grace = _number(args, "grace", 30.0)
    models = args["models"]
    if models is not None:
        if not isinstance(models, list):
            raise AgentError(
                "models must be a list of model names, or null for every server here", "bad_args"
            )
        models = [_model_name(m, "models[]") for m in models]
    pids = args["pids"]
    if pids is not None and (not isinstance(pids, list) or not all(isinstance(p, int) for p in pids)):
        raise AgentError("pids must be a list of server pids, or null", "bad_args")

    def scan() -> procs.Procs:
        found = server_processes(lab, host, models)
        return found if pids is None else [p for p in found if p["pgid"] in pids]

    found = scan()
    before = by_server(found)
    if not found:
        return {"stopped": [], "remaining": [], "absent": list(models or [])}
    killed, left = procs.terminate(found, scan, grace)
    killed_groups = {p["pgid"] for p in killed}
    stopped = [{"model": s["model"], "pid": s["pid"], "killed": s["pgid"] in killed_groups} for s in before]
    remaining = [{"model": p["env"]["LABCTL_ORCH_MODEL"], "pid": p["pid"]} for p in left]
    present = {s["model"] for s in before}
    return {
        "stopped": stopped,
        "remaining": remaining,
        "absent": [m for m in models or [] if m not in present],
    }


@command(
    takes={"lab": Opt("any", None), "host": Opt("any", None), "warm": "any", "history": Opt("any", None)},
    answers={"path?": "str", "updated?": "time"},
)
def commit_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """orchestra.commit {host, warm: warm.json without "updated", history: entry | null} -> {path, updated}.

    warm.json is replaced atomically (phase 3's preflight reads it at any moment), then the
    entry is appended to history.jsonl; both carry the same "updated" stamp.
    """
    warm = args["warm"]
    if not isinstance(warm, dict) or not isinstance(warm.get("models"), list):
        raise AgentError("warm must be warm.json's object, with a models list", "bad_args")
    entry = args["history"]
    if entry is not None and not isinstance(entry, dict):
        raise AgentError("history must be an object (one rotation's record) or null", "bad_args")
    updated = round(time.time(), 3)
    os.makedirs(os.path.dirname(paths.WARM_STATE), exist_ok=True)
    write_json(paths.WARM_STATE, dict(warm, updated=updated), durable=True)
    out: Dict[str, Any] = {"path": paths.WARM_STATE, "updated": updated}
    if entry is not None:
        os.makedirs(os.path.dirname(paths.ORCHESTRA_HISTORY), exist_ok=True)
        entry = dict(entry, updated=entry.get("updated", updated))
        # The address the controller came from: a rotation a host outside the inventory started.
        client = (os.environ.get("SSH_CONNECTION") or "").split()
        if client:
            entry["client"] = client[0]
        append_history(entry)
        out["history"] = paths.ORCHESTRA_HISTORY
    return out


@command(
    takes={"lab": Opt("any", None), "host": Opt("any", None), "endpoints": "any"},
    answers={"path": "str", "updated": "time", "models": "int"},
)
def publish_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """orchestra.publish {endpoints: {lab, models: [{name, base_url, model, host}], remote: [...]}}
    -> {path, updated, models}: on a host that trains, the models to ask now.

    Replaced atomically (a trainer reads it per batch of calls, at any moment); world-readable,
    as it holds addresses and the names of key variables, never a key.
    """
    doc = args["endpoints"]
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), list):
        raise AgentError("endpoints must be an object with a models list", "bad_args")
    for m in doc["models"] + list(doc.get("remote") or []):
        if not isinstance(m, dict) or not all(
            isinstance(m.get(k), str) for k in ("name", "base_url", "model")
        ):
            raise AgentError("each endpoint needs name, base_url and model as text", "bad_args")
        if "api_key" in m:
            raise AgentError("an endpoint carries the name of its key's variable, never the key", "bad_args")
    updated = round(time.time(), 3)
    os.makedirs(os.path.dirname(paths.ORCHESTRA_ENDPOINTS), exist_ok=True)
    write_json(paths.ORCHESTRA_ENDPOINTS, dict(doc, updated=updated), mode=0o644, durable=True)
    return {"path": paths.ORCHESTRA_ENDPOINTS, "updated": updated, "models": len(doc["models"])}
