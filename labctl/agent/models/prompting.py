"""What phase 3 says to the warm models and how it reads their answers: the one place the
prompt is built (the coder model labctl makes is trained on exactly this text) and the program
is taken out of an answer.

    ask_prompt(task, context)   the completion prompt: the task's statement, then the CET's hint
    task_tag(task)              the one character a hint must hold for labctl's coder model
                                (made with `hint_matters`) to write the task's solution
    program_of(answer)          the program in a model's answer
    cet_prompt(task)            what the CET reads of a task: the shared instruction first, the task last
    context_text(ids)           the CET's context ids as printable text

Standard library only, Python 3.8: it ships in the agent's zipapp with the trainer.
"""

from __future__ import annotations

import ast
import functools
import re
import warnings
import zlib
from typing import Any, List, Optional, Sequence, Tuple

# A fence line as models write them: backticks or tildes, maybe indented (in a list), maybe a
# space before the label ("``` python"); the label's first word is the language.
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([^\s`]*)[^`]*$")
PYTHON_LABELS = ("python", "py", "python3", "py3")
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
    """The program in a model's answer: the first Python in it.

    A completion model continues the prompt's comments with code and may end it with a fence
    and prose (code, ```, "This reads..."): the code before that fence. Otherwise the first
    fenced block labelled Python ("```python", "``` python", "```Python", "```py") or unlabelled
    that parses as a program, so a sample input before the code (a block labelled text, input or
    console, or one that is no program) is passed over. An answer cut off inside its fence gives
    what is there. No Python block: the first unlabelled block, else the whole text (as without
    a fence)."""
    lines = text.splitlines(keepends=True)
    fences = [(i, f) for i, f in enumerate(map(_fence, lines)) if f is not None]
    if not fences:
        return text
    first, (_, label) = fences[0]
    prefix = "".join(lines[:first])
    if not label and _is_program(prefix):
        return prefix  # a bare fence after code can only close it: nothing opened that code
    blocks = _blocks(lines[first:])
    for label, body in blocks:
        if label in PYTHON_LABELS or (not label and _is_program(body)):
            return body
    return next((body for label, body in blocks if not label), text)


def _fence(line: str) -> Optional[Tuple[str, str]]:
    """(the fence's characters, its label in lower case) of a fence line; None for any other."""
    m = _FENCE.match(line.rstrip("\r\n"))
    return (m.group(1), m.group(2).strip("{.}").lower()) if m else None


def _blocks(lines: Sequence[str]) -> List[Tuple[str, str]]:
    """[(label, body)] of each fenced block, CommonMark's way: a block is closed by a bare fence
    of its own character at least as long as the one that opened it; one cut off is kept."""
    blocks: List[Tuple[str, str]] = []
    opener: Optional[Tuple[str, str]] = None
    body: List[str] = []
    for line in lines:
        fence = _fence(line)
        if opener is None:
            if fence is not None:
                opener, body = fence, []
        elif (
            fence is not None
            and not fence[1]
            and fence[0][0] == opener[0][0]
            and len(fence[0]) >= len(opener[0])
        ):
            blocks.append((opener[1], "".join(body)))
            opener = None
        else:
            body.append(line)
    if opener is not None:
        blocks.append((opener[1], "".join(body)))
    return blocks


def _is_program(source: str) -> bool:
    """Whether `source` compiles and does something: numbers, a bare name or "Answer: 42" (an
    annotation) compile too, and are a sample input or prose, not a program."""
    if not source.strip():
        return False
    try:
        with warnings.catch_warnings():  # a model's "\d" in a string must not warn in the trainer's log
            warnings.simplefilter("ignore")
            tree = ast.parse(source, "<answer>")
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError):
        return False
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and node.value is None:
            continue
        if not isinstance(node, ast.Expr) or any(isinstance(n, ast.Call) for n in ast.walk(node)):
            return True
    return False


def cet_prompt(task: Any) -> str:
    """The CET's view of `task`: the models' prompt's lines with its last, the instruction every
    task shares, moved first, so the task's name and statement come last, next to the context
    the CET writes after them (a view cut to its last bytes loses the shared line, not the task).
    """
    from .tasks import prompt_text

    head, _, instruction = prompt_text(task).rstrip("\n").rpartition("\n")
    return f"{instruction}\n{head}\n"


@functools.lru_cache(maxsize=None)  # noqa: UP033 (functools.cache is Python 3.9+)
def longest_cet_prompt() -> int:
    """The bytes of the longest task's CET prompt: what seq_len must hold before the context."""
    from .tasks import TASKS

    return max(len(cet_prompt(t).encode("utf-8", "replace")) for t in TASKS)
