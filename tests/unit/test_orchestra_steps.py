"""Each step of carrying out a rotation plan (labctl/orchestra/steps/), driven alone against a
fake agent: what it sends each host, in which order, and what it decides from the answers."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.text import Text

import labctl.orchestra.steps.cache as cache_step
import labctl.orchestra.steps.lock as lock_step
import labctl.orchestra.steps.publish as publish_step
import labctl.orchestra.steps.state as state
from labctl.hosts.fanout import HostResult
from labctl.inventory.model import Host, Inventory, ModelCache, Storage
from labctl.orchestra.decide import PlanStep
from labctl.orchestra.render import ROTATION_PROGRESS
from labctl.orchestra.rotate import run_plan
from labctl.orchestra.spec import load_orchestra
from labctl.orchestra.steps.cache import sync_cache
from labctl.orchestra.steps.lock import ROTATION, Locks, reach_gone
from labctl.orchestra.steps.publish import publish
from labctl.orchestra.steps.start import start_batch
from labctl.orchestra.steps.state import Options, Rotation, RotationResult
from labctl.orchestra.steps.stop import stop
from labctl.output.errors import HostError
from labctl.output.progress import QUIET, Shown

ORCHESTRA = """\
warm: 2
rotate: 1
hosts: gpu1
server: {drain_s: 0}
models:
  - {name: a, size_gb: 1, format: tinylm, engine: labctl}
  - {name: b, size_gb: 1, format: tinylm, engine: labctl}
  - {name: c, size_gb: 1, format: tinylm, engine: labctl}
"""


def _inventory() -> Inventory:
    cache = ModelCache(path="/mnt/c", size_gb=8, source="store")
    hosts = {
        "gpu1": Host(name="gpu1", address="10.0.0.5", roles=["inference", "train"], model_cache=cache),
        "trainer": Host(name="trainer", address="10.0.0.9", roles=["train"]),
        "store": Host(name="store", address="10.0.0.2", storage=Storage(models="/srv/models/")),
        "old": Host(name="old", address="10.0.0.7", roles=["inference"], model_cache=cache),
        "win": Host(name="win", address="10.0.0.8", os="windows"),
    }
    return Inventory(lab="t", path=Path("/tmp/lab.yaml"), hosts=hosts)


def _step(action: str, model: str, gpu: int = 0, mode: str = "make-before-break") -> PlanStep:
    return PlanStep(action, model, "gpu1", gpu, "H200", 1.0, mode)


# What a command answers where a test names no answer: the least its declaration
# (labctl/agent/orchestra/host.py) allows, as the checker holds a real agent to it.
LEAST: dict[str, dict[str, Any]] = {"orchestra.stop": {"stopped": [], "remaining": []}}


class Agent:
    """Stands in for every host's agent: records (host, command, args) and answers by command."""

    def __init__(self, answers: dict[str, Callable[[dict[str, Any]], Any]] | None = None) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.answers = answers or {}

    def __call__(self, run: Any, command: str, args: dict[str, Any], **kw: Any) -> Any:
        self.calls.append((run.host.name, command, args))
        answer = self.answers.get(command)
        return answer(args) if answer else dict(LEAST.get(command, {}))

    def commands(self) -> list[str]:
        return [c for _, c, _ in self.calls]


@pytest.fixture()
def agent(monkeypatch: pytest.MonkeyPatch) -> Agent:
    """The call that reaches a host's agent, faked for every step: Rotation.call's and publish's."""
    fake = Agent()
    on_host = lambda ctx, host, fn, cancel=None: fn(SimpleNamespace(host=host, ctx=ctx))  # noqa: E731
    monkeypatch.setattr(state, "on_host", on_host)
    monkeypatch.setattr(state, "call_agent", fake)
    monkeypatch.setattr(cache_step, "on_host", on_host)
    monkeypatch.setattr(publish_step, "call_agent", fake)
    monkeypatch.setattr(
        publish_step,
        "fan_out",
        lambda ctx, hosts, step, **kw: [step(SimpleNamespace(host=h, ctx=ctx)) for h in hosts],
    )
    return fake


