"""How phase 3 takes the program out of a model's answer (labctl/agent/models/prompting.py
program_of): the shapes real instruct and completion models write, one case each, and that what
it takes is the program the sandbox would run."""

from __future__ import annotations

import pytest

from labctl.agent.models.prompting import program_of

CODE = "n = int(input())\nprint(n * 2)\n"


@pytest.mark.parametrize(
    ("answer", "program"),
    [
        # A completion model continues the prompt's comments with code, then closes a fence it
        # never opened and explains.
        (CODE + "```\n\nThis reads n and prints twice n.\n", CODE),
        (CODE + "```\nExample:\n```\n3\n```\n", CODE),
        # Opening fences as models write them.
        ("Here it is:\n``` python\n" + CODE + "```\n", CODE),
        ("```Python\n" + CODE + "```", CODE),
        ("```py\n" + CODE + "```\nDone.", CODE),
        ("```python3\n" + CODE + "```", CODE),
        ("  ```python\n" + CODE + "  ```\n", CODE),  # indented, as in a list item
        ("~~~python\n" + CODE + "~~~\n", CODE),
        ("```{.python}\n" + CODE + "```\n", CODE),
        # A sample input first: labelled, or unlabelled and no program (numbers compile too).
        ("Input:\n```text\n3\n```\nSolution:\n```python\n" + CODE + "```\n", CODE),
        ("```input\n3 4\n```\n```\n" + CODE + "```\n", CODE),
        ("```console\n$ python3 sol.py\n```\n```\n" + CODE + "```\n", CODE),
        ("For the input\n```\n3\n1 2 3\n```\nthis prints 6:\n```\n" + CODE + "```\n", CODE),
        ("```\n5\n```\n```\n" + CODE + "```\n", CODE),
        # Several blocks: the first Python one.
        (
            "```bash\npip install nothing\n```\n```python\nprint(1)\n```\n```python\nprint(2)\n```\n",
            "print(1)\n",
        ),
        ("```\nprint(1)\n```\nor shorter:\n```\nprint(2)\n```\n", "print(1)\n"),
        # A longer fence holds a shorter one (a block that shows markdown).
        ("````python\ns = '''\n```\n'''\nprint(s)\n````\n", "s = '''\n```\n'''\nprint(s)\n"),
        # No fence: the whole answer, as it came.
        ("  " + CODE, "  " + CODE),
        ("I cannot solve this.", "I cannot solve this."),
        # Cut off inside its fence (max_tokens ran out): what is there.
        ("Sure:\n```python\nn = int(input())\nprint(n *", "n = int(input())\nprint(n *"),
        ("```\ndef f(:\n", "def f(:\n"),  # unlabelled and no program, but the only block
        ("```text\n3\n```\n```python\nfor i in range(", "for i in range("),
        # Windows line ends.
        ("```python\r\nprint(1)\r\n```\r\nDone", "print(1)\r\n"),
        # No Python anywhere: the first unlabelled block, else the whole text.
        ("```c\nint main() {}\n```\n", "```c\nint main() {}\n```\n"),
        ("```c\nint x;\n```\n```\nnot python at all\n```\n", "not python at all\n"),
    ],
)
def test_the_program_is_taken_from_each_shape_of_answer(answer: str, program: str) -> None:
    assert program_of(answer) == program


def test_prose_that_happens_to_compile_before_a_fence_is_not_taken_for_code() -> None:
    """A bare fence after text closes code only when that text is a program: a word, a number or
    an annotation-looking line ("Answer: 42") compiles too, and is prose."""
    for prose in ("Solution\n", "42\n", "Answer: 42\n", "Note: this\n", "\n\n"):
        assert program_of(prose + "```\n" + CODE + "```\n") == CODE


def test_the_cases_phase3_already_read_are_read_the_same() -> None:
    assert program_of("Here:\n```python\nprint(1)\n```\nDone") == "print(1)\n"
    assert program_of("```\nprint(2)\n") == "print(2)\n"
    assert program_of("print(3)") == "print(3)"


def test_a_program_with_warnings_or_nul_bytes_is_read_quietly(recwarn: pytest.WarningsRecorder) -> None:
    assert program_of('```\nimport re\nprint(re.findall("\\d", input()))\n```') == (
        'import re\nprint(re.findall("\\d", input()))\n'
    )
    assert program_of("```\nprint(1)\x00\n```\n```python\nprint(2)\n```") == "print(2)\n"
    assert not [w for w in recwarn if issubclass(w.category, (SyntaxWarning, DeprecationWarning))]
