"""Shell text that labctl writes for a host: command lines and scripts are built with these helpers.

A value is always quoted. A variable's name cannot be quoted (`'A;B'=1` is a command, not an
assignment), so it must be a name the shell reads as one: ASCII letters, digits and '_', not
starting with a digit. A name that is not is refused before any text is built, so a crafted
name in a phases file can never run on a host. Documents check names where they are read
(`env_name_problem` in their validators), so the user hears of it with the file and line.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping

from labctl.output.errors import InputError

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
ENV_HINT = (
    "Write names of ASCII letters, digits and '_' that do not start with a digit, e.g. NCCL_IB_DISABLE."
)


def env_name_problem(name: object) -> str | None:
    """Why `name` cannot be an environment variable's name in a shell line, or None."""
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        return (
            "not an environment variable name: use ASCII letters, digits and '_', "
            "not starting with a digit (e.g. NCCL_IB_DISABLE)"
        )
    return None


def env_value_problem(value: object) -> str | None:
    """Why `value` cannot be an environment variable's value, or None (quoting covers the rest)."""
    if not isinstance(value, str):
        return "not text"
    if "\0" in value:
        return "a value with a NUL character, which no environment variable can hold"
    return None


def check_env(env: Mapping[str, str], what: str = "the environment") -> Mapping[str, str]:
    """`env` when every name and value can go into a shell line; else an InputError naming them."""
    for name, value in env.items():
        problem = env_name_problem(name)
        shown = name
        if problem is None:
            problem, shown = env_value_problem(value), value
        if problem:
            raise InputError(f"In {what}, {shown!r} is {problem}.", ENV_HINT)
    return env


def quote(value: str) -> str:
    """One word of shell text, whatever `value` holds."""
    return shlex.quote(value)


def command_line(argv: Iterable[str]) -> str:
    """`argv` as one shell line, each word quoted."""
    return shlex.join(argv)


def split_words(text: str, what: str) -> list[str]:
    """`text` split into words as a shell reads them (the reverse of `command_line`); an
    InputError naming `what` for text a shell would not read (an unclosed quote)."""
    try:
        return shlex.split(text)
    except ValueError as e:
        raise InputError(
            f"{what} {text!r} does not split into words: {e}.",
            "Close the quote, e.g. --script-args \"--data '/srv/my data'\".",
        ) from None


def env_assignments(env: Mapping[str, str], what: str = "the environment") -> str:
    """`NAME=value NAME2=value2` (values quoted) for `env COMMAND` or a prefix, in `env`'s order."""
    check_env(env, what)
    return " ".join(f"{name}={quote(value)}" for name, value in env.items())


def export_lines(env: Mapping[str, str], what: str = "the environment") -> list[str]:
    """`export NAME=value`, one line per variable, in `env`'s order (a job script's preamble)."""
    check_env(env, what)
    return [f"export {name}={quote(value)}" for name, value in env.items()]
