"""`labctl bench phase3`: the three figures phase 3 lives by, measured on the lab as it runs.

1. The orchestra cycle for k warm models: every model asked at once (the trainer's client)
   against one after another, the floor being the slowest model alone.
2. Sandbox executions per second through the sandbox service (the tasks' reference programs,
   every test checked) against `docker run --rm` and the warm pool, one container per
   execution, on the sandbox host.
3. Training steps per second inside a rotation's window against outside it: a short phase-3 run
   of the reference trainer, with one `labctl rotate` in its middle; and its failed steps.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from labctl.output.errors import HostError, InputError
from labctl.output.progress import QUIET, Progress

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.orchestra.spec import Orchestra


def _warm_endpoints(ctx: Context, orch: Orchestra) -> list[Any]:
    from labctl.orchestra.ask import warm_endpoints

    # The warm set alone, no remote tier: the cycle is that of the lab's own models.
    endpoints, _ = warm_endpoints(ctx, orch)
    if not endpoints:
        raise InputError(
            "No model is warm on the orchestra's hosts.", "Load the warm set with `labctl orchestra start`."
        )
    return endpoints


def cycle_figure(ctx: Context, orch: Orchestra, rounds: int, max_tokens: int) -> list[dict[str, Any]]:
    """Per k (1..warm models): median cycle asked at once, one after another, slowest alone."""
    from labctl.agent.models.tasks import TASKS, prompt_text
    from labctl.agent.orchestra.client import ask_all, complete

    endpoints = _warm_endpoints(ctx, orch)
    prompt = prompt_text(TASKS[0])
    rows = []
    for k in range(1, len(endpoints) + 1):
        eps = endpoints[:k]
        seq: list[tuple[float, float]] = []
        par: list[float] = []
        for r in range(rounds + 1):  # the first round warms up and is not counted
            t0 = time.perf_counter()
            answers = [complete(e, prompt, max_tokens) for e in eps]
            one_by_one = (time.perf_counter() - t0, max(a.latency_s for a in answers))
            t0 = time.perf_counter()
            at_once = ask_all(eps, prompt, max_tokens=max_tokens)
            took = time.perf_counter() - t0
            failed = [a for a in answers + at_once if not a.ok]
            if failed:
                raise HostError(
                    f"{failed[0].name} gave no answer: {failed[0].error}", "Check `labctl orchestra status`."
                )
            if r:
                seq.append(one_by_one)
                par.append(took)
        rows.append(
            {
                "k": k,
                "one_after_another_s": round(statistics.median(s for s, _ in seq), 4),
                "at_once_s": round(statistics.median(par), 4),
                "slowest_alone_s": round(statistics.median(m for _, m in seq), 4),
            }
        )
    return rows


def sandbox_figure(ctx: Context, programs: int, batches: int, concurrency: int) -> dict[str, Any]:
    """Executions per second through the running service, then the host's own bench of
    `docker run --rm` and the pool at the same concurrency."""
    from labctl.agent.models.tasks import TASKS
    from labctl.agent.sandbox.client import Sandbox, SandboxError
    from labctl.hosts.agent_ship import ask_agent
    from labctl.sandbox import service
    from labctl.sandbox.api import sandbox_hosts
    from labctl.sandbox.bench import bench

    st = service.state(ctx, None)
    if st["state"] != "running":
        raise InputError(
            f"The sandbox service does not run on {st['host']}.",
            "Start it with `labctl sandbox serve`, then measure.",
        )
    target = sandbox_hosts(ctx, st["host"])[0]
    token = ask_agent(ctx, target, "sandbox.token", {})["token"]  # held in memory, never shown
    client = Sandbox(st["url"], token)
    batch: list[dict[str, Any]] = [t.as_program(t.solution) for t in TASKS[:programs]]
    executions = sum(len(t.tests) for t in TASKS[:programs])
    try:
        client.run(batch)  # warm-up
        failed = 0
        t0 = time.perf_counter()
        for _ in range(batches):
            failed += sum(r["total"] - r["passed"] for r in client.run(batch))
        took = time.perf_counter() - t0
    except SandboxError as e:
        raise HostError(
            f"The sandbox service at {st['url']} failed: {e}", "Check `labctl sandbox serve --status`."
        ) from None
    peers = bench(ctx, "python", [concurrency], max(8, executions // 2), st["host"])["rows"][0]
    return {
        "host": st["host"],
        "programs": programs,
        "tests_per_program": round(executions / programs, 2),
        "service": {
            "executions": executions * batches,
            "seconds": round(took, 3),
            "exec_per_s": round(executions * batches / took, 2),
            "failed": failed,
        },
        "docker_run": peers["docker_run"],
        "pool": peers["pool"],
        "concurrency": concurrency,
    }


def _newest_metrics(inv: Path, since: float) -> list[dict[str, Any]]:
    runs = (inv.absolute().parent / ".labctl" / "runs").glob("*/metrics.jsonl")
    files = sorted((p for p in runs if p.stat().st_mtime >= since), key=lambda p: p.stat().st_mtime)
    if not files:
        return []
    out = []
    for line in files[-1].read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def run_phase3(
    ctx: Context,
    train_args: list[str],
    label: str,
    poll: Optional[Callable[[list[dict[str, Any]]], None]] = None,
    progress: Progress = QUIET,
) -> list[dict[str, Any]]:
    """A phase-3 run (`labctl train --phase 3 TRAIN_ARGS`) in a checkpoint folder of its own,
    removed afterwards from the hosts that trained; its step events. `poll(events)` is called
    with the events so far about twice a second while it runs."""
    from labctl.agent.core import paths

    inv = ctx.inventory_path
    started = time.time()
    # A folder of its own, so the measured run neither resumes nor touches the lab's phase-3
    # checkpoints.
    folder = f"{paths.TRAIN_DIR}/bench-{label}-{time.strftime('%Y%m%d-%H%M%S')}"
    own = ["--set", f"checkpoint_dir={folder}", "--set", "keep_checkpoints=1"]
    argv = [
        sys.executable,
        "-m",
        "labctl",
        "--json",
        "-i",
        str(inv),
        "train",
        "--phase",
        "3",
        *train_args,
        *own,
    ]
    run = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        while poll is not None and run.poll() is None:
            poll(_newest_metrics(inv, started))
            time.sleep(0.5)
        out, err = run.communicate(timeout=3600)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        _remove(ctx, folder, train_args, progress)
    if run.returncode != 0:
        raise HostError(
            f"The phase-3 run failed (exit {run.returncode}): {err.strip()[-600:] or out.strip()[-600:]}",
            "Run it alone with `labctl train --phase 3 ...` to see why.",
        )
    return [e for e in _newest_metrics(inv, started) if e.get("event") == "step" and "time" in e]


def training_figure(
    ctx: Context,
    orch: Orchestra,
    train_args: list[str],
    python: Optional[str],
    rotate_at: int,
    progress: Progress = QUIET,
) -> dict[str, Any]:
    """A phase-3 run, a rotation once it logged step `rotate_at`, then steps/s inside the
    rotation's window against outside it, and the run's mean reward."""
    from labctl.orchestra.rotate import Options, rotate

    window: list[Any] = []

    def poll(events: list[dict[str, Any]]) -> None:
        if window or not any(e.get("event") == "step" and e.get("step", 0) >= rotate_at for e in events):
            return
        progress.event("rotating", step=rotate_at)
        t0 = time.time()
        doc = rotate(ctx, orch, Options(python=python)).to_json()
        summary = {
            "joined": [t["model"] for t in doc["joined"]],
            "left": [t["model"] for t in doc["left"]],
            "seconds": doc["seconds"],
        }
        window.append((t0, time.time(), summary))

    steps = run_phase3(ctx, train_args, "phase3", poll, progress)
    if not window:
        raise InputError(
            f"The run ended before step {rotate_at}: no rotation happened inside it.",
            "Give it more steps (--set steps=N).",
        )
    w0, w1, summary = window[0]
    rewards = [float(e["reward"]) for e in steps if e.get("reward") is not None]
    return {
        **window_rates(steps, w0, w1),
        "rotation": summary,
        "reward": round(statistics.fmean(rewards), 4) if rewards else None,
    }


def _remove(ctx: Context, folder: str, train_args: list[str], progress: Progress) -> None:
    """The measured run's checkpoint folder off the hosts that trained (--limit's, else role train).

    Called from a `finally`: a host that fails, or a --limit that names none, is said (a "left
    behind" event), never raised, so it cannot hide how the run itself ended."""
    from shlex import quote

    from labctl.hosts.fanout import HostResult, HostRun, fan_out
    from labctl.inventory.select import select_hosts
    from labctl.output.errors import LabctlError

    limit = train_args[train_args.index("--limit") + 1] if "--limit" in train_args else "role:train"

    def step(run: HostRun) -> HostResult:
        res = run.conn.run(f"rm -rf {quote(folder)}", timeout=300, cancel=run.cancel)
        if res.ok:
            return HostResult(run.host.name, "ok", rc=0)
        why = "rm ran past 300 s" if res.timed_out else (res.stderr or res.stdout).strip()
        return HostResult(run.host.name, "failed", rc=res.rc, error=why or f"exit {res.rc}")

    try:
        results = fan_out(ctx, select_hosts(ctx.inventory, limit), step, progress=False)
    except LabctlError as e:
        results = [HostResult(limit, "failed", error=e.message.rstrip("."))]
    failed = [r for r in results if not r.ok]
    if failed:
        progress.event("left behind", folder=folder, hosts=[(r.host, r.error) for r in failed])


def window_rates(steps: list[dict[str, Any]], w0: float, w1: float) -> dict[str, Any]:
    """Steps/s of the steps whose span [previous step's time, this step's time] overlaps the
    window [w0, w1] against the others; failed steps are those that lost an answer."""
    inside: list[float] = []
    outside: list[float] = []
    for prev, cur in pairwise(steps):
        span = cur["time"] - prev["time"]
        (inside if prev["time"] < w1 and cur["time"] > w0 else outside).append(span)
    rate = {
        k: (len(v) / sum(v) if v and sum(v) > 0 else None)
        for k, v in (("inside", inside), ("outside", outside))
    }
    ratio = rate["inside"] / rate["outside"] if rate["inside"] and rate["outside"] else None
    return {
        "steps": len(steps),
        "steps_inside": len(inside),
        "steps_outside": len(outside),
        "window_s": round(w1 - w0, 3),
        "steps_per_s_inside": None if rate["inside"] is None else round(rate["inside"], 4),
        "steps_per_s_outside": None if rate["outside"] is None else round(rate["outside"], 4),
        "inside_over_outside": None if ratio is None else round(ratio, 4),
        "failed_steps": sum(1 for s in steps if s.get("answers_failed") or s.get("reward", 0) is None),
        "answers_retried": sum(int(s.get("answers_retried") or 0) for s in steps),
        "rotation_wait_s": round(sum(float(s.get("rotation_wait_s") or 0) for s in steps), 3),
    }
