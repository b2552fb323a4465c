"""What each agent command answers, as plain data: the shape the controller checks every
answer against before any of its code reads it (labctl/hosts/agent_ship.py, call_agent).

A host that answers otherwise (a `python:` that is not a plain Python, a replaced agent, a
broken disk under the agent's files) is then named as answering wrongly, instead of labctl
failing somewhere later on a missing key. The agent never imports this module: it lives here,
standard library only, so the agent package stays self-contained and the shapes sit beside the
command table they describe (labctl/agent/commands.py).

The shape language:
  "str", "bool", "null", "any"   a JSON value of that kind ("any": whatever it is)
  "int"                          a whole number (never true/false), within 64 bits
  "num"                          an int or a float, finite
  "time"                         a number of seconds since 1970, before the year 10000
  "cap"                          a CUDA compute capability as text: "8.6", "7.0", "9"
  "X?"                           X, or null
  [S]                            a list whose every item is S
  {"key": S, "key?": S}          an object with these keys ("key?": may be absent), each S;
                                 keys not named are allowed (an agent may add keys)
  {"*": S}                       an object whose other keys (a map by name) each hold S
  (S1, S2, ...)                  any one of these shapes
Only what the controller relies on is declared: a value some consumer only shows (`str(x)`)
may be "any", and what a run's own script logged stays "any" (its readers check each value).

Standard library only, Python 3.8 syntax.
"""

from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Optional, Tuple

INT_LIMIT = 2**63
TIME_LIMIT = 253402300800.0  # 10000-01-01: time.localtime() and strftime take anything before it
CAP_RE = re.compile(r"[ \t]*[0-9]+(\.[0-9]+)?[ \t]*")

