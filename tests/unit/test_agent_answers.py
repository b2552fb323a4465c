"""Every agent answer is checked against the shape its handler declares (@command, labctl/agent/core/spec.py)
where answers arrive (agent_ship.call_agent), and what passes the check is safe for the code that
reads it: status, metrics, facts and doctor take any answer of the declared shape."""

from __future__ import annotations

import io
import json
import stat
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from labctl.agent.commands import COMMANDS, answer_problem, declared
from labctl.agent.core.spec import EVENTS, INT_LIMIT, TIME_LIMIT, malformed, problem, shape_of
from labctl.hosts import agent_ship
from labctl.hosts.agent_ship import BAD_ANSWER, AgentFailed, agent_event, call_agent
from labctl.hosts.context import Context
from labctl.hosts.fanout import HostRun
from labctl.inventory.model import Host

# What each command's handler declares, read through the command table as the controller reads it.
DECLARED = {name: declared(name) for name in COMMANDS}
ANSWERS = {name: d.answers for name, d in DECLARED.items() if d is not None}
PER_ASKED = {name: d.per_asked for name, d in DECLARED.items() if d is not None and d.per_asked}

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


def conforming(shape: Any) -> st.SearchStrategy[Any]:
    """Values of `shape`, with keys it does not name added here and there (answers may grow)."""
    if isinstance(shape, str):
        base = shape.rstrip("?")
        plain: dict[str, st.SearchStrategy[Any]] = {
            "str": st.text(max_size=12),
            "bool": st.booleans(),
            "null": st.none(),
            "any": JSON,
            "int": st.integers(-INT_LIMIT, INT_LIMIT - 1),
            "num": st.integers(-INT_LIMIT, INT_LIMIT - 1) | st.floats(allow_nan=False, allow_infinity=False),
            "time": st.integers(0, int(TIME_LIMIT) - 1)
            | st.floats(0, TIME_LIMIT, exclude_max=True, allow_nan=False),
            "cap": st.from_regex(r"[0-9]{1,2}(\.[0-9]{1,2})?", fullmatch=True),
        }
        return st.none() | plain[base] if shape.endswith("?") else plain[base]
    if isinstance(shape, tuple):
        return st.one_of([conforming(s) for s in shape])
    if isinstance(shape, list):
        return st.lists(conforming(shape[0]), max_size=3)
    required = {k: conforming(v) for k, v in shape.items() if k != "*" and not k.endswith("?")}
    optional = {k[:-1]: conforming(v) for k, v in shape.items() if k.endswith("?")}
    named = set(required) | set(optional)
    others = conforming(shape["*"]) if "*" in shape else JSON
    extra = st.dictionaries(st.text(max_size=6).filter(lambda k: k not in named), others, max_size=2)
    return st.builds(lambda d, e: {**e, **d}, st.fixed_dictionaries(required, optional=optional), extra)


def test_every_command_declares_a_well_formed_answer_shape() -> None:
    assert sorted(set(COMMANDS) - set(ANSWERS)) == [], "declare these commands' answers with @command"
    assert sorted(set(ANSWERS) - set(COMMANDS)) == [], "answers declared for commands the agent lacks"
    for command, shape in ANSWERS.items():
        assert malformed(shape) is None, (command, malformed(shape))
    for command, (answer_key, _) in PER_ASKED.items():
        assert answer_key in ANSWERS[command], command
    for name, shape in EVENTS.items():
        assert malformed(shape) is None, (name, malformed(shape))


