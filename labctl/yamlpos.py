"""YAML that remembers where each value came from, so errors can name file and line.

PyYAML's safe loader silently keeps the last of two equal keys; a duplicated host would
vanish without a word, so duplicate keys are reported here instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Path_ = tuple[str | int, ...]


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
    def __init__(self, line: int | None, column: int | None, problem: str) -> None:
        super().__init__(problem)
        self.line = line
        self.column = column
        self.problem = problem


def load_positioned(text: str) -> PositionedYaml:
    """Parse `text` into plain Python data plus a map from key path to 1-based line."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        raise _syntax_error(e) from None
    except yaml.YAMLError as e:
        raise YamlSyntaxError(None, None, str(e)) from None
    out = PositionedYaml(data=None)
    if node is None:
        return out
    constructor = yaml.SafeLoader("")
    out.lines[()] = node.start_mark.line + 1
    try:
        out.data = _convert(node, (), out, constructor)
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


def _convert(node: yaml.Node, path: Path_, out: PositionedYaml, ctor: yaml.SafeLoader) -> Any:
    if isinstance(node, yaml.MappingNode):
        ctor.flatten_mapping(node)  # resolves `<<: *anchor` merges like the safe loader would
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = ctor.construct_object(key_node, deep=True)
            if isinstance(key, (list, dict)):
                key = str(key)
            child = (*path, key)
            line = key_node.start_mark.line + 1
            if key in result:
                out.duplicates.append(
                    YamlProblem(line, child, f"'{key}' appears twice (first on line {out.lines[child]})")
                )
                continue
            out.lines[child] = line
            result[key] = _convert(value_node, child, out, ctor)
        return result
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            child = (*path, i)
            out.lines[child] = item.start_mark.line + 1
            items.append(_convert(item, child, out, ctor))
        return items
    return ctor.construct_object(node, deep=True)


def read_positioned(path: Path) -> PositionedYaml:
    return load_positioned(path.read_text(encoding="utf-8"))
