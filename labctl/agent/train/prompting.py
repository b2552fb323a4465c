"""What phase 3 says to the warm models and how it reads their answers: the one place the
prompt is built (the coder model labctl makes is trained on exactly this text) and the program
is taken out of an answer.

    ask_prompt(task, context)   the completion prompt: the task's statement, then the CET's hint
    task_tag(task)              the one character a hint must hold for labctl's coder model
                                (made with `hint_matters`) to write the task's solution
    program_of(answer)          the program in a model's answer
    context_text(ids)           the CET's context ids as printable text

Standard library only, Python 3.8: it ships in the agent's zipapp with the trainer.
"""

from __future__ import annotations

import re
import zlib
from typing import Any, Sequence

_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)(?:```|\Z)", re.S)
HINT = "# Hint: "
# The characters a task's tag is drawn from: lower-case letters, which the CET's byte vocabulary
# samples like any other printable byte (a random context of 16 bytes holds a given one about
# 15% of the time).
TAGS = "abcdefghijklmnopqrstuvwxyz"


def context_text(ids: Sequence[int]) -> str:
    """The CET's context as text for the models: printable ASCII kept, anything else a '?'."""
    return "".join(chr(i) if 32 <= i < 127 else "?" for i in ids)


def ask_prompt(task: Any, context: str) -> str:
    """The completion prompt a warm model continues: the task's statement, then the hint line."""
    from .tasks import prompt_text

    return prompt_text(task) + HINT + context + "\n"


def task_tag(task: Any) -> str:
    """The task's tag: one letter, fixed by its name (crc32, not hash(): the same in every process)."""
    return TAGS[zlib.crc32(str(task.name).encode("utf-8")) % len(TAGS)]


def program_of(text: str) -> str:
    """The program in a model's answer: the first fenced block when there is one, else all."""
    m = _FENCE.search(text)
    return m.group(1) if m else text