# Fewer examples per command: there are fifty commands, and their shapes share most parts.
PER_COMMAND = settings(max_examples=15, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("command", sorted(ANSWERS))
@PER_COMMAND
@given(data=st.data())
def test_answers_of_the_declared_shape_pass(command: str, data: st.DataObject) -> None:
    answer = data.draw(conforming(ANSWERS[command]))
    # What the agent prints is JSON, and the checker reads it back from JSON.
    assert problem(ANSWERS[command], json.loads(json.dumps(answer))) is None


def spoiled(data: st.DataObject, value: Any) -> Any:
    """`value` with one thing somewhere inside it replaced by any JSON at all."""
    if isinstance(value, (list, dict)) and value and data.draw(st.booleans()):
        keys = list(range(len(value))) if isinstance(value, list) else sorted(value)
        key = data.draw(st.sampled_from(keys))
        value[key] = spoiled(data, value[key])  # type: ignore[index]
        return value
    return data.draw(JSON)


@settings(max_examples=500)
@given(
    command=st.sampled_from(sorted(ANSWERS)),
    data=st.data(),
    args=st.dictionaries(st.sampled_from(["probes", "steps", "programs", "servers", "x"]), JSON, max_size=2),
)
def test_any_json_passes_or_is_refused_at_a_path(
    command: str, data: st.DataObject, args: dict[str, Any]
) -> None:
    # Anything at all, and answers of the shape with one part of them spoiled.
    answer = data.draw(JSON | conforming(ANSWERS[command]).map(json.dumps).map(json.loads))
    answer = spoiled(data, answer) if data.draw(st.booleans()) else answer
    found = answer_problem(command, answer, args)
    assert found is None or (found.startswith("at ") and ": " in found), found


def test_a_refusal_names_where_and_what() -> None:
    status = {"time": 1.0, "memory": {"used_bytes": 1}, "gpus": "many"}
    assert answer_problem("monitor.status", status) == "at gpus: expected a list, got str 'many'"
    status["gpus"] = [{"index": 0}, {"index": "1"}]
    assert (
        answer_problem("monitor.status", status) == "at gpus[1].index: expected a whole number, got str '1'"
    )
    assert answer_problem("monitor.status", [status]) == "at the top: expected an object, got list"
    assert answer_problem("ping", {}) == "at time: missing (expected a time (seconds since 1970))"
    assert answer_problem("ping", {"time": float("inf")}) is not None
    assert answer_problem("ping", {"time": 10**400}) is not None
    assert answer_problem("ping", {"time": True}) is not None  # true is no number in JSON
    cache = {"cache": "/c", "exists": True, "models": {"llama 8b": {"files": [{"path": "w", "size": -1.5}]}}}
    assert answer_problem("cache.state", cache) == (
        "at models['llama 8b'].files[0].size: expected a whole number, got float -1.5"
    )
    facts = {"gpus": {"error": "nvidia-smi exited 9", "kind": "GpuQueryError"}}
    assert answer_problem("facts.collect", facts) is None  # a section that failed says so in its place
    facts = {"gpus": [{"compute_capability": "sm_86"}]}
    assert "expected a compute capability" in str(answer_problem("facts.collect", facts))


def test_answers_keyed_by_what_was_asked_answer_each() -> None:
    asked = {"probes": {"pub": {"kind": "file", "path": "/k.pub"}}}
    assert answer_problem("provision.probe", {"results": {"pub": {}}}, asked) is None
    assert answer_problem("provision.probe", {"results": {}}, asked) == "at results: no answer for 'pub'"
    programs = {"programs": [{"lang": "python"}, {"lang": "c"}]}
    assert (
        answer_problem("sandbox.run", {"results": [{}]}, programs) == "at results: 1 answers for the 2 asked"
    )


# -- through call_agent, over a local connection to a `python:` that answers garbage ------------


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Context:
    monkeypatch.setattr(agent_ship, "agent_dir", lambda host: str(tmp_path / "agent"))
    return Context.create(inventory_path=Path("unused.yaml"), console=Console(stderr=True))


def garbage_python(tmp_path: Path, answer: str) -> str:
    """An executable that stands where the host's python is, answering `answer` to any command."""
    path = tmp_path / "python3"
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{answer}\nEOF\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_call_agent_refuses_an_answer_of_the_wrong_shape_naming_the_host(
    ctx: Context, tmp_path: Path
) -> None:
    host = Host(
        name="m5", address="127.0.0.1", connection="local", python=garbage_python(tmp_path, '{"gpus": 7}')
    )
    with pytest.raises(AgentFailed) as e:
        call_agent(HostRun(ctx, host, threading.Event()), "monitor.status", {})
    assert e.value.kind == BAD_ANSWER and e.value.exit_code == 1
    assert (
        e.value.message
        == "m5 answered `monitor.status` with a reply labctl cannot read: at time: missing (expected a time (seconds since 1970))."
    )
    assert f"labctl exec --limit m5 -- {host.python} -c" in e.value.hint


def test_call_agent_passes_a_real_answer(ctx: Context) -> None:
    host = Host(name="here", address="127.0.0.1", connection="local", python=sys.executable)
    assert isinstance(call_agent(HostRun(ctx, host, threading.Event()), "ping", {})["time"], float)


# -- what passes the check, its readers take ------------------------------------------------------


@given(sample=conforming(ANSWERS["monitor.status"]))
def test_status_metrics_and_alerts_take_any_status_answer_of_the_shape(sample: dict[str, Any]) -> None:
    from labctl.monitor.alerts import AlertRules, evaluate
    from labctl.monitor.collect import HostStatus
    from labctl.monitor.metrics import exposition
    from labctl.monitor.render import render_status, status_json

    sample = json.loads(json.dumps(sample))
    st_ = HostStatus("m5", True, sample, evaluate("m5", sample, AlertRules()))
    Console(file=io.StringIO(), width=80).print(render_status([st_], now=0.0))
    assert "labctl_host_up" in exposition([st_])
    json.dumps(status_json([st_]))


@given(
    facts=conforming(ANSWERS["facts.collect"]),
    cron=conforming(ANSWERS["cron.list"]),
    images=conforming(ANSWERS["sandbox.images"]),
)
def test_facts_and_doctor_take_any_facts_answer_of_the_shape(
    facts: dict[str, Any], cron: dict[str, Any], images: dict[str, Any]
) -> None:
    from labctl.doctor.checks import check_host, check_same_torch, check_tier, node_has
    from labctl.doctor.gather import HostFound
    from labctl.doctor.tiers import TIERS
    from labctl.facts.collect import mismatches
    from labctl.facts.render import render_facts
    from labctl.hosts.fanout import HostResult

    facts = json.loads(json.dumps(facts))
    host = Host(
        name="m5",
        address="10.0.0.5",
        connection="local",
        roles=["train", "sandbox"],
        ram_gb=64,
        gpus=[{"model": "Tesla V100", "memory_gb": 32, "count": 1}],
        nics=[{"name": "eth0", "speed_mbps": 1000}],
        model_cache={"path": "/mnt/model-cache", "size_gb": 8},
        bond={"name": "bond0", "mode": "802.3ad", "interfaces": ["eth0", "eth1"]},
    )
    result = HostResult("m5", "ok", data=facts, extra={"mismatches": mismatches(host, facts)})
    render_facts(Console(file=io.StringIO(), width=120), [result])
    found = HostFound(host, facts=facts, cron=json.loads(json.dumps(cron)), images=images["images"])
    check_host(found)
    check_same_torch([found])
    node_has(found)
    for tier in TIERS.values():
        check_tier([found], tier)


def test_doctor_takes_a_network_probe_that_measured_no_stream() -> None:
    # netbench.send may answer no runs at all (its shape allows an empty list): no bandwidth to show.
    from labctl.doctor.checks import check_network
    from labctl.doctor.gather import NetworkProbe

    lines = check_network(NetworkProbe("m5", "irina", report={"best": None, "runs": []}), None)
    assert [(x.status, x.found) for x in lines] == [("fail", "m5 -> irina: no stream was measured")]


@given(event=JSON, name=st.sampled_from(sorted(EVENTS)))
def test_a_progress_event_is_taken_only_when_of_its_shape(event: Any, name: str) -> None:
    line = json.dumps({**event, "event": name} if isinstance(event, dict) else event)
    got = agent_event("stderr", line)
    assert got is None or problem(EVENTS[name], got) is None


def test_a_progress_event_labctl_cannot_read_is_no_event() -> None:
    assert agent_event("stderr", '{"event": "progress", "done": "half", "total": 8}') is None
    assert agent_event("stderr", '{"event": "listening", "port": "9000", "token": "t"}', "listening") is None
    assert agent_event("stderr", '{"event": ["progress"]}') is None
    assert agent_event("stderr", '{"event": "progress", "done": 4, "total": 8}', "progress") == {
        "event": "progress",
        "done": 4,
        "total": 8,
    }


# -- an answer declared as a TypedDict ------------------------------------------------------------


def test_a_typeddict_answer_is_the_shape_it_names() -> None:
    from labctl.agent.orchestra.answers import StateAnswer, StopAnswer

    assert shape_of(StopAnswer) == {
        "stopped": [{"model": "str", "pid": "int", "killed?": "bool"}],
        "remaining": [{"model?": "str", "pid?": "int"}],
        "absent?": ["str"],
    }
    state = shape_of(StateAnswer)
    # Optional of a scalar is "X?", of an object a choice with null; NewType markers name the kinds
    assert state["warm?"] == ({"models?": ["any"]}, "null")
    assert state["servers"][0]["started?"] == "time?"
    assert state["gpus?"][0]["compute_capability?"] == "cap?"
    answer = {"servers": [{"model": "m", "pid": 1, "started": -1}]}
    assert answer_problem("orchestra.state", answer) == (
        "at servers[0].started: expected a time (seconds since 1970) or null, got int -1"
    )


def test_a_typeddict_cannot_say_an_argument_the_agent_checks() -> None:
    from labctl.agent.core.spec import command
    from labctl.agent.orchestra.answers import StopAnswer

    with pytest.raises(ValueError, match="StopAnswer is a TypedDict"):
        command(takes={"last": [StopAnswer]}, answers={})
