"""The host's side of `labctl train`: preflight facts, detached launch, finding and stopping a run.

Every process of a run carries LABCTL_RUN_ID and LABCTL_HOST in its environment (the
controller sets them for torchrun, which passes them to its workers), so a run's processes
are found by reading /proc/*/environ, whatever became of the process that started them.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..core import paths, procs
from ..core.errors import AgentError
from ..core.fsutil import write_json
from ..core.gpus import GpuQueryError, gather_gpus
from ..core.launch import IMPORT_ROOT, port_state, torch_python
from ..core.spec import Opt, Or, command
from ..facts.collect import GPU, TORCH
from ..facts.nics import gather_nics
from . import fatal, runlog

TORCH_PROBE_TIMEOUT_S = 180.0


def _run_python(python: str, code: str, *args: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(
        [python, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=TORCH_PROBE_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def _probe_key(python: str, torch_origin: str) -> Optional[str]:
    """Names one torch install under one driver: importing torch costs seconds, finding it does not."""
    import hashlib

    parts = [os.path.realpath(python), torch_origin]
    try:
        for path in (os.path.realpath(python), os.path.join(os.path.dirname(torch_origin), "version.py")):
            st = os.stat(path)
            parts += [str(st.st_mtime_ns), str(st.st_size)]
    except OSError:
        return None
    try:
        with open("/proc/driver/nvidia/version") as f:
            parts.append(f.read())  # a driver update can change what torch.cuda reports
    except OSError:
        parts.append("no-driver")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def _torch_probe(python: str) -> Dict[str, Any]:
    """torch's build facts as the training interpreter sees them (it may be a venv, not the agent's).

    Cached per torch install and driver, so a second `labctl train` does not pay for importing
    torch on every host again.
    """
    try:
        where = _run_python(
            python,
            "import importlib.util as u; s = u.find_spec('torch'); print(s.origin if s and s.origin else '')",
        )
    except FileNotFoundError:
        return {"installed": False, "error": "no interpreter at " + python}
    except subprocess.TimeoutExpired:
        return {"installed": False, "error": f"{python} did not start in {TORCH_PROBE_TIMEOUT_S:.0f} s"}
    origin = where.stdout.strip().splitlines()[-1] if where.returncode == 0 and where.stdout.strip() else ""
    if not origin:
        return {"installed": False, "error": "torch is not installed for " + python}
    key = _probe_key(python, origin)
    cache = os.path.join(paths.torch_probe_dir(), key + ".json") if key else None
    if cache and os.path.exists(cache):
        try:
            with open(cache) as f:
                cached = dict(json.load(f))
            cached["cached"] = True
            return cached
        except (OSError, ValueError):
            pass
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); "
        "from labctl.agent.core.gpus import torch_facts; print(json.dumps(torch_facts()))"
    )
    try:
        proc = _run_python(python, code, IMPORT_ROOT)
    except subprocess.TimeoutExpired:
        return {"installed": False, "error": f"importing torch took over {TORCH_PROBE_TIMEOUT_S:.0f} s"}
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return {"installed": False, "error": lines[-1][:300] if lines else f"exit {proc.returncode}"}
    try:
        facts = dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return {"installed": False, "error": "the torch probe printed no JSON"}
    if cache and facts.get("installed") and not facts.get("cuda_error"):
        try:
            os.makedirs(os.path.dirname(cache), mode=0o700, exist_ok=True)
            write_json(cache, facts)
        except OSError:
            pass  # a read-only home only costs the next run the import
    return facts


def _iface_for(address: str) -> Dict[str, Any]:
    """The interface that carries `address` (the one other hosts reach this one on)."""
    for nic in gather_nics():
        for cidr in nic.get("addresses") or []:
            if cidr.split("/")[0] == address:
                return {
                    "name": nic["name"],
                    "is_bond": bool(nic.get("is_bond")),
                    "speed_mbps": nic.get("speed_mbps"),
                }
    if address.startswith("127.") or address in ("::1", "localhost"):
        return {"name": "lo", "is_bond": False, "speed_mbps": None}
    return {"name": None}


def _disk(path: str) -> Dict[str, Any]:
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    try:
        st = os.statvfs(probe)
    except OSError as exc:
        return {"path": path, "error": str(exc)}
    return {
        "path": path,
        "checked": probe,
        "free_bytes": st.f_bavail * st.f_frsize,
        "writable": os.access(probe, os.W_OK),
    }


def _json_file(path: str) -> Tuple[Any, Optional[Dict[str, Any]]]:
    """(the file's JSON, None), or (None, {present: false, path[, error]}) when it cannot be read."""
    try:
        with open(path) as f:
            return json.load(f), None
    except FileNotFoundError:
        return None, {"present": False, "path": path}
    except (OSError, ValueError) as exc:
        return None, {"present": False, "path": path, "error": str(exc)}


def orchestra_state() -> Dict[str, Any]:
    state, missing = _json_file(paths.WARM_STATE)
    if missing is not None:
        return missing
    return {"present": True, "path": paths.WARM_STATE, "state": state}


def endpoints_state() -> Dict[str, Any]:
    """The orchestra's endpoints.json here (what this host's trainers ask): present, how many models."""
    path = paths.ORCHESTRA_ENDPOINTS
    doc, missing = _json_file(path)
    if missing is not None:
        return missing
    models = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(models, list):
        return {"present": False, "path": path, "error": "not an endpoints file (no models list)"}
    return {"present": True, "path": path, "models": len(models), "updated": doc.get("updated")}


def sandbox_client_state() -> Dict[str, Any]:
    """Where this host's trainers find the sandbox service (client.json) and whether its token
    is there and private: what `labctl sandbox serve` writes on every host that trains."""
    path = paths.SANDBOX_CLIENT
    doc, missing = _json_file(path)
    if missing is not None:
        return missing
    if not isinstance(doc, dict) or not isinstance(doc.get("url"), str):
        return {"present": False, "path": path, "error": "not a sandbox service file (no url)"}
    out: Dict[str, Any] = {"present": True, "path": path, "url": doc["url"]}
    token = str(doc.get("token_file") or "")
    try:
        mode = os.stat(token).st_mode & 0o777
        out["token"] = "ok" if not mode & 0o077 else f"readable by others (mode {mode:o})"
    except OSError as exc:
        out["token"] = f"missing ({exc.strerror})"
    return out


@command(
    takes={
        "python": Opt("str?", None),
        "address": Or("str", ""),
        "checkpoint_dir": Or("str", ""),
        "port": Opt("int?", None),
        "orchestra": Opt("bool", False),
        "endpoints": Opt("bool", False),
        "sandbox": Opt("bool", False),
    },
    answers={
        "python?": "str",
        "torch?": TORCH,
        "cpu_count?": "int",
        "iface?": {"name?": "str?", "is_bond?": "bool", "speed_mbps?": "num?"},
        "disk?": {"free_bytes?": "int", "writable?": "bool", "error?": "str"},
        "gpus?": [GPU],
        "gpu_error?": "str",
        "rendezvous?": {"port?": "int", "free?": "bool", "error?": "str"},
        "orchestra?": {"present?": "bool", "path?": "str", "error?": "str", "state?": {"models?": [{}]}},
        "endpoints?": {"present": "bool", "path": "str", "error?": "str", "models?": "int"},
        "sandbox?": {"present": "bool", "path": "str", "error?": "str", "url?": "str", "token?": "str"},
    },
)
def preflight_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """Everything the controller's preflight checks, in one round trip."""
    python, source = torch_python(args["python"])
    out: Dict[str, Any] = {
        "python": python,
        "python_source": source,
        "torch": _torch_probe(python),
        "cpu_count": os.cpu_count() or 1,
        "iface": _iface_for(args["address"]),
        "disk": _disk(args["checkpoint_dir"] or paths.HOME),
    }
    try:
        out["gpu_source"], out["gpus"] = gather_gpus()
    except GpuQueryError as exc:
        out["gpu_source"], out["gpus"], out["gpu_error"] = "error", [], str(exc)
    if args["port"] is not None:
        out["rendezvous"] = port_state(args["port"])
    if args["orchestra"]:
        out["orchestra"] = orchestra_state()
    if args["endpoints"]:
        out["endpoints"] = endpoints_state()
    if args["sandbox"]:
        out["sandbox"] = sandbox_client_state()
    return out


def run_processes(run_id: str, host: str) -> List[Dict[str, Any]]:
    """Processes of `run_id` started for `host` (hosts sharing a kernel, as in the sim, stay apart)."""

    def want(env: Dict[str, str]) -> bool:
        if env.get("LABCTL_RUN_ID") != run_id:
            return False
        return not host or env.get("LABCTL_HOST") in (None, host)

    found = procs.scan(("LABCTL_RUN_ID", "LABCTL_HOST"), want)
    return [{"pid": p["pid"], "pgid": p["pgid"], "cmd": p["cmd"]} for p in found]


@command(
    takes={
        "run_id": Or("str", ""),
        "host": Or("str", ""),
        "stop": Opt("bool", False),
        "grace": Opt("num", 10.0),
        "log_dir": Or("str", ""),
    },
    answers={
        "processes": [{"pid": "int"}],
        "remaining": [{"pid": "int"}],
        "killed?": "bool",
        "fatal?": "str",
    },
)
def ps_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """The run's processes here; with stop: SIGTERM, wait `grace` s, SIGKILL, and report what is left."""
    run_id, host = args["run_id"], args["host"]
    if not run_id:
        raise AgentError("run_id is required", "bad_args")
    found = run_processes(run_id, host)
    log_dir = _log_dir(args)
    out: Dict[str, Any] = {"processes": found, "stopped": [], "remaining": found}
    if args["stop"] and found:
        killed, left = procs.terminate(found, lambda: run_processes(run_id, host), args["grace"])
        _mark_stopped(log_dir)
        out.update(stopped=found, killed=bool(killed), remaining=left)
    reason = _fatal_reason(log_dir)
    if reason is not None:
        out["fatal"] = reason
    return out


def _fatal_reason(log_dir: str) -> Optional[str]:
    """The trainer's own reason when a fatal error ended the run here (fatal.py), else None."""
    if not log_dir:
        return None
    doc = fatal.read(log_dir)
    return str(doc["reason"]) if doc is not None else None


def _log_dir(args: Dict[str, Any]) -> str:
    """The run's folder the controller names (paths.runs_dir); refused when it climbs with '..'
    or holds a control character, whoever wrote the run's record. "" when none is given."""
    log_dir: str = args["log_dir"]
    bad = next((p for p in log_dir.split("/") if p and paths.component_problem(p)), None)
    if bad is not None:
        raise AgentError(
            f"log_dir {log_dir!r} is not a run's folder: {paths.component_problem(bad)}", "bad_args"
        )
    return log_dir


def _mark_stopped(log_dir: Any) -> None:
    if not log_dir or not os.path.isdir(str(log_dir)):
        return
    path = os.path.join(str(log_dir), "stopped")
    with open(path, "w") as f:
        f.write(str(time.time()))


@command(
    takes={"line": Or("str", ""), "log_dir": Or("str", ""), "env": Or({}, {})},
    answers={"pid": "int", "pgid?": "int", "started?": "time"},
)
def spawn_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """Start `line` detached from the SSH session (for --detach); output to LOG_DIR/console.log."""
    line = args["line"]
    log_dir = _log_dir(args)
    if not line or not log_dir:
        raise AgentError("line and log_dir are required", "bad_args")
    os.makedirs(log_dir, mode=0o700, exist_ok=True)
    console = os.path.join(log_dir, "console.log")
    rc_path = os.path.join(log_dir, "rc")
    # The shell records torchrun's exit code, so `monitor.status` can tell finished from killed.
    script = f"{line} > {shlex.quote(console)} 2>&1 </dev/null; echo $? > {shlex.quote(rc_path)}.tmp && mv {shlex.quote(rc_path)}.tmp {shlex.quote(rc_path)}"
    # The wrapper carries the run's id too, so `monitor.status` sees the run before torchrun has started.
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in args["env"].items()})
    proc = subprocess.Popen(
        ["sh", "-c", script],
        env=env,
        cwd=log_dir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own session: closing the SSH channel does not reach it
        close_fds=True,
    )
    record = {"pid": proc.pid, "pgid": proc.pid, "started": time.time(), "line": line}
    write_json(os.path.join(log_dir, "run.json"), record)
    return record


