"""The fast answer check (labctl/agent/core/spec.py: fits, checker) says what the full one says.

problem() first asks fits() and a command's Spec asks its checker() (built once per shape); only a
value that does not fit is walked again to name the place. Both must agree with that walk
(_problem) on every value: an answer let through that the walk would refuse, or the reverse,
would change what `labctl status` and every other command accept."""

from __future__ import annotations

import copy
import json
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from labctl.agent.commands import answer_problem, declared
from labctl.agent.core import spec
from labctl.agent.core.spec import INT_LIMIT, TIME_LIMIT, _problem, checker, fits, problem
from tests.unit.test_agent_answers import ANSWERS, JSON, conforming, spoiled

EDGES = st.sampled_from(
    [
        True,
        False,
        None,
        INT_LIMIT,
        INT_LIMIT - 1,
        -INT_LIMIT,
        -INT_LIMIT - 1,
        TIME_LIMIT,
        -0.5,
        float("nan"),
        float("inf"),
        1.5,
        0,
        "8.6",
        " 7 ",
        "x",
        "*",
        [],
        {},
        {"*": 1},
    ]
).map(copy.deepcopy)  # a fresh [] or {} each time: the test changes what it draws in place


@settings(max_examples=600)
@given(
    command=st.sampled_from(sorted(ANSWERS)),
    data=st.data(),
    bounded=st.booleans(),
)
def test_fits_and_checker_agree_with_the_walk_that_names_the_place(
    command: str, data: st.DataObject, bounded: bool
) -> None:
    shape = ANSWERS[command]
    value = data.draw(JSON | EDGES | conforming(shape).map(json.dumps).map(json.loads))
    if data.draw(st.booleans()):
        value = spoiled(data, value)
    if data.draw(st.booleans()) and isinstance(value, (list, dict)) and value:
        # One of the scalars at the bounds the checks draw their lines at, somewhere inside.
        key = data.draw(
            st.sampled_from(list(range(len(value))) if isinstance(value, list) else sorted(value))
        )
        value[key] = data.draw(EDGES)  # type: ignore[index]
    walked = _problem(shape, value, "", bounded) is None
    assert fits(shape, value, bounded) is walked
    assert checker(shape, bounded)(value) is walked
    assert problem(shape, value, "", bounded) == _problem(shape, value, "", bounded)
    if bounded:  # how answers are checked where they arrive
        assert answer_problem(command, value) == _problem(shape, value, "", True)


@given(shape_value=st.sampled_from(["int", "num", "time", "cap", "str", "bool", "null", "any"]), value=EDGES)
def test_each_scalar_kind_at_its_bounds(shape_value: str, value: Any) -> None:
    for shape in (shape_value, shape_value + "?"):
        for bounded in (True, False):
            walked = _problem(shape, value, "", bounded) is None
            assert fits(shape, value, bounded) is walked and checker(shape, bounded)(value) is walked


def test_a_refused_answer_is_named_as_before() -> None:
    shape = {"a": [{"b?": "int", "*": "str"}], "c?": ("num", ["str"])}
    assert (
        problem(shape, {"a": [{"b": 1, "x": "y"}, {"b": 1.5}]})
        == "at a[1].b: expected a whole number, got float 1.5"
    )
    assert problem(shape, {"a": [{"*": 2}]}) == "at a[0]['*']: expected a string, got int 2"
    assert problem(shape, {"a": [], "c": [3]}) == "at c[0]: expected a string, got int 3"
    assert problem(shape, {"a": []}) is None and problem(shape, {"a": [], "c": None}) is not None


def test_a_status_answer_with_an_hour_of_history_is_checked_fast() -> None:
    """The answer each host sends `labctl status`: with 8 GPUs and 65 minutes of history it is
    ~20k values; the check used to take ~45 ms a host (the GIL serialises it across hosts)."""
    now = time.time()
    gpu = {"index": 0, "name": "H100", "uuid": "GPU-x", "utilization_pct": 50, "memory_total_bytes": 80 << 30}
    history = [
        {
            "t": now - 10 * i,
            "memory_used_bytes": 10**10,
            "gpus": [{"index": g, "memory_used_pct": 50.0} for g in range(8)],
        }
        for i in range(390, 0, -1)
    ]
    answer = {"time": now, "memory": {"used_bytes": 1}, "gpus": [gpu] * 8, "history": history}
    found = declared("monitor.status")
    assert found is not None and answer_problem("monitor.status", answer) is None

    def took(check: Any) -> float:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            assert check() is None
            times.append(time.perf_counter() - started)
        return min(times)

    fast = took(lambda: found.answer_problem(answer))
    walk = took(lambda: _problem(found.answers, answer, "", True))
    assert fast < walk / 3, (fast, walk)
    history[200]["gpus"][3]["memory_used_pct"] = "x"
    assert found.answer_problem(answer) == (
        "at history[200].gpus[3].memory_used_pct: expected a number or null, got str 'x'"
    )
    assert spec.problem(found.answers, answer) == found.answer_problem(answer)
