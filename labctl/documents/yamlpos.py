"""YAML that remembers where each value came from, so errors can name file and line.

PyYAML's safe loader silently keeps the last of two equal keys; a duplicated host would
vanish without a word, so duplicate keys are reported here instead.

Every document labctl reads is written by hand and small, so anything that is not plain
data is refused with its line rather than built: aliases that expand past `MAX_VALUES`
values (an "alias bomb" grows memory without bound, since each use is a copy here),
nesting deeper than Python can follow, `.inf`/`.nan` (no setting means them, and JSON
cannot carry them) and keys that are themselves lists or mappings. A number written with a
leading zero (`0644`) stays text, so a mode is read as written, not as YAML 1.1's octal.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Path_ = tuple[str | int, ...]
MAX_VALUES = 100_000


@dataclass
class YamlProblem:
    line: int
    path: Path_
    message: str


@dataclass
class PositionedYaml:
    data: Any
    lines: dict[Path_, int] = field(default_factory=dict)
    duplicates: list[YamlProblem] = field(default_factory=list)

    def line_of(self, path: Path_) -> int | None:
        """The line of `path`, or of its nearest ancestor that has one."""
        p = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return self.lines.get((), None)


class YamlSyntaxError(Exception):
    """The text is not a document labctl can use; `hint` says what to write instead, when
    the usual advice (indentation, quoting) does not apply."""

    def __init__(self, line: int | None, column: int | None, problem: str, hint: str = "") -> None:
        super().__init__(problem)
        self.line = line
        self.column = column
        self.problem = problem
        self.hint = hint


@dataclass
class _Walk:
    built: int = 0
    alias_line: int | None = None  # where the outermost alias being expanded is used
    seen: set[int] = field(default_factory=set)
    merged: dict[int, int] = field(default_factory=dict)  # mapping node -> how many pairs `<<` merged in


def load_positioned(text: str) -> PositionedYaml:
    """Parse `text` into plain Python data plus a map from key path to 1-based line."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        raise _syntax_error(e) from None
    except yaml.YAMLError as e:
        raise YamlSyntaxError(None, None, str(e)) from None
    except RecursionError:
        raise _too_deep(None) from None
    out = PositionedYaml(data=None)
    if node is None:
        return out
    constructor = yaml.SafeLoader("")
    out.lines[()] = node.start_mark.line + 1
    try:
        out.data = _convert(node, (), out, constructor, _Walk())
    except RecursionError:
        raise _too_deep(node.start_mark.line + 1) from None
    except yaml.constructor.ConstructorError as e:
        # Composing succeeded but a value cannot be built: `hosts: !m6` reads as a YAML tag.
        err = _syntax_error(e)
        err.problem += " (a value starting with ! is a YAML tag: quote it, e.g. '!m6')"
        raise err from None
    return out


def _syntax_error(e: yaml.MarkedYAMLError) -> YamlSyntaxError:
    mark = e.problem_mark or e.context_mark
    problem = " ".join(p for p in (e.context, e.problem) if p) or str(e)
    return YamlSyntaxError(mark.line + 1 if mark else None, mark.column + 1 if mark else None, problem)


def _too_deep(line: int | None) -> YamlSyntaxError:
    return YamlSyntaxError(
        line, None, "the values are nested too deeply to read", "Write the document with less nesting."
    )


def _convert(node: yaml.Node, path: Path_, out: PositionedYaml, ctor: yaml.SafeLoader, walk: _Walk) -> Any:
    walk.built += 1
    if walk.built > MAX_VALUES:
        raise YamlSyntaxError(
            walk.alias_line,
            None,
            f"the document expands to more than {MAX_VALUES:,} values (aliases such as *name copy what they "
            "name, and aliases of aliases multiply)",
            "Write the values out, or use fewer nested aliases.",
        )
    outermost = walk.alias_line is None and id(node) in walk.seen
    if outermost:
        walk.alias_line = out.line_of(path)
    walk.seen.add(id(node))
    try:
        return _build(node, path, out, ctor, walk)
    finally:
        if outermost:
            walk.alias_line = None


def _build(node: yaml.Node, path: Path_, out: PositionedYaml, ctor: yaml.SafeLoader, walk: _Walk) -> Any:
    if isinstance(node, yaml.MappingNode):
        if id(node) not in walk.merged:
            own = sum(k.tag != "tag:yaml.org,2002:merge" for k, _ in node.value)
            ctor.flatten_mapping(node)  # resolves `<<: *anchor` merges like the safe loader would
            walk.merged[id(node)] = len(node.value) - own  # merged pairs come first
        merged = walk.merged[id(node)]
        result: dict[Any, Any] = {}
        from_merge: set[Any] = set()
        for i, (key_node, value_node) in enumerate(node.value):
            if not isinstance(key_node, yaml.ScalarNode):
                raise YamlSyntaxError(
                    key_node.start_mark.line + 1,
                    key_node.start_mark.column + 1,
                    "a key here is a list or a mapping",
                    "Write each key as a plain word, e.g. name: value.",
                )
            key = ctor.construct_object(key_node, deep=True)
            child = (*path, key)
            line = key_node.start_mark.line + 1
            if key in from_merge:
                from_merge.discard(key)  # a key written here (or merged later) wins over a merged one
            elif key in result:
                out.duplicates.append(
                    YamlProblem(line, child, f"'{key}' appears twice (first on line {out.lines[child]})")
                )
                continue
            if i < merged:
                from_merge.add(key)
            out.lines[child] = line
            result[key] = _convert(value_node, child, out, ctor, walk)
        return result
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            child = (*path, i)
            # An alias's node carries the anchor's position; where it is used is this list's line.
            out.lines[child] = (
                item.start_mark.line + 1 if id(item) not in walk.seen else out.line_of(path) or 0
            )
            items.append(_convert(item, child, out, ctor, walk))
        return items
    if node.tag == "tag:yaml.org,2002:int" and re.fullmatch(r"[-+]?0[0-7_]+", node.value):
        # YAML 1.1 reads 0644 as octal 420, which then looks like the mode 0o420; the text
        # keeps what was written, and the field it goes to reads it as it means it.
        return node.value
    try:
        value = ctor.construct_object(node, deep=True)
    except ValueError:  # an integer of thousands of digits: Python refuses to read it
        raise YamlSyntaxError(
            node.start_mark.line + 1,
            node.start_mark.column + 1,
            "this number has too many digits to be a setting",
            "Write the number the setting needs.",
        ) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise YamlSyntaxError(
            node.start_mark.line + 1,
            node.start_mark.column + 1,
            f"{node.value} is not a number labctl can use",
            "Write a finite number (or quote it, where text is meant).",
        )
    return value


def read_positioned(path: Path) -> PositionedYaml:
    return load_positioned(path.read_text(encoding="utf-8"))
