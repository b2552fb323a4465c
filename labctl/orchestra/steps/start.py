"""A batch of joiners on one host started (orchestra.start) and their health awaited together
(orchestra.health); a batch that does not become healthy is stopped whole and the error names
the log."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from labctl.agent.core import paths
from labctl.hosts.agent_ship import agent_event
from labctl.orchestra.engines import engine
from labctl.orchestra.sizes import served_context
from labctl.orchestra.steps.commit import commit
from labctl.orchestra.steps.state import Rotation, Timing
from labctl.orchestra.steps.stop import stop_quietly
from labctl.output.errors import HostError
from labctl.provision.hint import provision_fix

if TYPE_CHECKING:
    from labctl.agent.orchestra.answers import Health, HealthAnswer, StartAnswer
    from labctl.orchestra.spec import Orchestra


def start_args(orch: Orchestra, model: str, gpu: int | None, files: dict[str, Any] | None) -> dict[str, Any]:
    """What orchestra.start and orchestra.health need of `model`'s engine (engines/base.py's contract)."""
    eng = engine(orch.engine_name(model))
    args = eng.start_args(model, served_context(orch.model(model).context, orch.context, files), gpu)
    if eng.name == "command":
        args["command"] = orch.server.command
        args["health_path"] = orch.server.health
    if eng.name == "labctl":
        # labctl's server says its own state on the file's health path (default /health).
        args["health_path"] = orch.server.health
    args["binary"] = orch.server.binaries.get(eng.name) or eng.binary
    return args


def lacks_torch(text: str) -> bool:
    """Whether a server's error or log says its interpreter has no torch."""
    return "torch is not installed" in text or "No module named 'torch'" in text


def failed_start_hint(kind: str, host: str, model: str, made_room: bool, torch_fix: str | None = None) -> str:
    """The hint of a joiner that did not become healthy: what was undone, the fix, and the
    command that was run (`kind`), to run again. `torch_fix`: where the server's interpreter
    lacks torch, the provision command that installs it (provision_fix's text)."""
    command = "labctl rotate" if kind == "rotate" else f"labctl orchestra {kind}"
    undone = (
        "Nothing was left half-started: the joining servers were stopped and the warm set is as it was"
        + (" minus the models stopped to make room" if made_room else "")
        + "."
    )
    log = f"{paths.ORCHESTRA_LOGS}/{model}.log"
    if torch_fix is not None:
        fix = (
            f"labctl's model server ran with a Python that has no torch on {host}: name one that has it "
            f"with `{command} --python PATH` or `server.python: PATH` in the orchestra file, or install "
            f"the torch environment with {torch_fix}; then run `{command}` again."
        )
    else:
        fix = f"Read {log} on {host}, fix the model or the server command, and run `{command}` again."
    return f"{undone} {fix}"


def start_batch(rot: Rotation, host: str, batch: Sequence[Any]) -> None:
    """The batch's servers started one by one, then their health awaited together; those that
    answer join `host`'s warm list and warm.json is written."""
    target = rot.targets[host]
    started: list[dict[str, Any]] = []
    timings: dict[str, Timing] = {}
    try:
        for s in batch:
            spec = rot.orch.model(s.model)
            t = time.monotonic()
            rot.progress.event("starting", host=host, model=s.model, gpu=s.gpu)
            # rot.call answers Any; the agent's checker has held each answer to its declaration
            info: StartAnswer = rot.call(
                host,
                "orchestra.start",
                {
                    "model": s.model,
                    "gpu": s.gpu,
                    "path": target.cached(spec.folder),
                    "python": rot.opts.python or rot.orch.server.python,
                    **start_args(rot.orch, s.model, s.gpu, rot.files.get(s.model)),
                },
            )
            cache_s, hit = rot.cache_times.get(s.model, (0.0, True))
            timings[s.model] = Timing(s.model, host, cache=cache_s, cache_hit=hit, start=time.monotonic() - t)
            engine_args = start_args(rot.orch, s.model, s.gpu, rot.files.get(s.model))
            started.append(
                {
                    "model": s.model,
                    "port": info["port"],
                    "pid": info["pid"],
                    "step": s,
                    "since": time.time(),
                    "health_path": engine_args["health_path"],
                    "loading_words": engine_args["loading_words"],
                    "ready_by_completion": engine_args["ready_by_completion"],
                }
            )
        t = time.monotonic()
        answer: HealthAnswer = rot.call(
            host,
            "orchestra.health",
            {
                "servers": [
                    {
                        "model": x["model"],
                        "port": x["port"],
                        "pid": x["pid"],
                        "health_path": x["health_path"],
                        "loading_words": x["loading_words"],
                        "ready_by_completion": x["ready_by_completion"],
                    }
                    for x in started
                ],
                "timeout": rot.orch.server.start_timeout,
                "health_path": rot.orch.server.health,
            },
            timeout=rot.orch.server.start_timeout + 60,
            on_line=health_line(rot, host),
        )
    except BaseException:
        # Nothing half-started stays behind: whatever of this batch runs is stopped.
        if started:
            stop_quietly(rot, host, [int(x["pid"]) for x in started])
        raise
    waited = time.monotonic() - t
    results = {r["model"]: r for r in answer["results"]}
    bad = [r for r in results.values() if not r["healthy"]]
    if bad or len(results) < len(started):
        stop_quietly(rot, host, [int(x["pid"]) for x in started])
        commit(rot, host)
        r: Health = bad[0] if bad else {"model": "?", "healthy": False, "error": "no answer"}
        tail = (r.get("log_tail") or "").strip()[-600:]
        error = str(r.get("error") or "no health answer")
        torch_fix = None
        if lacks_torch(f"{error}\n{tail}"):
            torch_fix = provision_fix(rot.ctx.inventory, host, "torch_env")
        raise HostError(
            f"{host}: {r['model']} did not become healthy: {error}."
            + (f" Its log ends:\n{tail}" if tail else ""),
            failed_start_hint(
                rot.opts.kind,
                host,
                str(r["model"]),
                any(s.mode == "break-before-make" for s in batch),
                torch_fix,
            ),
        )
    for x in started:
        r = results[x["model"]]
        doc = r.get("health") or {}
        tm = timings[x["model"]]
        tm.load = float(doc.get("load_s") or 0.0)
        tm.warmup = float(doc.get("warmup_s") or 0.0)
        tm.health = max(0.0, float(r.get("seconds") or waited) - tm.load - tm.warmup)
        s = x["step"]
        rot.warm[host].append(
            {
                "name": x["model"],
                "gpu": s.gpu,
                "gpu_model": s.gpu_model,
                "gpu_source": s.gpu_source,
                "port": x["port"],
                "pid": x["pid"],
                "state": "loaded",
                "since": round(x["since"], 3),
                "memory_gb": s.memory_gb,
            }
        )
        rot.cursor = x["model"]
        rot.result.joined.append(tm)
    commit(rot, host)


def health_line(rot: Rotation, host: str) -> Callable[[str, str], None]:
    """orchestra.health's progress lines, said as each server moves on."""

    def on_line(stream: str, line: str) -> None:
        ev = agent_event(stream, line, "health")
        if ev is not None and ev.get("state") in ("ready", "loading", "warming", "failed"):
            rot.progress.event("health", host=host, model=ev.get("model"), state=ev.get("state"))

    return on_line
