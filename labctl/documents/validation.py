"""Validating a YAML document (inventory, playbook, phases file, ...) the same way everywhere:
the steps that `labctl.documents.loader`'s pipeline is made of.

A document is read with line numbers (`read_document`), checked into a list of problems
`(line, dotted field, message)` (`problems_from` turns a pydantic ValidationError into them,
with "did you mean" for unknown keys), and every problem is reported at once by one
`DocumentError`, so one edit fixes them all:

    The playbook playbooks/provision.yaml has 1 problem:
      playbooks/provision.yaml:4: plays[0].resources[0]: unknown resource type ...

pydantic and yaml are imported inside the functions: the CLI imports this module's callers
lazily, and `labctl --help` must stay fast.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from labctl.documents.suggest import did_you_mean
from labctl.output.errors import InputError

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

    from labctl.documents.yamlpos import PositionedYaml

Problem = tuple[int | None, str, str]
"""(line or None, dotted field or "", what is wrong and what to write instead)."""


class Positions(Protocol):
    def line_of(self, path: tuple[Any, ...]) -> int | None: ...


class DocumentError(InputError):
    """Every problem of one document, each as FILE:LINE: FIELD: message. Exit code 2."""

    def __init__(self, kind: str, path: Path, problems: Sequence[Problem], hint: str) -> None:
        self.kind = kind
        self.path = path
        self.problems = list(problems)
        n = len(self.problems)
        lines = "\n  ".join(problem_line(path, p) for p in self.problems)
        super().__init__(f"The {kind} {path} has {n} problem{'s' if n != 1 else ''}:\n  {lines}", hint)


def problem_line(path: Path, problem: Problem) -> str:
    line, fld, msg = problem
    return f"{path}{f':{line}' if line else ''}: {fld + ': ' if fld else ''}{msg}"


def fix_the_lines(n: int, then: str) -> str:
    """The usual DocumentError hint: fix the line(s), then `then` (how to check again safely)."""
    return f"Fix the line{'s' if n != 1 else ''} named above; {then}."


def read_document(path: Path, kind: str, missing_hint: str) -> PositionedYaml:
    """Read a YAML document that is validated next; missing, unreadable or unparsable is one InputError."""
    from labctl.documents.yamlpos import YamlSyntaxError, read_positioned

    if not path.exists():
        raise InputError(f"No {kind} at {path}.", missing_hint)
    try:
        return read_positioned(path)
    except YamlSyntaxError as e:
        where = f":{e.line}" + (f":{e.column}" if e.column else "") if e.line else ""
        if e.hint:
            raise InputError(f"{path}{where}: {e.problem}.", e.hint) from None
        raise InputError(
            f"{path}{where}: the YAML does not parse: {e.problem}.",
            "Check the indentation and quoting on that line (a tab, an unclosed quote or bracket, "
            "or a missing ':' are the usual causes).",
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(
            f"Cannot read the {kind} {path}: {e}.", "Check the file exists and is UTF-8 text."
        ) from None


def duplicate_problems(pos: PositionedYaml) -> list[Problem]:
    """The keys written twice in a mapping (PyYAML would silently keep the last)."""
    return [(d.line, dotted(d.path), d.message + "; keep one") for d in pos.duplicates]


def path_component(name: str, what: str, example: str) -> str:
    """`name` when it can be one path component under a folder of labctl's (a model, a run, a
    job ...); else an InputError (exit 2) naming `what` and `example`, a command or value that
    works. The rule is labctl/agent/core/paths.py's, which the agent applies again on the host."""
    from labctl.agent.core.paths import component_problem

    problem = component_problem(name)
    if problem:
        raise InputError(
            f"{what} {name!r} cannot be a file or folder name: {problem}.",
            f"Give one plain name (no '/' or '\\', not '.' or '..', no control characters), e.g. {example}.",
        )
    return name


def dotted(path: tuple[Any, ...]) -> str:
    """('hosts', 'm5', 'gpus', 0, 'model') -> 'hosts.m5.gpus[0].model'."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def unknown_key(key: Any, allowed: Sequence[str]) -> str:
    hint = did_you_mean(key, allowed)
    return f"unknown key '{key}'.{hint} Keys allowed here: {', '.join(allowed)}."


def problems_from(
    exc: ValidationError,
    model: type[BaseModel],
    base: tuple[Any, ...] = (),
    pos: Positions | None = None,
) -> list[Problem]:
    """One problem per pydantic error; `base` is where `model`'s data sits in the document.

    Without `pos` (values from the command line) the problems have no line.
    """
    out: list[Problem] = []
    for err in exc.errors():
        # A mapping's key that fails is reported at the key itself (pydantic adds "[key]").
        loc = tuple(p for p in err["loc"] if p != "[key]")
        full = (*base, *loc)
        out.append((pos.line_of(full) if pos else None, dotted(full), friendly(err, model, loc)))
    return out


def friendly(err: Any, model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """A pydantic error as what is wrong and, from the field's description, what to write instead."""
    kind = err["type"]
    owner = model_at(model, loc) if loc else model
    key = next((p for p in reversed(loc) if isinstance(p, str)), "")
    if kind == "extra_forbidden":
        return unknown_key(key, list(owner.model_fields))
    field = owner.model_fields.get(str(key))
    desc = field.description if field is not None and field.description else ""
    if kind == "missing":
        return f"'{key}' is required." + (f" Write {desc}." if desc else "")
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    got = err.get("input")
    # A field that may hold a secret by mistake (a key pasted where its variable's name goes, a
    # password in a URL) declares hide_input: the error must not carry it into a terminal or a log.
    extra = field.json_schema_extra if field is not None else None
    hidden = isinstance(extra, dict) and bool(extra.get("hide_input"))
    shown = "" if hidden or isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
    return f"{msg}{shown}." + (f" Write {desc}." if desc else "")


def model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel]:
    """The model that owns the last key of `loc`, walking nested fields."""
    from pydantic import BaseModel

    current = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(str(part))
        if field is None:
            break
        inner = unwrap(field.annotation)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            current = inner
    return current


def unwrap(annotation: Any) -> Any:
    """The model class inside Optional[...]/list[...]/dict[str, ...]/Annotated[...], if any."""
    from pydantic import BaseModel

    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, list, dict):
        for arg in typing.get_args(annotation):
            found = unwrap(arg)
            if isinstance(found, type) and issubclass(found, BaseModel):
                return found
        return None
    return annotation