# The parts of answers several commands share.
ERROR_ENTRY = {"error": "any"}  # what a facts section that failed holds instead of its value
GPU = {
    "index?": "int",
    "name?": "str?",
    "uuid?": "str?",
    "memory_total_bytes?": "int?",
    "memory_used_bytes?": "int?",
    "compute_capability?": "cap?",
    "driver_version?": "str?",
    "cuda_driver_version?": "str?",
    "utilization_pct?": "num?",
    "temperature_c?": "num?",
    "power_w?": "num?",
    "pci_bus_id?": "str?",
}
TORCH = {
    "installed?": "bool",
    "version?": "str?",
    "cuda?": "str?",
    "cuda_available?": "bool",
    "arch_list?": ["str"],
    "nccl?": "str?",
    "error?": "str?",
    "cuda_error?": "str?",
}
NIC = {
    "name": "str",
    "operstate?": "str?",
    "speed_mbps?": "num?",
    "addresses?": ["str"],
    "is_bond?": "bool",
    "master?": "str?",
    "virtual?": "bool",
    "bond?": ({"mode?": "str?", "mii_status?": "str?", "slaves?": [{"name?": "str?"}]}, "null"),
}
FACTS = {
    "os?": {"system?": "str?", "distro?": ({"id?": "str?", "version_id?": "str?"}, "null")},
    "cpu?": {"logical_cpus?": "int?", "physical_cores?": "int?", "model?": "str?"},
    "memory?": {"total_bytes?": "int", "available_bytes?": "int"},
    "gpu_source?": "str",
    "gpus?": ([GPU], ERROR_ENTRY),
    "nics?": ([NIC], ERROR_ENTRY),
    "mounts?": (
        [
            {
                "mountpoint": "str",
                "fstype?": "str?",
                "size_bytes?": "int?",
                "used_bytes?": "int?",
                "free_bytes?": "int?",
            }
        ],
        ERROR_ENTRY,
    ),
    "disks?": ([{"size_bytes?": "int?", "removable?": "bool?"}], ERROR_ENTRY),
    "python?": {"version?": "str"},
    "torch?": TORCH,
    "torch_env?": {},  # the provisioning record on the host, shown as it is
    "docker?": {"cli?": "str?", "server_version?": "str?"},
    "labctl?": {},
}
# A training run on the host, as `monitor.status` reports it. The step figures are what the run's script
# logged (the reference trainer's, or --script's own), so they are "any": their readers check them.
RUN = {
    "run_id": "str",
    "state?": "str?",
    "step?": "any",
    "steps?": "any",
    "loss?": "any",
    "tokens_per_s?": "any",
    "best_loss?": "num?",
    "best_step?": "any",
    "nccl_errors?": "int",
    "last_nccl_error?": "str?",
    "reward?": "any",
    "exec_success_rate?": "any",
    "programs_run?": "any",
    "rotation_wait_s?": "any",
    "orchestra_ms?": "any",
    "gpus?": (["int"], "null"),
    "started?": "time?",
}
STATUS = {
    "time": "time",
    "hostname?": "str?",
    "cpu?": {"count?": "int", "load?": ["num"], "busy_pct?": "num?"},
    "memory": {"total_bytes?": "int", "available_bytes?": "int", "used_bytes": "int"},
    "cache?": (
        {"path?": "str?", "mounted?": "bool", "size_bytes?": "int?", "used_bytes?": "int?"},
        "null",
    ),
    "gpus?": [GPU],
    "gpu_source?": "str?",
    "gpu_error?": "str?",
    "warm?": [{"model?": "str", "gpu?": "any", "port?": "any"}],  # gpu, port: as warm.json has them
    "runs?": [RUN],
    "history?": [
        {
            "t": "time",
            "memory_used_bytes?": "int?",
            "gpus?": [{"index?": "int?", "memory_used_pct?": "num?", "utilization_pct?": "num?"}],
        }
    ],
    "history_error?": "str?",
    "history_notes?": ["str"],
    # agent/orchestra/spend.py status(): null on a host with no remote tier's spend or budget.
    "remote_spend?": (
        {
            "month": "str",
            "dir?": "str",
            "tiers": [
                {
                    "tier": "str",
                    "usd": "num",
                    "prompt_tokens?": "int",
                    "completion_tokens?": "int",
                    "answers?": "int",
                    "budget_per_month?": "num?",
                }
            ],
            "errors?": ["str"],
        },
        "null",
    ),
}
CACHE_FILE = {"path": "str", "size": "int", "mtime_ns?": "int?"}
CACHE_MODEL = {
    "name?": "str",
    "files?": [CACHE_FILE],
    "bytes?": "int?",
    "chunk_size?": "int?",
    "present?": "bool",
    "disk_bytes?": "int?",
    # What the host's manifest.json holds, as far as the agent checks it (a damaged one is set
    # aside there); the rest only shows.
    "last_used?": "num?",
    "verified_at?": "num?",
    "pinned?": "any",
    "source?": "any",
}
REPAIRS = ["str"]
EVICTED = [{"name": "str", "bytes": "int?", "partial?": "bool"}]
SERVER = {"model": "str", "pid": "int", "pgid?": "int", "port?": "int?", "gpu?": "int?", "started?": "time?"}
CKPT_ENTRY: Dict[str, Any] = {
    "run_id": "str",
    "step": "int",
    "path": "str",
    "bytes?": "int?",
    "record?": ({}, "null"),
}
PUBLISHED_FILES = {"*": {"size": "int", "sha256": "str"}}
STAGE = {"bytes?": "int", "seconds?": "num", "skipped?": "str"}
SANDBOX_SERVICE = {
    "state": "str",
    "pid": "int",
    "port": "int",
    "bind": "str",
    "langs": {"*": "str"},
    "token_made": "bool",
}

