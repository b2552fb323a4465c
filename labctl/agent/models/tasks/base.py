"""What every task family shares: the `Task` and `Test` types, `prompt_text`, and the small
helpers the reference functions and the tasks are written with (`_t` makes a task, its tests'
expected outputs computed by the reference function)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence, Tuple


@dataclass(frozen=True)
class Test:
    stdin: str
    expect: str  # the exact expected stdout, ending with "\n"


@dataclass(frozen=True)
class Task:
    name: str
    prompt: str
    solution: str
    tests: Tuple[Test, ...]

    def as_program(self, source: str, lang: str = "python") -> Dict[str, object]:
        """`source` as one program of a sandbox batch, with this task's tests."""
        return {
            "lang": lang,
            "source": source,
            "tests": [{"stdin": t.stdin, "expect": t.expect} for t in self.tests],
        }


def prompt_text(task: Task) -> str:
    """The text a model is given for `task`."""
    body = "\n".join("# " + line for line in task.prompt.splitlines())
    return (
        f"# Task: {task.name}\n{body}\n# Write a Python 3 program that reads stdin and prints the answer.\n"
    )


def _line(s: str) -> str:
    return s.split("\n", 1)[0]


def _ints(s: str) -> List[int]:
    return [int(x) for x in s.split()]


def _out(*lines: object) -> str:
    return "".join(f"{x}\n" for x in lines)


def _yes(b: bool) -> str:
    return "yes\n" if b else "no\n"


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def _t(name: str, prompt: str, ref: Callable[[str], str], solution: str, inputs: Sequence[str]) -> Task:
    return Task(name, prompt, _src(solution), tuple(Test(i, ref(i)) for i in inputs))
