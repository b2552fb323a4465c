"""Run programs in the warm pool: the agent commands `sandbox.run` and `sandbox.bench`.

One run: claim an idle container, write the source into /work, compile when the language
does, run with stdin, read stdout/stderr with a byte cap, and on the wall-time limit kill the
whole container (the init and everything under it, setsid or not). A container is used once.
The controller sends each language's container config and commands (labctl/sandbox/limits.py,
languages.py): nothing here decides a limit.
"""

from __future__ import annotations

import base64
import binascii
import json
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..core import paths
from ..core.errors import AgentError
from ..core.spec import Opt, Or, command
from .docker import Client, DockerError, oom_kills
from .pool import Pool, check_lab

PUT_CMD = ["sh", "-c", 'cat > "$1"', "sh"]
PUT_TIMEOUT = 10.0
CLAIM_TRIES = 3
GONE_STATUSES = (404, 409, 500)  # no such container; not running; "removal in progress"
INLINE_MAX = 64 * 1024  # under Linux's 128 KiB cap on one argument
INLINE_SCRIPT = 'printf "%s" "$0" > "$1" || exit 125; shift; exec "$@"'


def _text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def _payload(prog: Dict[str, Any], key: str) -> Optional[bytes]:
    """A program's `key` (source, stdin) as the bytes to hand it: `KEY_b64` carries any bytes
    (a Latin-1 source, a binary input), `KEY` text; None when neither is given."""
    coded = prog.get(key + "_b64")
    if coded is not None:
        try:
            return base64.b64decode(str(coded), validate=True)
        except (binascii.Error, ValueError):
            raise AgentError(f"the program's {key}_b64 is not base64", "bad_args") from None
    value = prog.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise AgentError(f"the program's {key} must be text (or {key}_b64 base64)", "bad_args")
    # surrogateescape: text decoded that way by a caller gets its original bytes back
    return value.encode("utf-8", "surrogateescape")