ANSWERS: Dict[str, Any] = {
    "ping": {"agent_version?": "any", "python_version?": "str", "pid?": "int", "time": "time"},
    "facts.collect": FACTS,
    "provision.probe": {"results": {"*": {}}},
    "provision.apply": {"done": ["any"]},
    # llama.cpp's llama-server built on the host (labctl/agent/provision/llama_cpp.py).
    "provision.llama_cpp_build": {"prefix": "str", "built": "bool", "manifest": {}, "server_version": "str?"},
    "provision.llama_cpp_probe": {
        "installs": {"*": {"prefix": "str", "installed": "bool", "manifest": ({}, "null"), "error": "str?"}},
        "gpus": [{"name": "str", "compute_capability": "cap"}],
        "nvcc": ({"path": "str", "version": "str?"}, "null"),
    },
    "provision.host_lock": {},
    "cron.list": {
        "jobs": [
            {
                "name": "str",
                "backend?": "str?",
                "schedule?": "str?",
                "last?": ({"rc?": "int?", "end?": "time?"}, "null"),
                "next?": "time?",
                "daemon_running?": "bool",
            }
        ],
        "daemons?": {"cron?": ["int"], "systemd?": "bool"},
        "time?": "time",
    },
    "cache.state": {
        "cache": "str",
        "exists": "bool",
        "mounted?": "bool",
        "fstype?": "str?",
        "capacity_bytes?": "int?",
        "used_bytes?": "int?",
        "free_bytes?": "int?",
        "models?": {"*": CACHE_MODEL},
        "partials?": [
            {
                "name": "str",
                "total_bytes?": "int",
                "done_bytes?": "int",
                "disk_bytes?": "int?",
                "chunk_size?": "int?",
                "files?": {"*": {"size?": "int?", "mtime_ns?": "int?"}},
                "source?": "any",
                "updated?": "num?",
            }
        ],
        "untracked?": ["str"],
        "now?": "time",
        "repairs?": REPAIRS,
    },
    "cache.list": {
        "root?": "str",
        "models": {"*": {"name?": "str", "files": [CACHE_FILE], "bytes": "int", "chunk_size?": "int"}},
        "missing?": ["str"],
        "available?": ["str"],
    },
    "cache.serve": {"port?": "int", "bytes_sent?": "int", "connections?": "int", "seconds?": "num"},
    "cache.pull": {
        "models": [
            {
                "name": "str",
                "bytes?": "int",
                "chunks": "int",
                "fetched_bytes": "int",
                "fetched_chunks": "int",
                "resumed_bytes": "int",
                "resumed_chunks": "int",
                "committed": "bool",
                "path": "str",
            }
        ],
        "evicted?": EVICTED,
        "fetched_bytes?": "int",
        "resumed_bytes?": "int",
        "retries?": "int",
        "streams?": "int",
        "chunk_size?": "int",
        "seconds?": "num",
        "verify_seconds?": "num",
        "rate_bytes_per_s?": "num",
    },
    "cache.evict": {"evicted": EVICTED, "not_cached": ["str"], "pinned": ["str"], "repairs?": REPAIRS},
    "cache.pin": {"model": "str", "pinned": "bool", "changed": "bool", "repairs?": REPAIRS},
    "cache.touch": {"touched": "bool", "last_used?": "time?"},
    "cache.verify": {
        "models": [
            {
                "name": "str",
                "status": "str",
                "bytes?": "int?",
                "seconds?": "num",
                "bad?": [{"path": "str", "chunks": ["int"]}],
                "chunk_size?": "int",
                "moved_to_partial?": "bool",
            }
        ],
        "repairs?": REPAIRS,
    },
    "modelload.read_cold": {"bytes": "int", "seconds": "num", "fstype?": "str?"},
    "modelload.load_stages": {
        "stages": {"ram_cache": {"bytes": "int", "seconds?": "num"}, "*": STAGE},
        "memcpy_gbps?": "num?",
        "h2d_pinned_gbps?": "num?",
    },
    "modelload.make_model": {"path": "str", "files": [{}], "bytes": "int", "seconds": "num"},
    # One entry per path asked: describe()'s answer, or {"error", "kind"} for a path not there.
    "modelload.describe": {"models": {"*": {"format?": "str", "problems?": ["str"], "error?": "str"}}},
    "train.preflight": {
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
    "train.spawn": {"pid": "int", "pgid?": "int", "started?": "time"},
    "train.ps": {
        "processes": [{"pid": "int"}],
        "remaining": [{"pid": "int"}],
        "killed?": "bool",
        "fatal?": "str",
    },
    "train.status": {
        "state": "str",
        "fatal?": "str",
        "processes?": "int",
        "rc?": "int?",
        "last_event?": ({}, "null"),
        "resume_step?": "any",
    },
    "orchestra.state": {
        # warm.json as the host holds it, damage and all: the rotation repairs what it finds
        "warm?": ({"models?": ["any"]}, "null"),
        "warm_error?": "str?",
        "history?": [{}],
        "servers": [SERVER],
        "others?": [{}],
        "gpu_source?": "str",
        "gpus?": [GPU],
        "gpu_error?": "str",
    },
    "orchestra.start": {"model?": "str", "pid": "int", "port": "int", "gpu?": "int?", "log?": "str"},
    "orchestra.health": {
        "results": [
            {
                "model": "str",
                "port?": "int",
                "pid?": "int?",
                "healthy": "bool",
                "state?": "str",
                "error?": "str?",
                "log_tail?": "str",
            }
        ]
    },
    "orchestra.stop": {
        "stopped": [{"model": "str", "pid": "int", "killed?": "bool"}],
        "remaining": [{"model?": "str", "pid?": "int"}],
        "absent?": ["str"],
    },
    "orchestra.commit": {"path?": "str", "updated?": "time"},
    "orchestra.publish": {"path": "str", "updated": "time", "models": "int"},
    "network.txn_begin": {"id?": "str", "keeper_pid?": "int?", "deadline_at?": "time"},
    "network.txn_status": {"state?": "str?", "differences?": (["str"], "null")},
    "network.txn_commit": {"committed": "bool", "state?": "str?"},
    "network.txn_abort": {"state?": "str?", "keeper_running?": "bool"},
    "sandbox.images": {"images": [{"image?": "str?", "lang?": "str?"}]},
    "sandbox.build": {"results": [{}]},
    "sandbox.run": {
        "results": [
            {
                "exit_code?": "int?",
                "stdout?": "str",
                "stderr?": "str",
                "timed_out?": "bool",
                "wall_ms?": "num",
            }
        ]
    },
    "sandbox.bench": {"rows": [{}]},
    "sandbox.hostcheck": {},
    "sandbox.serve": SANDBOX_SERVICE,
    "sandbox.serve_stop": {"stopped": ["int"]},
    "sandbox.serve_state": {"state": "str", "pid?": "int", "port?": "int", "bind?": "str"},
    "sandbox.token": {"token": "str"},
    "sandbox.client": {"service": "str", "token_file": "str"},
    "sandbox.client_remove": {"removed": ["str"]},
    "netbench.sink": {"bytes?": "int", "streams?": "int", "port?": "int"},
    "netbench.send": {
        "runs": [
            {
                "streams": "int",
                "bytes": "int",
                "seconds": "num",
                "bits_per_s": "num",
                "per_stream_bits_per_s?": ["num"],
                "connect_ms?": "num?",
            }
        ]
    },
    "monitor.status": STATUS,
    "ckpt.newest": {
        "exists": "bool",
        "step": "int?",
        "bytes?": "int?",
        "sha256?": "str?",
        "files?": ["str"],
        "skipped": [{"step": "int", "reason?": "str?"}],
    },
    "ckpt.lib_list": {"exists": "bool", "entries": [CKPT_ENTRY], "incoming?": ["str"]},
    "ckpt.lib_commit": dict(CKPT_ENTRY, **{"existed": "bool"}),
    "ckpt.lib_remove": {"removed": [{"run_id": "str", "step": "int"}]},
    "ckpt.lib_verify": {
        "exists?": "bool",
        "entries": [dict(CKPT_ENTRY, **{"status": "str", "reason?": "str?"})],
    },
    "ckpt.restore_commit": {"dir": "str", "step": "int", "files": ["str"], "sha256?": "str?"},
    "ckpt.pull_state": {
        "steps": {
            "*": {
                "committed": ({"path": "str", "sha256?": "str?", "damaged?": "str?"}, "null"),
                "parts": PUBLISHED_FILES,
            }
        }
    },
    "ckpt.pull_commit": dict(CKPT_ENTRY, **{"existed": "bool"}),
    "ckpt.publish_state": {
        "path": "str",
        "exists": "bool",
        "files": PUBLISHED_FILES,
        "parts": PUBLISHED_FILES,
    },
    "ckpt.publish": {"path": "str", "files": PUBLISHED_FILES, "written?": ["str"]},
}

# What commands report on stderr while they run ({"event": NAME, ...}, agent_ship.agent_event),
# by NAME; an event not of its shape is taken for an ordinary line of output.
EVENTS: Dict[str, Any] = {
    "progress": {"done?": "num", "total?": "num", "elapsed?": "num", "detail?": "str?"},
    "failed": {"error": "str", "log?": "str?", "hint?": "str?"},
    "listening": {
        "port": "int",
        "token": "str",
        "address?": "str?",
        "models?": {"*": {"files": [CACHE_FILE], "bytes": "int", "chunk_size?": "int"}},
        "missing?": ["str"],
        "available?": ["str"],
    },
    "measured": {"streams": "int", "bits_per_s": "num"},
    "health": {"model?": "str", "state?": "str"},
    "waiting": {"holder?": "any"},
    "busy": {"holder?": "any"},
    "locked": {},
}

# Answers keyed by what was asked: ANSWER_KEY must hold an entry for each of the args' ARG_KEY
# (a mapping's keys, or a list's items as text; a list answer: one item per item asked).
PER_ASKED: Dict[str, Tuple[str, str]] = {
    "provision.probe": ("results", "probes"),
    "ckpt.pull_state": ("steps", "steps"),
    "sandbox.run": ("results", "programs"),
    "orchestra.health": ("results", "servers"),
    "modelload.describe": ("models", "paths"),
}

SCALARS = ("str", "bool", "null", "any", "int", "num", "time", "cap")
_WANTED = {
    "str": "a string",
    "bool": "true or false",
    "null": "null",
    "int": "a whole number",
    "num": "a number",
    "time": "a time (seconds since 1970)",
    "cap": "a compute capability such as '8.6'",
    "list": "a list",
    "dict": "an object",
}


def kind_of(value: Any) -> str:
    """A JSON value's kind, as a problem names what it got."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float, str)):
        return type(value).__name__
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _scalar_ok(name: str, value: Any) -> bool:
    if name == "any":
        return True
    if name == "null":
        return value is None
    if name == "str":
        return isinstance(value, str)
    if name == "bool":
        return isinstance(value, bool)
    if name == "cap":
        return isinstance(value, str) and CAP_RE.fullmatch(value) is not None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):
        if name == "time":
            return 0 <= value < TIME_LIMIT
        return -INT_LIMIT <= value < INT_LIMIT
    if name == "int" or not math.isfinite(value):
        return False
    return name == "num" or 0 <= value < TIME_LIMIT


def _wanted(shape: Any) -> str:
    if isinstance(shape, str):
        base = shape[:-1] if shape.endswith("?") else shape
        text = "anything" if base == "any" else _WANTED[base]
        return text + " or null" if shape.endswith("?") and base not in ("null", "any") else text
    if isinstance(shape, list):
        return _WANTED["list"]
    if isinstance(shape, dict):
        return _WANTED["dict"]
    return " or ".join(_wanted(s) for s in shape)


def _got(value: Any) -> str:
    kind = kind_of(value)
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        shown = repr(value)
        return f"{kind} {shown[:40] + '...' if len(shown) > 40 else shown}"
    return kind


def _key_path(path: str, key: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def problem(shape: Any, value: Any, path: str = "") -> Optional[str]:
    """The first place where `value` does not have `shape` ("at PATH: expected X, got Y"), or None."""
    where = path or "the top"
    if isinstance(shape, str):
        base, nullable = (shape[:-1], True) if shape.endswith("?") else (shape, False)
        if (nullable and value is None) or _scalar_ok(base, value):
            return None
        return f"at {where}: expected {_wanted(shape)}, got {_got(value)}"
    if isinstance(shape, tuple):
        found = [problem(s, value, path) for s in shape]
        if any(p is None for p in found):
            return None
        # The shape the value is of the kind of says most: a list against a list's shape.
        kinds = [i for i, s in enumerate(shape) if _same_kind(s, value)]
        if len(kinds) == 1:
            return found[kinds[0]]
        return f"at {where}: expected {_wanted(shape)}, got {_got(value)}"
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"at {where}: expected {_wanted(shape)}, got {_got(value)}"
        for i, item in enumerate(value):
            found_item = problem(shape[0], item, f"{path}[{i}]")
            if found_item is not None:
                return found_item
        return None
    if not isinstance(value, dict):
        return f"at {where}: expected {_wanted(shape)}, got {_got(value)}"
    named = set()
    for spec, sub in shape.items():
        if spec == "*":
            continue
        key, optional = (spec[:-1], True) if spec.endswith("?") else (spec, False)
        named.add(key)
        if key not in value:
            if optional:
                continue
            return f"at {_key_path(path, key)}: missing (expected {_wanted(sub)})"
        found_key = problem(sub, value[key], _key_path(path, key))
        if found_key is not None:
            return found_key
    if "*" in shape:
        for key, item in value.items():
            if key not in named:
                found_key = problem(shape["*"], item, _key_path(path, str(key)))
                if found_key is not None:
                    return found_key
    return None


def _same_kind(shape: Any, value: Any) -> bool:
    if isinstance(shape, list):
        return isinstance(value, list)
    if isinstance(shape, dict):
        return isinstance(value, dict)
    return False


def answer_problem(command: str, answer: Any, args: Optional[Dict[str, Any]] = None) -> Optional[str]:
    """What is wrong with `answer` as `command`'s answer to `args`, or None (also for a command
    with no declared shape)."""
    shape = ANSWERS.get(command)
    if shape is None:
        return None
    found = problem(shape, answer)
    if found is not None or command not in PER_ASKED or not isinstance(args, dict):
        return found
    answer_key, arg_key = PER_ASKED[command]
    asked, got = args.get(arg_key), answer[answer_key]
    if isinstance(got, list):
        if isinstance(asked, (list, dict)) and len(got) != len(asked):
            return f"at {answer_key}: {len(got)} answers for the {len(asked)} asked"
        return None
    wanted: List[str] = [str(k) for k in asked] if isinstance(asked, (list, dict)) else []
    missing = [k for k in wanted if k not in got]
    if missing:
        return f"at {answer_key}: no answer for {missing[0]!r}"
    return None


def event_problem(event: Dict[str, Any]) -> Optional[str]:
    """What is wrong with a progress event of a known name, or None."""
    shape = EVENTS.get(event["event"]) if isinstance(event.get("event"), str) else None
    return None if shape is None else problem(shape, event)


def malformed(shape: Any, path: str = "") -> Optional[str]:
    """Where a declared shape breaks the language above (for the tests), or None."""
    where = path or "the top"
    if isinstance(shape, str):
        base = shape[:-1] if shape.endswith("?") else shape
        return None if base in SCALARS else f"{where}: unknown type {shape!r}"
    if isinstance(shape, list):
        return malformed(shape[0], f"{path}[]") if len(shape) == 1 else f"{where}: a list shape has one item"
    if isinstance(shape, tuple):
        if len(shape) < 2:
            return f"{where}: a choice needs two shapes or more"
        return next((m for m in (malformed(s, path) for s in shape) if m), None)
    if isinstance(shape, dict):
        for key, sub in shape.items():
            if not isinstance(key, str) or not key or key == "?":
                return f"{where}: bad key {key!r}"
            found = malformed(sub, _key_path(path, key))
            if found:
                return found
        return None
    return f"{where}: {shape!r} is not a shape"
