"""Orchestra: labctl's own model server on the card, through the real CLI, then one rotation.

Three tinylm checkpoints (a few hundred MB each on the GPU) are written into the one-host lab's
model library with `labctl bench make-model`; `labctl orchestra start` syncs two of them into
the RAM cache (the cache's source is the host itself), starts labctl's server for each on the
GPU the placement gives it and waits for its health check. The server's own figures (load:
the RAM cache onto the device through labctl's loader; warm-up: the first forward pass) are
compared with seed 000's 15 s and 40 s per model; generate tokens/s is measured through the
server's `POST /generate`; `labctl rotate` then swaps one model (make-before-break where the
GPU has room for both) and every stage is recorded; `labctl orchestra stop` unloads the set.

The section uses its own copy of the inventory, beside a copy of playbooks/train.yaml, so the
GPUs training keeps are the repository's (the V100s), whatever another section writes. On the
CPU smoke run the copy declares a stand-in GPU (as the simulated lab does): the placement
needs one, and the servers then run on the CPU because torch sees no GPU. Whatever happens,
the servers are stopped before the section returns and the orchestra's state on the host
(/var/lib/labctl/orchestra) is cleared, so a second run starts clean; the servers' logs are
copied into the output folder first.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from .base import LAB, REPO, CheckEnv, CheckFailed, Section, fmt, tail

TITLE = "Orchestra: labctl's model server on the GPU, load, warm-up, generate, one rotation"
PLAN = [
    "write 3 tinylm models of 0.3 GB with `labctl bench make-model --host here` into the lab's model library",
    "`labctl orchestra plan`: the warm set (2) placed on the GPU the host detects (NVML), not a declared one",
    "`labctl orchestra start`: cache sync here -> here, labctl's server per model on cuda:0, health-checked;"
    " load and warm-up seconds per model (the server's own) against seed 000's 15 s and 40 s",
    "generate tokens/s through POST /generate (128 new tokens, greedy, median of 5), one POST /score",
    "`labctl rotate`: one model out, the next in (make-before-break where memory allows), every stage timed",
    "`labctl orchestra status`, then `labctl orchestra stop`: no server left running, the host's orchestra state cleared",
    "goals: load and warm-up each faster than seed 000's figure (seed / measured >= 1, the slowest model)",
]

MODELS = ("gpucheck-orch-a", "gpucheck-orch-b", "gpucheck-orch-c")
WARM = 2
PROMPT = "The orchestra keeps its models warm; "
STAND_IN_GPU = {"model": "Tesla P40", "memory_gb": 24, "count": 1}  # smoke only: what the sim declares
SEED_PER_MODEL_S = 15.0 + 40.0  # seed 000 §12.3: load + warm-up per model


@dataclasses.dataclass(frozen=True)
class Sizes:
    size_gb: float
    max_tokens: int
    reps: int
    start_timeout: int  # the orchestra file's server.start_timeout: seconds until healthy


def sizes(env: CheckEnv) -> Sizes:
    if env.smoke or not env.cuda:
        # bf16 on 2 shared CPU cores: a forward per new token is slow, so few tokens.
        return Sizes(size_gb=0.02, max_tokens=8, reps=2, start_timeout=240)
    # A healthy server answers in well under 30 s on an H100 (interpreter, CUDA context, load,
    # warm-up); the limit only bounds how long a broken start may eat of the device's time.
    return Sizes(size_gb=0.3, max_tokens=128, reps=5, start_timeout=90)


# ---- pure helpers (tests/unit/test_gpu_check_orchestra.py) ----------------------------------


def seed_ratio(seed_s: float, measured_s: float | None) -> float | None:
    """How many times faster than the seed's figure (>= 1: faster); None without a measurement.
    A figure rounded to 0 by the server counts as 1 ms, so the ratio stays finite (JSON)."""
    if measured_s is None:
        return None
    return round(seed_s / max(float(measured_s), 1e-3), 2)


def model_timings(rotation: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{model: its stages} for the models a start or rotation's JSON (RotationResult) joined."""
    out: dict[str, dict[str, Any]] = {}
    for t in rotation.get("joined") or []:
        out[str(t["model"])] = {
            "load_s": float(t.get("load") or 0.0),
            "warmup_s": float(t.get("warmup") or 0.0),
            "start_s": float(t.get("start") or 0.0),
            "health_s": float(t.get("health") or 0.0),
            "cache_s": float(t.get("cache") or 0.0),
            "cache_hit": bool(t.get("cache_hit")),
        }
    return out


