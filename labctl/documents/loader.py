"""The one pipeline every YAML document a user writes goes through (inventory, playbook,
orchestra file, plan file, alerts file, phases file):

    doc = open_document(path, "playbook", missing_hint, playbook_error)  # 1. read, 2. parse
    data = doc.mapping("a playbook is a mapping with 'name' and 'plays'")  # 3. its shape
    doc.check(Params, raw, ("plays", 0, ...))  # 4. keys and values, into doc.problems
    doc.finish()  # 5. every problem at once: one DocumentError, FILE:LINE: FIELD: message

1-2 are `read_document` (missing, unreadable or unparsable is one InputError naming file:line);
the duplicate keys the parse found are the first problems. A document that is one pydantic
model goes through `load_model`. Each loader keeps only what is its own: the checks of 4 and
the DocumentError (its kind and hint) that `error` builds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from labctl.documents.validation import (
    DocumentError,
    Problem,
    dotted,
    duplicate_problems,
    fix_the_lines,
    problems_from,
    read_document,
)

if TYPE_CHECKING:
    from pydantic import BaseModel

    from labctl.documents.yamlpos import PositionedYaml

M = TypeVar("M", bound="BaseModel")
ErrorFor = Callable[[Path, list[Problem]], DocumentError]
"""How a document reports its problems: (path, problems) -> the DocumentError to raise."""


@dataclass
class Document:
    """A document read with positions, and the problems found in it so far."""

    path: Path
    pos: PositionedYaml
    error: ErrorFor
    problems: list[Problem] = field(default_factory=list)

    @property
    def data(self) -> Any:
        return self.pos.data

    def line_of(self, loc: tuple[Any, ...]) -> int | None:
        return self.pos.line_of(loc)

    def add(self, loc: tuple[Any, ...], message: str) -> None:
        """A problem at `loc`, named by its dotted field."""
        self.problems.append((self.pos.line_of(loc), dotted(loc), message))

    def mapping(self, shape: str, line: int | None = 1) -> dict[Any, Any]:
        """The top level, which must be a mapping; else the one problem `shape` (what it must be)."""
        if not isinstance(self.data, dict):
            raise self.error(self.path, [(line, "", shape)])
        return self.data

    def check(self, model: type[M], raw: Any, loc: tuple[Any, ...] = ()) -> M | None:
        """`raw` (found at `loc`) validated as `model`; None, its problems noted, when it is not."""
        from pydantic import ValidationError

        try:
            return model.model_validate(raw)
        except ValidationError as e:
            self.problems.extend(problems_from(e, model, loc, self.pos))
            return None

    def parse(self, model: type[M]) -> M:
        """The whole document as `model`; when it is not one, stop here with every problem so far."""
        parsed = self.check(model, self.data)
        if parsed is None:
            raise self.error(self.path, self.problems)
        return parsed

    def finish(self) -> None:
        """Raise the one DocumentError naming every problem found, if any."""
        if self.problems:
            raise self.error(self.path, self.problems)


def open_document(path: Path, kind: str, missing_hint: str, error: ErrorFor) -> Document:
    """The document of `kind` at `path`, read and parsed; its duplicate keys are its first problems."""
    path = Path(path)
    pos = read_document(path, kind, missing_hint)
    return Document(path, pos, error, duplicate_problems(pos))


def load_model(path: Path, kind: str, model: type[M], *, missing_hint: str, shape: str, then: str) -> M:
    """A YAML mapping document of `kind` read and validated against `model`, every problem at
    once (one DocumentError, exit 2). `shape` says what the top level must be, `then` how to
    check again once fixed."""

    def error(at: Path, found: list[Problem]) -> DocumentError:
        return DocumentError(kind, at, found, fix_the_lines(len(found), then))

    doc = open_document(path, kind, missing_hint, error)
    doc.mapping(shape)
    parsed = doc.parse(model)
    doc.finish()
    return parsed
