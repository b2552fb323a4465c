"""Small programming tasks with tests: what phase 3's models are asked to write.

In phase 3 a language model writes a Python program for a task, the sandbox service runs it
against the task's tests (`Task.as_program` is one entry of its batch), and the reward is the
share of tests it passes. The model sees only `prompt_text(task)`: the task's name and its
statement as comment lines, then one line asking for a program that reads stdin and prints
the answer. It never sees the tests.

The tasks come from families with a parameter or two (Caesar shift by 3 or by 13, FizzBuzz
with other divisors), so the set stays compact. Each family has a reference function from
stdin text to stdout text; every test's `expect` is that function's answer on the test's
input, never typed by hand. `solution` is a separate program, what a correct model would
write; the unit tests run it against every test, so the two cannot drift apart. Outputs are
integers, words and yes/no, never unformatted floats, so one answer is exactly right.

The modules, split by what a task reads so that none nears the 800-line limit as families
are added:

- `base`: `Task`, `Test`, `prompt_text` and the helpers the families are written with;
- `integers`: families whose input is one integer or a few (primes, Fibonacci, calendar...);
- `lists`: families whose input is a line or a grid of integers (sorting, matrices...), and
  the seeded random inputs;
- `strings`: families whose input is text (palindromes, Caesar, brackets...).

Each family is one function returning its tasks; `_FAMILIES` below sets their order.

Standard library only, Python 3.8, and no data files: this package ships inside the agent's
zipapp (labctl/hosts/agent_ship.py packs every .py under labctl/agent).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Tuple

from . import integers, lists, strings
from .base import Task, Test, prompt_text

__all__ = ["TASKS", "Task", "Test", "prompt_text", "task"]

# The order the set has always had, families interleaved: phase 3 takes the tasks in turn by
# index, and the bench takes the first ones, so reordering would change what a step asks.
_FAMILIES: Tuple[Callable[[], List[Task]], ...] = (
    integers.arithmetic,
    lists.aggregates,
    strings.reverse,
    strings.vowels,
    lists.extremes,
    integers.fizzbuzz,
    integers.primes,
    integers.gcd_lcm,
    integers.factorials,
    integers.fibonacci,
    lists.sorting,
    strings.words,
    strings.palindromes,
    integers.binary,
    integers.temperatures,
    strings.caesar,
    strings.run_length,
    integers.digits,
    strings.word_pairs,
    strings.case,
    strings.word_counts,
    lists.second_extremes,
    lists.matrices,
    strings.brackets,
    integers.calendar,
    integers.collatz,
    integers.number_theory,
    strings.characters,
)

TASKS: Tuple[Task, ...] = tuple(t for family in _FAMILIES for t in family())
_BY_NAME: Dict[str, Task] = {x.name: x for x in TASKS}


def task(name: str) -> Task:
    """The task called `name`; KeyError naming it if there is none."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no task named {name!r} (there are {len(TASKS)}, e.g. {TASKS[0].name!r})") from None