class _Lines:
    """A console that keeps each line as a person reads it, markup gone."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def print(self, text: str, **kw: Any) -> None:
        self.lines.append(Text.from_markup(text).plain)


def _rotation(
    tmp_path: Path, steps: list[PlanStep] | None = None, report: list[str] | None = None
) -> Rotation:
    (tmp_path / "orchestra.yaml").write_text(ORCHESTRA)
    orch = load_orchestra(tmp_path / "orchestra.yaml")
    inv = _inventory()
    ctx = SimpleNamespace(inventory=inv, inventory_path=inv.path)
    plan = SimpleNamespace(steps=steps or [], cursor=None, to_json=lambda: {})
    opts = Options(progress=Shown(_Lines(report), ROTATION_PROGRESS) if report is not None else QUIET)
    result = RotationResult("rotate", plan, False)  # type: ignore[arg-type]
    return Rotation(ctx, orch, opts, {"gpu1": inv.hosts["gpu1"]}, {}, plan, result)  # type: ignore[arg-type]


def test_a_batch_that_fails_its_health_check_is_stopped_and_the_error_names_the_model_and_its_log(
    tmp_path: Path, agent: Agent
) -> None:
    agent.answers = {
        "orchestra.start": lambda a: {"port": 8100 + len(agent.calls), "pid": 4000 + len(agent.calls)},
        "orchestra.health": lambda a: {
            "results": [
                {"model": "a", "healthy": True, "seconds": 1.0},
                {"model": "b", "healthy": False, "error": "exited 1", "log_tail": "CUDA out of memory"},
            ]
        },
    }
    rot = _rotation(tmp_path)
    rot.warm["gpu1"] = [{"name": "c", "pid": 3000, "port": 8000}]
    with pytest.raises(HostError) as e:
        start_batch(rot, "gpu1", [_step("start", "a", 0), _step("start", "b", 1)])
    assert agent.commands() == [
        "orchestra.start",
        "orchestra.start",
        "orchestra.health",
        "orchestra.stop",
        "orchestra.commit",
    ]
    first = agent.calls[0][2]
    assert (first["lab"], first["host"], first["model"], first["gpu"], first["path"]) == (
        "t",
        "gpu1",
        "a",
        0,
        "/mnt/c/a",
    )
    health = agent.calls[2][2]
    assert [(s["model"], s["pid"]) for s in health["servers"]] == [("a", 4001), ("b", 4002)]
    # Both of the batch are stopped by pid, the healthy one too: nothing half-started is left.
    assert agent.calls[3][2]["pids"] == [4001, 4002] and agent.calls[3][2]["models"] is None
    # warm.json is rewritten with what answers: the model that was warm before, none of the batch.
    assert [m["name"] for m in agent.calls[4][2]["warm"]["models"]] == ["c"]
    assert rot.result.joined == [] and [m["name"] for m in rot.warm["gpu1"]] == ["c"]
    assert e.value.message == "gpu1: b did not become healthy: exited 1. Its log ends:\nCUDA out of memory"
    assert "b.log on gpu1" in e.value.hint and "run `labctl rotate` again" in e.value.hint


def test_a_healthy_batch_joins_the_warm_list_with_its_timings_and_is_committed(
    tmp_path: Path, agent: Agent
) -> None:
    agent.answers = {
        "orchestra.start": lambda a: {"port": 8101, "pid": 4001},
        "orchestra.health": lambda a: {
            "results": [
                {"model": "a", "healthy": True, "seconds": 5.0, "health": {"load_s": 2.0, "warmup_s": 1.0}}
            ]
        },
    }
    said: list[str] = []
    rot = _rotation(tmp_path, report=said)
    rot.cache_times = {"a": (3.0, False)}
    start_batch(rot, "gpu1", [_step("start", "a", 0)])
    assert agent.commands() == ["orchestra.start", "orchestra.health", "orchestra.commit"]
    (entry,) = rot.warm["gpu1"]
    assert (entry["name"], entry["gpu"], entry["port"], entry["pid"], entry["state"]) == (
        "a",
        0,
        8101,
        4001,
        "loaded",
    )
    assert agent.calls[2][2]["warm"]["models"] == [entry] and agent.calls[2][2]["warm"]["cursor"] == "a"
    (t,) = rot.result.joined
    assert (t.cache, t.cache_hit, t.load, t.warmup, t.health) == (3.0, False, 2.0, 1.0, 2.0)
    assert said == ["gpu1: starting a on GPU 0"]


def test_a_server_that_outlives_sigkill_is_an_error_and_stays_in_the_warm_list(
    tmp_path: Path, agent: Agent
) -> None:
    rot = _rotation(tmp_path)
    rot.warm["gpu1"] = [{"name": "a", "pid": 1}, {"name": "b", "pid": 2}]
    agent.answers = {"orchestra.stop": lambda a: {"remaining": [{"model": "a", "pid": 1}]}}
    with pytest.raises(HostError, match=r"gpu1: servers still run after SIGKILL: a \(pid 1\)\."):
        stop(rot, "gpu1", ["a"])
    assert [m["name"] for m in rot.warm["gpu1"]] == ["a", "b"]
    agent.answers = {}
    timings = stop(rot, "gpu1", ["a"])
    assert [m["name"] for m in rot.warm["gpu1"]] == ["b"] and [t.model for t in timings] == ["a"]
    assert agent.calls[-1][2] == {"lab": "t", "host": "gpu1", "models": ["a"], "pids": None, "grace": 30}


def test_publish_sends_the_warm_set_less_the_draining_models_and_notes_a_host_it_cannot_reach(
    tmp_path: Path, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    said: list[str] = []
    rot = _rotation(tmp_path, report=said)
    rot.warm["gpu1"] = [{"name": "a", "port": 8101}, {"name": "b", "port": 8102}]

    def fan_out(ctx: Any, hosts: Any, step: Any, **kw: Any) -> list[HostResult]:
        out = [step(SimpleNamespace(host=h, ctx=ctx)) for h in hosts if h.name != "trainer"]
        return [*out, HostResult("trainer", "failed", error="unreachable")]

    monkeypatch.setattr(publish_step, "fan_out", fan_out)
    publish(rot, "draining", {"gpu1": ["b"]})
    ((host, command, args),) = agent.calls
    assert (host, command) == ("gpu1", "orchestra.publish")
    assert [(m["name"], m["base_url"]) for m in args["endpoints"]["models"]] == [
        ("a", "http://10.0.0.5:8101/v1")
    ]
    (record,) = rot.result.published
    assert (record["why"], record["models"], record["hosts"]) == (
        "draining",
        ["a"],
        {"gpu1": "ok", "trainer": "unreachable"},
    )
    assert said == ["trainer: the trainers' endpoints could not be rewritten: unreachable"]


def test_the_cache_step_syncs_only_missing_folders_and_protects_the_warm_ones(
    tmp_path: Path, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[tuple[list[str], set[str]]] = []
    monkeypatch.setattr(
        cache_step, "cache_state", lambda run, mc: {"models": {"a": {}, "b": {"present": False}}}
    )
    monkeypatch.setattr(
        cache_step, "sync", lambda run, target, missing, protect: synced.append((list(missing), set(protect)))
    )
    rot = _rotation(tmp_path)
    rot.warm["gpu1"] = [{"name": "c", "pid": 1}]
    sync_cache(rot, [_step("start", "a"), _step("start", "b")])
    assert synced == [(["b"], {"c"})]
    assert rot.cache_times["a"] == (0.0, True) and rot.cache_times["b"][1] is False


def test_a_gone_host_held_by_another_rotation_is_reported_unreachable_not_retired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken: list[str] = []

    class FakeLock:
        def __init__(self, run: Any, wait: Any, progress: Any, kind: Any) -> None:
            assert kind is ROTATION
            self.name = run.host.name

        def __enter__(self) -> FakeLock:
            if self.name == "old":
                raise HostError("old: another labctl rotate is in the middle of another rotation")
            taken.append(self.name)
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(lock_step, "HostLock", FakeLock)
    monkeypatch.setattr(lock_step, "read_views", lambda ctx, hosts, health, gpus: {})
    inv = _inventory()
    ctx = SimpleNamespace(inventory=inv)
    orch = SimpleNamespace(server=SimpleNamespace(health="/health"))
    with ExitStack() as stack:
        locks = Locks(ctx, Options(), stack)  # type: ignore[arg-type]
        locks.take([inv.hosts["trainer"], inv.hosts["gpu1"]])
        assert taken == ["gpu1", "trainer"]  # by name: two rotations never deadlock
        gone: dict[str, dict[str, Any]] = {"old": {}, "removed": {}, "win": {}}
        retired, views, unreachable = reach_gone(ctx, orch, gone, locks)  # type: ignore[arg-type]
    assert (retired, views) == ({}, {})
    assert unreachable == {"old": "old: another labctl rotate is in the middle of another rotation"}
    with ExitStack() as stack:
        Locks(ctx, Options(dry_run=True), stack).take([inv.hosts["gpu1"]])  # type: ignore[arg-type]
    assert taken == ["gpu1", "trainer"]  # a dry run takes no lock


def test_the_executor_runs_the_plans_steps_in_order_draining_before_a_stop(
    tmp_path: Path, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        cache_step, "cache_state", lambda run, mc: agent(run, "cache.state", {"cache": mc.path})
    )
    agent.answers = {
        "cache.state": lambda a: {"models": {"b": {}}},
        "orchestra.start": lambda a: {"port": 8102, "pid": 4002},
        "orchestra.health": lambda a: {"results": [{"model": "b", "healthy": True}]},
    }
    rot = _rotation(tmp_path)
    rot.warm["gpu1"] = [{"name": "a", "port": 8101, "pid": 4001}]
    rot.plan.steps = [_step("stop", "a"), _step("start", "b")]
    run_plan(rot)
    # Each publish goes to both hosts that train (gpu1, trainer).
    assert agent.commands() == [
        "cache.state",
        "orchestra.publish",  # draining: a leaves the trainers' endpoints first
        "orchestra.publish",
        "orchestra.stop",
        "orchestra.commit",
        "orchestra.start",
        "orchestra.health",
        "orchestra.commit",
        "orchestra.publish",  # joined
        "orchestra.publish",
        "orchestra.commit",  # the history entry
        "orchestra.publish",  # committed
        "orchestra.publish",
    ]
    assert [p["why"] for p in rot.result.published] == ["draining", "joined", "committed"]
    assert rot.result.published[0]["models"] == [] and rot.result.published[-1]["models"] == ["b"]
    assert agent.calls[-3][2]["history"]["joined"] == ["b"] and agent.calls[-3][2]["history"]["left"] == ["a"]
    assert rot.result.warm == {"gpu1": [rot.warm["gpu1"][0]]} and rot.warm["gpu1"][0]["name"] == "b"
