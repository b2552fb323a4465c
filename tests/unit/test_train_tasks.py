"""Phase 3's programming tasks (labctl/agent/models/tasks/): their shape, and that each
reference solution, really run, passes its task's tests, under this Python and under 3.8."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from labctl.agent.models import tasks as T
from labctl.agent.sandbox.batch import matches

REPO = Path(__file__).resolve().parents[2]
PY38 = Path("/root/.pyenv/versions/3.8.18/bin/python3")
needs_py38 = pytest.mark.skipif(not PY38.exists(), reason=f"no Python 3.8 at {PY38}")


def run_all(python: str, tasks: Sequence[T.Task]) -> list[str]:
    """Run every test of `tasks` with its solution under `python`; one line per failure."""
    jobs: list[tuple[T.Task, int, T.Test]] = [(t, i, x) for t in tasks for i, x in enumerate(t.tests)]

    def one(job: tuple[T.Task, int, T.Test]) -> str:
        t, i, x = job
        p = subprocess.run(
            [python, "-I", "-c", t.solution], input=x.stdin, capture_output=True, text=True, timeout=20
        )
        if p.returncode != 0 or p.stdout != x.expect:
            return f"{t.name} test {i}: stdin {x.stdin!r} expect {x.expect!r} got {p.stdout!r} rc {p.returncode} {p.stderr[-300:]}"
        return ""

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return [r for r in pool.map(one, jobs) if r]


def test_the_set_is_large_with_unique_well_formed_names() -> None:
    assert len(T.TASKS) >= 50
    names = [t.name for t in T.TASKS]
    assert len(set(names)) == len(names)
    for name in names:
        assert re.fullmatch(r"[a-z0-9_]+", name), name


def test_every_task_has_five_to_eight_small_ascii_tests_ending_in_newlines() -> None:
    for t in T.TASKS:
        assert 5 <= len(t.tests) <= 8, t.name
        assert len({x.stdin for x in t.tests}) == len(t.tests), f"{t.name}: a repeated input"
        for x in t.tests:
            assert x.stdin.endswith("\n") and x.expect.endswith("\n"), (t.name, x)
            assert len(x.stdin.encode()) < 200, (t.name, x.stdin)
            assert x.stdin.isascii() and x.expect.isascii(), (t.name, x)


def test_prompt_text_is_short_and_carries_the_prompt() -> None:
    for t in T.TASKS:
        text = T.prompt_text(t)
        assert len(text) < 400, (t.name, len(text))
        assert t.prompt in text
        assert text.startswith(f"# Task: {t.name}\n# ")
        assert text.endswith("\n")
        assert all(line.startswith("#") for line in text.splitlines())


def test_every_reference_solution_passes_every_test_when_run() -> None:
    assert run_all(sys.executable, T.TASKS) == []


def test_wrong_programs_fail_at_least_one_test_of_every_task() -> None:
    # Judged as the sandbox judges (trailing blank lines and spaces do not count), so a
    # program that prints nothing cannot pass a task whose every answer is an empty line.
    for t in T.TASKS:
        for wrong in ("0\n", "", "yes\n", "no\n"):
            assert not all(matches(wrong, x.expect) for x in t.tests), (t.name, wrong)
        assert not all(matches(x.stdin, x.expect) for x in t.tests), (t.name, "echo")


def test_task_finds_by_name_and_names_the_unknown_one() -> None:
    assert T.task("sum_two") is T.TASKS[[t.name for t in T.TASKS].index("sum_two")]
    with pytest.raises(KeyError, match="nope"):
        T.task("nope")


def test_as_program_is_one_entry_of_a_sandbox_batch() -> None:
    t = T.task("sum_two")
    prog = t.as_program("print(3)\n")
    assert prog == {
        "lang": "python",
        "source": "print(3)\n",
        "tests": [{"stdin": x.stdin, "expect": x.expect} for x in t.tests],
    }
    assert t.as_program("x", lang="python3.8")["lang"] == "python3.8"


def test_the_set_is_the_same_on_every_import() -> None:
    # Each process salts str hashes anew: the random inputs must not depend on them.
    code = "from labctl.agent.models import tasks as T; print(repr(T.TASKS))"
    runs = [
        subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30, check=True
        ).stdout
        for _ in range(2)
    ]
    assert runs[0] == runs[1] == repr(T.TASKS) + "\n"


def test_importing_the_tasks_leaves_torch_out() -> None:
    code = "import sys; from labctl.agent.models import tasks; print('torch' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert p.stdout == "False\n", p.stderr


@needs_py38
def test_the_module_imports_under_python_3_8() -> None:
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); from labctl.agent.models import tasks; print(len(tasks.TASKS))"
    p = subprocess.run([str(PY38), "-I", "-c", code], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"{len(T.TASKS)}\n"


@needs_py38
def test_reference_solutions_pass_under_python_3_8() -> None:
    # The sandbox's images may run another Python than the host's.
    assert run_all(str(PY38), T.TASKS[:12]) == []