def rotation_summary(rotation: dict[str, Any]) -> dict[str, Any]:
    """What a rotation's JSON says: its steps in order with their modes, who joined and left."""
    plan = rotation.get("plan") or {}
    steps = [
        {"action": s.get("action"), "model": s.get("model"), "gpu": s.get("gpu"), "mode": s.get("mode")}
        for s in plan.get("steps") or []
    ]
    return {
        "steps": steps,
        "modes": sorted({str(s["mode"]) for s in steps if s.get("mode")}),
        "joined": [t["model"] for t in rotation.get("joined") or []],
        "left": [t["model"] for t in rotation.get("left") or []],
        "lowest_warm": plan.get("lowest_warm"),
        "stages": dict(rotation.get("stages") or {}),
        "seconds": rotation.get("seconds"),
    }


def placed_on_detected(plan: dict[str, Any]) -> bool:
    """Whether `orchestra plan --json` put every warm model on a GPU the host detected (NVML or
    nvidia-smi), not on one the inventory only declares."""
    detected = {
        (g.get("host"), g.get("index")) for g in plan.get("gpus") or [] if g.get("source") == "detected"
    }
    placed = {(p.get("host"), p.get("gpu")) for p in plan.get("placement") or []}
    return bool(placed) and placed <= detected


def warm_ports(rotation: dict[str, Any], host: str) -> dict[str, int]:
    """{model: port} of what is warm on `host` after a start or rotation."""
    return {str(m["name"]): int(m["port"]) for m in (rotation.get("warm") or {}).get(host) or []}


# ---- talking to a server ---------------------------------------------------------------------


def _http(
    port: int, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 120.0
) -> Any:
    # http.client, not urllib: a proxy in the environment must not capture 127.0.0.1.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        text = resp.read().decode("utf-8", "replace")
    finally:
        conn.close()
    if resp.status != 200:
        raise CheckFailed(f"{method} {path} on port {port} answered HTTP {resp.status}: {text[:300]}")
    return json.loads(text)