def newest_event(
    lines: List[str], prefix: str = "", want: Optional[Callable[[Dict[str, Any]], bool]] = None
) -> Optional[Dict[str, Any]]:
    """The newest JSON event (an object with "event") among `lines`, after `prefix` where given."""
    return next((e for e in reversed(runlog.events(lines, prefix)) if want is None or want(e)), None)


def _last_event(console: str) -> Optional[Dict[str, Any]]:
    """The newest rank-0 event in a console log (read from its tail only)."""
    return newest_event(runlog.tail_lines(console, 65536), "[rank0]:")


@command(
    takes={"run_id": Or("str", ""), "log_dir": Or("str", ""), "host": Or("str", "")},
    answers={
        "state": "str",
        "fatal?": "str",
        "processes?": "int",
        "rc?": "int?",
        "last_event?": ({}, "null"),
        "resume_step?": "any",
    },
)
def status_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """State of a detached run here: running, exited (rc), or stopped; and its newest event."""
    run_id = args["run_id"]
    log_dir = _log_dir(args)
    host = args["host"]
    found = run_processes(run_id, host)
    out: Dict[str, Any] = {"run_id": run_id, "processes": len(found), "log_dir": log_dir}
    rc_path = os.path.join(log_dir, "rc")
    # The exit code file is written last, as torchrun's wrapper ends: it wins over a wrapper
    # process that is still on its way out.
    if os.path.exists(os.path.join(log_dir, "stopped")):
        out["state"] = "stopped"
    elif os.path.exists(rc_path):
        with open(rc_path) as f:
            text = f.read().strip()
        out["rc"] = int(text) if text.lstrip("-").isascii() and text.lstrip("-").isdigit() else None
        out["state"] = "finished" if out["rc"] == 0 else "failed"
    elif found:
        out["state"] = "running"
    elif os.path.isdir(log_dir):
        out["state"] = "gone"  # no process, no exit code: killed from outside, or the host rebooted
    else:
        out["state"] = "unknown"
    reason = _fatal_reason(log_dir)
    if reason is not None and out["state"] != "stopped":
        # torchrun was ended by the trainer itself: its exit code says nothing, the reason does.
        out["state"] = "failed"
        out["fatal"] = reason
    out["last_event"] = _last_event(os.path.join(log_dir, "console.log"))
    last = out["last_event"] or {}
    if out["state"] == "finished" and last.get("event") == "paused":
        # Under torchrun a paused trainer exits 0 (anything else is a failure to torchrun): its
        # last event tells a time-boxed run's end from a finished one.
        out["state"] = "paused"
        out["resume_step"] = last.get("resume_step")
    return out