def _output(key: str, data: bytes) -> Dict[str, Any]:
    """`key` as text, and where the bytes are not UTF-8, `KEY_b64` with them exactly."""
    try:
        return {key: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {key: _text(data), key + "_b64": base64.b64encode(data).decode("ascii")}


def _outcome(
    code: Optional[int], out: bytes, err: bytes, trunc: bool, late: bool, t0: float
) -> Dict[str, Any]:
    """What one exec in the container (compile or run) reports, timed from `t0`."""
    result: Dict[str, Any] = {"exit_code": code}
    result.update(_output("stdout", out))
    result.update(_output("stderr", err))
    result.update(truncated=trunc, timed_out=late, wall_ms=int((time.monotonic() - t0) * 1000))
    return result


class _Pools:
    def __init__(self, client: Client, langs: Dict[str, Dict[str, Any]], size: int, lab: str) -> None:
        self.client = client
        self.langs = langs
        self.size = size
        self.lab = check_lab(lab)
        self.pools: Dict[str, Pool] = {}
        self.lock = threading.Lock()

    def get(self, lang: str) -> Pool:
        with self.lock:
            pool = self.pools.get(lang)
            if pool is None:
                pool = self.pools[lang] = Pool(
                    self.client, lang, self.langs[lang]["config"], self.size, self.lab
                )
                pool.open()
            return pool

    def wait(self) -> None:
        for pool in list(self.pools.values()):
            pool.wait()


def _exec(
    client: Client,
    name: str,
    cmd: List[str],
    env: List[str],
    stdin: Optional[bytes],
    cap: int,
    deadline: float,
) -> Tuple[Optional[int], bytes, bytes, bool, bool]:
    """(exit code, stdout, stderr, truncated, timed_out) of one exec in container `name`."""
    try:
        exec_id = client.exec_create(name, cmd, env, stdin=stdin is not None)
    except DockerError as e:
        if e.status in GONE_STATUSES:
            raise _Gone(str(e)) from None
        raise
    demux, timed_out = client.exec_stream(exec_id, stdin, cap, deadline)
    if timed_out:
        client.kill(name)  # the whole container: nothing it started outlives the limit
        return None, demux.stdout, demux.stderr, demux.truncated, True
    return client.exec_exit_code(exec_id), demux.stdout, demux.stderr, demux.truncated, False


def _prepare(
    client: Client, name: str, cmd: List[str], env: List[str], stdin: Optional[bytes], failed: str
) -> None:
    """One short exec that readies the container for the program (writes a file, makes a
    folder): its failure is the sandbox's, never the program's, so it is raised as `failed`."""
    code, _, err, _, late = _exec(client, name, cmd, env, stdin, 4096, time.monotonic() + PUT_TIMEOUT)
    if late or code != 0:
        raise AgentError(f"{failed}: {_text(err).strip()}", "sandbox_failed")


def _put(client: Client, name: str, path: str, data: bytes, env: List[str], failed: str) -> None:
    """`data` into the container's file `path`."""
    _prepare(client, name, [*PUT_CMD, path], env, data, failed)


class _Gone(Exception):
    """The claimed container died before the program started (killed by someone else, or its
    idle process ended): the run takes another container."""


def _oom_killed(client: Client, name: str) -> bool:
    """Whether the kernel's OOM killer acted in the container's memory cgroup: read from the
    cgroup itself where this agent sees cgroupfs, else from Docker's one-shot stats (a host
    whose /sys is its own, as `ip netns exec` gives, sees no cgroupfs)."""
    info = client.inspect(name)
    kills = oom_kills(info["Id"])
    if kills is not None:
        return kills > 0
    stats = client.request("GET", f"/containers/{name}/stats", query={"stream": "false", "one-shot": "true"})
    mem = (stats or {}).get("memory_stats") or {}
    if "oom_kill" in (mem.get("stats") or {}):  # cgroup v2
        return int(mem["stats"]["oom_kill"]) > 0
    # cgroup v1 (Docker reports no failcnt there): usage reached the limit and the program
    # died of SIGKILL
    if mem.get("failcnt") or (mem.get("limit") and int(mem.get("max_usage") or 0) >= int(mem["limit"])):
        return True
    return bool(info.get("State", {}).get("OOMKilled"))


def run_one(
    client: Client,
    pool: Pool,
    spec: Dict[str, Any],
    prog: Dict[str, Any],
    limits: Dict[str, Any],
    claimed: Optional[Callable[..., Dict[str, Any]]] = None,
) -> Dict[str, Any]:
    """`claimed(client, pool, spec, prog, limits)` (default: one run of the program) in a
    container of the pool, on another container when the claimed one died before it ran."""
    started = time.monotonic()
    for attempt in range(CLAIM_TRIES):
        try:
            result = (claimed or _run_claimed)(client, pool, spec, prog, limits)
        except _Gone as e:
            if attempt == CLAIM_TRIES - 1:
                raise AgentError(
                    f"{CLAIM_TRIES} sandbox containers in a row died before the program ran: {e}", "docker"
                ) from None
            continue
        result["latency_ms"] = round((time.monotonic() - started) * 1000, 2)
        return result
    raise AssertionError("unreachable")


def _run_claimed(
    client: Client, pool: Pool, spec: Dict[str, Any], prog: Dict[str, Any], limits: Dict[str, Any]
) -> Dict[str, Any]:
    lang = prog["lang"]
    timeout = float(prog.get("timeout") or limits["timeout_s"])
    cap = int(limits["output_bytes"])
    env = [f"{k}={v}" for k, v in sorted((spec.get("env") or {}).items())]
    name, warm = pool.claim()
    result: Dict[str, Any] = {
        "lang": lang,
        "exit_code": None,
        "stdout": "",
        "stderr": "",
        "truncated": False,
        "timed_out": False,
        "oom_killed": False,
        "wall_ms": 0,
        "stage": "run",
        "container": name,  # gone once the run is over; tests and logs name it
    }
    try:
        memory_mb = prog.get("memory_mb")
        if memory_mb and int(memory_mb) != int(limits["memory_mb"]):
            mem = int(memory_mb) * 1024 * 1024
            try:
                client.update(name, {"Memory": mem, "MemorySwap": mem})
            except DockerError as e:
                if e.status in GONE_STATUSES:
                    raise _Gone(str(e)) from None
                raise
        source = _payload(prog, "source") or b""
        path = "/work/" + spec["file"]
        run = list(spec["run"])
        inline = None
        if not spec.get("compile") and len(source) <= INLINE_MAX and b"\0" not in source:
            try:  # an argument reaches Docker as JSON text: only UTF-8 goes inline unchanged
                inline = source.decode("utf-8")
            except UnicodeDecodeError:
                inline = None
        if inline is not None:
            # one exec instead of two on the hot path: the shell writes the source, then
            # becomes the program (exec), which gets stdin and is what the exit code is of
            run = ["sh", "-c", INLINE_SCRIPT, inline, path, *run]
        else:
            _put(client, name, path, source, env, "could not write the program into the container")
        if spec.get("compile"):
            t0 = time.monotonic()
            code, out, err, trunc, late = _exec(
                client, name, list(spec["compile"]), env, None, cap, t0 + timeout
            )
            if late or code != 0:
                result.update(stage="compile", **_outcome(code, out, err, trunc, late, t0))
                return result
        data = _payload(prog, "stdin") or b""
        t0 = time.monotonic()
        code, out, err, trunc, late = _exec(client, name, run, env, data, cap, t0 + timeout)
        result.update(_outcome(code, out, err, trunc, late, t0))
        if code == 137 and not late:
            result["oom_killed"] = _oom_killed(client, name)
        return result
    finally:
        pool.release(name)
        result["warm"] = warm


def run_programs(
    programs: List[Dict[str, Any]],
    langs: Dict[str, Dict[str, Any]],
    limits: Dict[str, Any],
    concurrency: int = 8,
    pool_size: int = 4,
    client: Optional[Client] = None,
    *,
    lab: str,
) -> List[Dict[str, Any]]:
    """Run every program (dicts: lang, source, stdin, timeout, memory_mb) at most `concurrency`
    at a time in the warm pool of `lab`; results in the programs' order. Waits for the background
    kills and refills before it returns, so the pool holds `pool_size` idle containers afterwards."""
    check_lab(lab)
    client = client or Client()
    if not client.available():
        raise AgentError(f"no Docker socket at {client.path}: is dockerd installed and running?", "no_docker")
    for p in programs:
        if p.get("lang") not in langs:
            raise AgentError(f"no sandbox config for language {p.get('lang')!r}", "bad_args")
    pools = _Pools(client, langs, pool_size, lab)
    try:
        for lang in sorted({p["lang"] for p in programs}):
            pools.get(lang)
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as ex:
            futures = [
                ex.submit(run_one, client, pools.get(p["lang"]), langs[p["lang"]], p, limits)
                for p in programs
            ]
            return [f.result() for f in futures]
    except DockerError as e:
        if e.status == 404 and "image" in e.message.lower():
            # Which command builds it is the controller's to say: it knows the inventory and playbooks.
            raise AgentError(
                f"{e.message}: the sandbox image is not built on this host", "no_image"
            ) from None
        raise AgentError(str(e), "docker") from None
    finally:
        pools.wait()


# What sandbox.run and sandbox.bench both take: the programs, each language's spec, the limits,
# and the lab whose pool runs them (the inventory's lab name).
_PROGRAMS = {"programs": ["any"], "langs": {}, "limits": {}, "lab": "str"}


def _args(args: Dict[str, Any]) -> Tuple[List[Dict[str, Any]], Dict[str, Any], Dict[str, Any]]:
    programs, langs, limits = args["programs"], args["langs"], args["limits"]
    for lang, spec in langs.items():
        problem = paths.component_problem(spec.get("file") if isinstance(spec, dict) else None)
        if problem:
            raise AgentError(f"langs.{lang}.file must be a file name in /work: {problem}", "bad_args")
    return programs, langs, limits


@command(
    takes={**_PROGRAMS, "concurrency": Or("int", 8), "pool": Or("int", 4)},
    answers={
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
    per_asked=("results", "programs"),
)
def run_command(args: Dict[str, Any]) -> Dict[str, Any]:
    programs, langs, limits = _args(args)
    results = run_programs(programs, langs, limits, args["concurrency"], args["pool"], lab=args["lab"])
    return {"results": results}


def _pct(values: List[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, round(q / 100.0 * (len(s) - 1)))], 2) if s else 0.0


def _stats(lat: List[float], seconds: float, errors: int) -> Dict[str, Any]:
    return {
        "p50_ms": _pct(lat, 50),
        "p95_ms": _pct(lat, 95),
        "p99_ms": _pct(lat, 99),
        "exec_per_s": round(len(lat) / seconds, 2) if seconds > 0 else 0.0,
        "runs": len(lat),
        "errors": errors,
    }


def _docker_run(argv: List[str], source: bytes, expect: str) -> Tuple[float, bool]:
    t0 = time.monotonic()
    proc = subprocess.run(argv, input=source, capture_output=True, timeout=120)
    ok = proc.returncode == 0 and proc.stdout.decode(errors="replace").strip() == expect
    return (time.monotonic() - t0) * 1000, ok


@command(
    takes={
        **_PROGRAMS,
        "expect": Opt("str", "hello"),
        "runs": Or("int", 32),
        "docker_run": ["any"],
        "concurrency": Or(["any"], [1]),
    },
    answers={"rows": [{}]},
)
def bench_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """The pool against `docker run --rm` with the same limits and the same hello program, at
    each concurrency: per-execution latency percentiles and executions per second."""
    programs, langs, limits = _args(args)
    lang = programs[0]["lang"]
    expect = args["expect"]
    runs = args["runs"]
    baseline = list(args["docker_run"])  # reads the source on stdin, writes it, compiles, runs
    client = Client()
    rows = []
    for conc in [int(c) for c in args["concurrency"]]:
        # warm-up: the pool fills to `conc` idle containers before the clock starts
        run_programs(programs[:1], langs, limits, 1, conc, client, lab=args["lab"])
        progs = [dict(programs[0]) for _ in range(runs)]
        t0 = time.monotonic()
        res = run_programs(progs, langs, limits, conc, conc, client, lab=args["lab"])
        took = time.monotonic() - t0
        bad = sum(1 for r in res if r["exit_code"] != 0 or r["stdout"].strip() != expect)
        pool = _stats([r["latency_ms"] for r in res], took, bad)
        source = _payload(programs[0], "source") or b""
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=conc) as ex:
            outs = list(ex.map(lambda _, src=source: _docker_run(baseline, src, expect), range(runs)))
        took = time.monotonic() - t0
        cold = _stats([o[0] for o in outs], took, sum(1 for o in outs if not o[1]))
        rows.append({"lang": lang, "concurrency": conc, "pool": pool, "docker_run": cold})
    return {"rows": rows, "docker_version": json.dumps(client.request("GET", "/version").get("Version"))}