def _generate(port: int, max_tokens: int, reps: int) -> dict[str, Any]:
    """Median tokens/s of `reps` greedy generations after one untimed one; the same prompt each
    time, so the answers must be the same tokens (a real, deterministic forward pass)."""
    body = {"prompt": PROMPT, "max_tokens": max_tokens}
    first = _http(port, "POST", "/generate", body)
    client, server, answers = [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        doc = _http(port, "POST", "/generate", body)
        client.append(time.perf_counter() - t0)
        server.append(float(doc["seconds"]))
        answers.append(doc["tokens"])
    n = len(first["tokens"])
    if n != max_tokens:
        raise CheckFailed(f"/generate gave {n} tokens, {max_tokens} asked for")
    med_client, med_server = statistics.median(client), statistics.median(server)
    return {
        "max_tokens": max_tokens,
        "reps": reps,
        "prompt_tokens": len(PROMPT.encode()),
        "seconds": [round(s, 4) for s in client],
        "server_seconds": [round(s, 4) for s in server],
        "tokens_per_s": round(max_tokens / med_client, 1) if med_client > 0 else None,
        "server_tokens_per_s": round(max_tokens / med_server, 1) if med_server > 0 else None,
        "deterministic": all(a == first["tokens"] for a in answers),
    }


# ---- the host's orchestra state --------------------------------------------------------------


def _our_servers(env: CheckEnv) -> list[dict[str, Any]]:
    from labctl.agent.orchestra.host import servers

    return servers(LAB, env.host, list(MODELS))


def _servers_of_host(env: CheckEnv) -> list[dict[str, Any]]:
    from labctl.agent.orchestra.host import servers

    return servers(LAB, env.host)


def _state_dir_writable() -> None:
    from labctl.agent.core import paths

    d = Path(paths.ORCHESTRA_DIR)
    while not d.exists():
        d = d.parent
    if not os.access(d, os.W_OK):
        raise CheckFailed(
            f"the orchestra keeps its state in {paths.ORCHESTRA_DIR}, and {d} is not writable by this "
            "user: run the check as root"
        )


def _keep_logs(env: CheckEnv) -> list[str]:
    """The servers' logs, in one file of the output folder (they name why a server failed).

    One file: a GPU machine hands back only a few files per run.
    """
    from labctl.agent.core import paths

    dest = env.out / "orchestra-servers.log"
    parts = []
    for m in MODELS:
        src = Path(paths.ORCHESTRA_LOGS) / f"{m}.log"
        if src.is_file():
            text = src.read_text(errors="replace")
            parts.append(f"===== {src}\n{text[-200_000:]}")
    if not parts:
        return []
    dest.write_text("\n".join(parts))
    return [str(dest)]


def _clear_state() -> None:
    """What the orchestra wrote on this host for the check's lab, so the next run starts clean."""
    from labctl.agent.core import paths

    for f in (paths.WARM_STATE, paths.ORCHESTRA_HISTORY, paths.ORCHESTRA_LOCK):
        Path(f).unlink(missing_ok=True)
    for m in MODELS:
        (Path(paths.ORCHESTRA_LOGS) / f"{m}.log").unlink(missing_ok=True)
    for d in (paths.ORCHESTRA_LOGS, paths.ORCHESTRA_DIR):
        try:
            os.rmdir(d)  # only when empty: anything else there is not this check's
        except OSError:
            pass


def _kill_leftovers(env: CheckEnv) -> list[dict[str, Any]]:
    """The check's own servers still running after `orchestra stop` (found by their tags, the
    host and model names of this section): SIGTERM to each group, SIGKILL after 10 s."""
    from labctl.agent.core import procs
    from labctl.agent.orchestra.host import server_processes

    found = server_processes(env.host, list(MODELS))
    if not found:
        return []
    env.log(f"orchestra: {len(found)} server process(es) left after stop; terminating them")
    procs.terminate(found, lambda: server_processes(env.host, list(MODELS)), 10.0)
    return [{"pid": p["pid"], "model": p["env"].get("LABCTL_ORCH_MODEL")} for p in found]


# ---- the section -----------------------------------------------------------------------------


def _setup(env: CheckEnv, sz: Sizes) -> tuple[CheckEnv, Path]:
    """The section's inventory, train.yaml and orchestra file, in env.work/orchestra."""
    import yaml

    assert env.inventory is not None, "write_inventory first"
    folder = env.work / "orchestra"
    (folder / "playbooks").mkdir(parents=True, exist_ok=True)
    doc = yaml.safe_load(env.inventory.read_text())
    host = doc["hosts"][env.host]
    if not env.cuda and not host.get("gpus"):
        host["gpus"] = [dict(STAND_IN_GPU)]
    inv = folder / "lab.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    # Found before any other train.yaml (the inventory's folder first): training keeps the V100s.
    shutil.copyfile(REPO / "playbooks" / "train.yaml", folder / "playbooks" / "train.yaml")
    orch = {
        "hosts": env.host,
        "warm": WARM,
        "rotate": 1,
        "every": "4h",
        "server": {"start_timeout": sz.start_timeout, "stop_grace": 10},
        "models": [{"name": m, "size_gb": sz.size_gb} for m in MODELS],
    }
    orch_file = folder / "playbooks" / "orchestra.yaml"
    orch_file.write_text(yaml.safe_dump(orch, sort_keys=False))
    return dataclasses.replace(env, inventory=inv), orch_file


def _placement(sec: Section, env: CheckEnv, plan: dict[str, Any]) -> None:
    gpus = plan.get("gpus") or []
    sec.figures["placement"] = {
        "warm": plan.get("warm"),
        "models": plan.get("placement"),
        "gpus": [
            {k: g.get(k) for k in ("host", "index", "model", "memory_gb", "source", "free_gb")} for g in gpus
        ],
        "left_out": plan.get("left_out"),
        # The servers get CUDA_VISIBLE_DEVICES=<the placement's NVML index>: what this process had.
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    used = sorted({(p["gpu"], p["gpu_model"]) for p in plan.get("placement") or []})
    shown = ", ".join(f"GPU {i} {m}" for i, m in used) or "none"
    sources = sorted({str(g.get("source")) for g in gpus})
    if env.cuda:
        want = str(env.gpu.get("name") or "")
        seen = placed_on_detected(plan)
        sec.figures["placement"]["sees_local_gpu"] = seen
        # NVML's name and torch's come from the same driver: recorded, not required to match.
        sec.figures["placement"]["torch_gpu"] = want
        sec.row(
            "placement: the warm set's GPU", f"{shown} ({'/'.join(sources)})", f"torch: {want}, NVML-detected"
        )
        sec.goal(
            "placement on the GPU the host detects",
            1.0 if seen else 0.0,
            1.0,
            "bool",
            "orchestra plan places the warm set on the NVML-detected card, not a declared one",
        )
    else:
        sec.row(
            "placement: the warm set's GPU", f"{shown} ({'/'.join(sources)})", "smoke: a declared stand-in"
        )
        sec.skip(
            "placement on a detected GPU",
            "no GPU here: the inventory copy declares a stand-in Tesla P40, the servers run on the CPU",
        )


def _servers(sec: Section, env: CheckEnv, ports: dict[str, int], key: str) -> dict[str, Any]:
    """Each warm server's /health: its device and the GPU memory it holds."""
    out = {}
    for name, port in ports.items():
        h = _http(port, "GET", "/health", timeout=10)
        out[name] = {k: h.get(k) for k in ("device", "params", "memory_bytes", "load_s", "warmup_s")}
    sec.figures[key] = out
    wrong = {n: h["device"] for n, h in out.items() if not str(h["device"]).startswith(env.device)}
    if wrong:
        raise CheckFailed(f"servers not on {env.device}: {wrong}")
    return out


def _measure(
    sec: Section,
    env: CheckEnv,
    orch_file: Path,
    sz: Sizes,
    bare_inventory: Path | None,
    timings: dict[str, dict[str, Any]],
) -> None:
    """Everything the section measures; `timings` gathers each joining model's stages."""
    from labctl.orchestra.bench import report_from

    f = str(orch_file)
    py = ("--python", env.python)
    library = env.work / "models"
    cache = env.work / "cache"

    # A real sync each run: the check's models out of the RAM cache, then written afresh.
    env.labctl("cache", "evict", *MODELS, "--host", env.host, timeout=120)
    t0 = time.perf_counter()
    for m in MODELS:
        env.labctl(
            "bench", "make-model", "--host", env.host, "--name", m, "--size-gb", str(sz.size_gb), timeout=600
        )
    made = {m: sum(p.stat().st_size for p in (library / m).iterdir()) for m in MODELS}
    sec.figures["models"] = {
        "size_gb": sz.size_gb,
        "bytes": made,
        "make_s": round(time.perf_counter() - t0, 2),
    }

    _, plan, _ = env.labctl("orchestra", "plan", "-f", f, timeout=120)
    _placement(sec, env, plan or {})
    if not env.cuda and bare_inventory is not None:
        # What the CPU does without the stand-in: the plan refuses (no GPU to place on), exit 2.
        bare = dataclasses.replace(env, inventory=bare_inventory)
        rc, _, proc = bare.labctl("orchestra", "plan", "-f", f, timeout=120, check=False)
        sec.figures["placement"]["without_a_gpu"] = {"rc": rc, "said": tail(proc.stderr or proc.stdout, 300)}

    wait = sz.start_timeout + 120  # the cache sync, the servers' health, the CLI around them
    _, start, _ = env.labctl("orchestra", "start", "-f", f, *py, "--wait", "60", timeout=wait)
    start = start or {}
    ports = warm_ports(start, env.host)
    if sorted(ports) != sorted(MODELS[:WARM]):
        raise CheckFailed(f"orchestra start left {sorted(ports)} warm, {list(MODELS[:WARM])} expected")
    cached = sorted(p.name for p in cache.iterdir() if p.name in MODELS)
    timings.update(model_timings(start))
    health = _servers(sec, env, ports, "servers")
    sec.figures["start"] = {
        "seconds": start.get("seconds"),
        "stages": start.get("stages"),
        "models": dict(timings),
        "cached": cached,
        "modes": rotation_summary(start)["modes"],
    }
    need = (plan or {}).get("placement") or []
    need_gb = {p["model"]: p["need_gb"] for p in need}
    mem = {n: round(h["memory_bytes"] / 1e9, 3) for n, h in health.items()}
    sec.row(
        f"orchestra start ({WARM} models of {sz.size_gb:g} GB)",
        fmt(start.get("seconds"), "s"),
        "stages summed: " + ", ".join(f"{k} {v:g}" for k, v in (start.get("stages") or {}).items()),
    )
    sec.row(
        "server device, memory held",
        ", ".join(f"{n}: {health[n]['device']} {mem[n]:g} GB" for n in sorted(health)),
        "planned need: " + ", ".join(f"{need_gb.get(n, 0):g} GB" for n in sorted(health)),
    )

    # Generate through the first warm model's server.
    first = MODELS[0]
    gen = _generate(ports[first], sz.max_tokens, sz.reps)
    gen["model"] = first
    score = _http(ports[first], "POST", "/score", {"text": PROMPT})
    gen["score_mean_logprob"] = score.get("mean_logprob")
    sec.figures["generate"] = gen
    sec.row(
        f"generate: {sz.max_tokens} new tokens, greedy",
        fmt(gen["tokens_per_s"], "tok/s", 1),
        f"median of {sz.reps} via POST /generate; server-side {fmt(gen['server_tokens_per_s'], 'tok/s', 1)}; "
        "no KV cache: one forward pass per token",
    )
    if not gen["deterministic"]:
        sec.skip(
            "generate determinism", "the same prompt gave different tokens across reps (recorded, not failed)"
        )

    _, rot, _ = env.labctl("rotate", "-f", f, *py, "--wait", "60", timeout=wait)
    rot = rot or {}
    summary = rotation_summary(rot)
    timings.update(model_timings(rot))
    bench = report_from(rot, 4 * 3600.0)
    summary["bench"] = {
        k: bench[k]
        for k in ("per_model", "bare_load_warmup_s", "orchestration_overhead_s", "share_of_cadence")
    }
    sec.figures["rotation"] = summary
    _servers(sec, env, warm_ports(rot, env.host), "servers_after_rotation")
    if len(summary["joined"]) != 1 or len(summary["left"]) != 1:
        raise CheckFailed(f"rotate: joined {summary['joined']}, left {summary['left']}; 1 and 1 expected")
    n_in = len(summary["joined"])
    sec.row(
        f"rotation: in {', '.join(summary['joined'])}, out {', '.join(summary['left'])}",
        fmt(summary["seconds"], "s"),
        f"{'/'.join(summary['modes'])}; seed 000: {SEED_PER_MODEL_S:g} s per joining model "
        f"({fmt(seed_ratio(SEED_PER_MODEL_S * n_in, summary['seconds']), 'x')} faster)",
    )
    sec.row(
        "rotation stages",
        ", ".join(f"{k} {v:g}" for k, v in summary["stages"].items()),
        "in order: " + " -> ".join(f"{s['action']} {s['model']}" for s in summary["steps"]),
    )

    rc, status, _ = env.labctl("orchestra", "status", "-f", f, timeout=120, check=False)
    status = status or {}
    sec.figures["status"] = {
        "rc": rc,
        "warm": len(status.get("models") or []),
        "healthy": status.get("healthy"),
    }
    if rc != 0:
        raise CheckFailed(f"orchestra status exited {rc} after the rotation: {json.dumps(status)[:400]}")


def _load_warmup(sec: Section, env: CheckEnv, timings: dict[str, dict[str, Any]]) -> None:
    """Load and warm-up: the servers' own figures over every model that joined (the start's
    and the rotation's, as far as the section got), the slowest against seed 000's."""
    from labctl.orchestra.bench import SEED_LOAD_S, SEED_WARMUP_S

    loads = [t["load_s"] for t in timings.values()]
    warms = [t["warmup_s"] for t in timings.values()]
    sec.figures["load_s"] = {
        "median": round(statistics.median(loads), 4),
        "max": round(max(loads), 4),
        "per_model": {n: t["load_s"] for n, t in timings.items()},
        "seed": SEED_LOAD_S,
    }
    sec.figures["warmup_s"] = {
        "median": round(statistics.median(warms), 4),
        "max": round(max(warms), 4),
        "per_model": {n: t["warmup_s"] for n, t in timings.items()},
        "seed": SEED_WARMUP_S,
    }
    sec.row(
        f"load: RAM cache -> {env.device} (labctl's loader), {len(loads)} models",
        f"{fmt(statistics.median(loads), 's', 3)} median, {fmt(max(loads), 's', 3)} max",
        f"seed 000: {SEED_LOAD_S:g} s per model",
    )
    sec.row(
        "warm-up: the first forward pass",
        f"{fmt(statistics.median(warms), 's', 3)} median, {fmt(max(warms), 's', 3)} max",
        f"seed 000: {SEED_WARMUP_S:g} s per model",
    )
    sec.goal(
        "load faster than seed 000's 15 s",
        seed_ratio(SEED_LOAD_S, max(loads)),
        1.0,
        "x",
        "seed 000 §12.3: 15 s per model from the RAM cache; seed / measured, the slowest model",
    )
    sec.goal(
        "warm-up faster than seed 000's 40 s",
        seed_ratio(SEED_WARMUP_S, max(warms)),
        1.0,
        "x",
        "seed 000 §12.3: 40 s per model for the first inference; seed / measured, the slowest model",
    )


def run(env: CheckEnv) -> Section:
    sec = Section("orchestra", TITLE)
    t0 = time.monotonic()
    sz = sizes(env)
    oenv: CheckEnv | None = None
    orch_file: Path | None = None
    timings: dict[str, dict[str, Any]] = {}
    try:
        _state_dir_writable()
        oenv, orch_file = _setup(env, sz)
        if _our_servers(env):  # a run before this one left servers: unload them first
            oenv.labctl("orchestra", "stop", "-f", str(orch_file), "--wait", "60", timeout=180, check=False)
            _kill_leftovers(env)
        if not _servers_of_host(env):  # nothing of any orchestra runs here: its files are stale
            _clear_state()
        _measure(sec, oenv, orch_file, sz, env.inventory, timings)
    except Exception as exc:  # the section records its error; the finally still stops the servers
        sec.error = f"{type(exc).__name__}: {tail(str(exc), 2000)}"
        env.log(f"orchestra: {sec.error}")
    finally:
        try:
            if timings:  # what the start (and the rotation) gave, even when a later step failed
                _load_warmup(sec, env, timings)
        except Exception as exc:
            sec.error = sec.error or f"load and warm-up figures: {type(exc).__name__}: {exc}"
        _finish(sec, env, oenv, orch_file)
    sec.seconds = time.monotonic() - t0
    return sec


def _finish(sec: Section, env: CheckEnv, oenv: CheckEnv | None, orch_file: Path | None) -> None:
    """`orchestra stop`, then nothing of the check's may still run; logs kept, state cleared."""
    problems = []
    if oenv is not None and orch_file is not None:
        try:
            rc, doc, proc = oenv.labctl(
                "orchestra", "stop", "-f", str(orch_file), "--wait", "60", timeout=180, check=False
            )
            stopped = [t["model"] for t in (doc or {}).get("left") or []]
            sec.figures["stop"] = {"rc": rc, "stopped": stopped, "seconds": (doc or {}).get("seconds")}
            if rc != 0:
                problems.append(f"orchestra stop exited {rc}: {tail(proc.stderr or proc.stdout, 400)}")
        except Exception as exc:
            problems.append(f"orchestra stop: {type(exc).__name__}: {exc}")
    try:
        killed = _kill_leftovers(env)
        left = _our_servers(env)
        sec.figures["servers_left"] = len(left)
        if killed:
            problems.append(
                f"{len(killed)} server process(es) outlived `orchestra stop` and were killed: {killed}"
            )
        if left:
            problems.append(f"servers still run after SIGKILL: {left}")
        else:
            sec.row("servers left after `orchestra stop`", "0", "none may stay running")
        logs = _keep_logs(env)
        if logs:
            sec.figures["logs"] = logs
        if not _servers_of_host(env):
            _clear_state()
    except Exception as exc:
        problems.append(f"cleanup: {type(exc).__name__}: {exc}")
    if problems and sec.error is None:
        sec.error = "; ".join(problems)
    elif problems:
        env.log("orchestra cleanup: " + "; ".join(problems))
