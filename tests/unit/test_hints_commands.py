"""Every labctl command that labctl's own messages and hints name is a real command with real
options: collected from the source with ast, checked against the Typer app itself, so a renamed
command or flag breaks this test rather than a user's next attempt.

A command in backticks (`labctl cache sync NAME --host m5`) is checked word by word: each
subcommand exists, each option belongs to that command, and no more arguments than it takes.
A command named in plain prose ("run labctl facts -v") is checked as far as it reads as one.
Docstrings (--help text) are left to typer. Values the code fills in ({host}) and placeholders
in capitals (HOST, RUN) stand for one argument each.
"""

from __future__ import annotations

import ast
import itertools
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main

from labctl.cli.app import app

SRC = Path(__file__).resolve().parents[2] / "labctl"
FILLED = "\x00"  # an f-string's {value}: one word of the hint that the code fills in
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9_]*(?:[|…][A-Z0-9_…]*)*…?|\.\.\.|…)$")


@dataclass(frozen=True)
class Named:
    where: str
    text: str
    quoted: bool  # in backticks: held to every word


def _docstring_ids(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body:
            first = n.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _strings(path: Path) -> Iterator[tuple[int, str]]:
    """Every string literal of `path` but docstrings; an f-string whole, its values as FILLED."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skip = _docstring_ids(tree)
    for n in ast.walk(tree):
        if isinstance(n, ast.JoinedStr):
            skip.update(id(v) for v in n.values)
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            yield n.lineno, n.value
        elif isinstance(n, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) else FILLED for v in n.values]
            yield n.lineno, "".join(str(p) for p in parts)


ROOT: Any = typer.main.get_command(app)
TOP = "|".join(sorted(ROOT.commands, key=len, reverse=True))


def named_commands() -> list[Named]:
    found: list[Named] = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent)
        for line, text in _strings(path):
            flat = " ".join(text.split())
            for m in re.finditer(r"`(labctl(?: [^`]*)?)`", flat):
                found.append(Named(f"{rel}:{line}", m.group(1), True))
            for m in re.finditer(rf"(?<![`\w/.-])labctl (?:{TOP})\b[^`]*", flat):
                found.append(Named(f"{rel}:{line}", m.group(0), False))
    return found


def _words(n: Named) -> list[str]:
    # {run}{storage}: adjacent values may be one word or several, counted as one; a value glued
    # to the end of a flag (--remove-damaged{storage}) adds words the code chose, left unchecked;
    # one inside a word (DIR/{playbook}, {kid}-next) is part of that word
    text = re.sub(f"{FILLED}+", FILLED, n.text)
    if n.quoted:
        text = re.sub(rf"(?<=[A-Za-z]){FILLED}(?=\s|$)", "", text)
    text = re.sub(rf"(?<=\S){FILLED}|{FILLED}(?=\S)", "VALUE", text)
    text = text.replace(FILLED, " VALUE " if n.quoted else "VALUE")
    if n.quoted:
        return shlex.split(text)
    return text.split()


def _option(cmd: Any, word: str) -> Any:
    name = word.split("=", 1)[0]
    for p in cmd.params:
        if p.param_type_name == "option" and name in (*p.opts, *p.secondary_opts):
            return p
    return None


def _takes_value(p: Any) -> bool:
    return not (p.is_flag or p.count)


def check(n: Named) -> str | None:
    """What is wrong with the command `n` names, or None."""
    words = _words(n)
    assert words[0] == "labctl", n
    cmd: Any = ROOT
    path = ["labctl"]
    positional = 0
    i = 1
    while i < len(words):
        w = words[i].rstrip(".,;:)") if not n.quoted else words[i]
        if not w or w == "--":
            return None  # the sentence ends; or the rest is the remote command (exec)
        if w.startswith("-") and len(w) > 1 and not PLACEHOLDER.match(w):
            p = _option(cmd, w)
            if p is None:
                return f"{' '.join(path)} has no option {w.split('=', 1)[0]}"
            if _takes_value(p) and "=" not in w:
                i += 1  # its value; a flag named last is a mention of it (`labctl train --phase`)
        elif hasattr(cmd, "commands") and w in cmd.commands and positional == 0:
            cmd = cmd.commands[w]
            path.append(w)
        elif not n.quoted and not (PLACEHOLDER.match(w) or w == "VALUE"):
            return None  # prose goes on: "labctl sim needs root", "labctl train run X on m5"
        elif hasattr(cmd, "commands") and not getattr(cmd, "invoke_without_command", False):
            if w in ("VALUE", "COMMAND", "...") or "|" in w or not n.quoted:
                return None  # "labctl cron install|list|remove": a family of commands
            return f"{' '.join(path)} has no command {w!r} (it has {', '.join(cmd.commands)})"
        elif w not in ("...", "…"):
            args = [p for p in cmd.params if p.param_type_name == "argument"]
            if not any(p.nargs == -1 for p in args) and positional >= len(args):
                return f"{' '.join(path)} takes {len(args)} argument(s), not {w!r} too"
            positional += 1
        if not n.quoted and i < len(words) and words[i] != words[i].rstrip(".,;:)"):
            return None  # the sentence ends here
        i += 1
    return None


def provision_problem(n: Named) -> str | None:
    """A `labctl provision` hint's --tags must select something in the playbook it runs: the
    shipped one it names with -p, else the default playbooks/provision.yaml."""
    from labctl.provision.playbook import DEFAULT_PLAYBOOK, load_playbook

    words = _words(n)
    if words[:2] != ["labctl", "provision"]:
        return None
    words = [w.rstrip(".,;:)") if not n.quoted else w for w in words]
    opts = dict(itertools.pairwise(words[2:]))
    book = opts.get("-p") or opts.get("--playbook") or str(DEFAULT_PLAYBOOK)
    tags = opts.get("--tags") or opts.get("-t")
    if "VALUE" in book or not tags or "VALUE" in tags:
        return None
    path = SRC.parent / book
    if not path.is_file():
        return f"names the playbook {book}, which labctl does not ship"
    playbook = load_playbook(path)
    known = {t for play in playbook.plays for e in play.entries for t in (e.type_name, *e.tags)}
    unknown = sorted(set(tags.split(",")) - known)
    return f"--tags {','.join(unknown)} selects nothing in {book}" if unknown else None


NAMED = named_commands()


def test_the_collection_finds_the_hints_it_is_for() -> None:
    texts = {n.text for n in NAMED}
    # a backticked command with a filled-in value, and one in prose with options
    assert any(t.startswith("labctl trust ") and "--replace" in t for t in texts), texts
    assert any(t.startswith("labctl provision --tags torch_env --limit") for t in texts), texts
    assert len([n for n in NAMED if n.quoted]) > 50


@pytest.mark.parametrize("named", NAMED, ids=[f"{n.where} {n.text[:40]}" for n in NAMED])
def test_every_command_a_hint_names_exists_with_its_options(named: Named) -> None:
    problem = check(named) or provision_problem(named)
    assert problem is None, f"{named.where}: `{named.text}`: {problem}"


@pytest.mark.parametrize(
    "text, wrong",
    [
        ("labctl cache sync NAME --hostt m5", "no option --hostt"),
        ("labctl cache synch NAME", "no command 'synch'"),
        ("labctl trust VALUE --replaced", "no option --replaced"),
        ("labctl provision --tag cache", "no option --tag"),
        ("labctl ckpt verify RUN", "takes 0 argument"),
    ],
)
def test_the_check_catches_a_renamed_flag_or_command(text: str, wrong: str) -> None:
    problem = check(Named("here", text, True))
    assert problem is not None and wrong in problem, problem


def test_a_provision_hint_must_select_something_in_its_playbook() -> None:
    wrong = provision_problem(Named("here", "labctl provision --tags sandbox --limit VALUE", True))
    assert wrong is not None and "--tags sandbox selects nothing in playbooks/provision.yaml" in wrong
    right = Named("here", "labctl provision -p playbooks/sandbox.yaml --tags sandbox --limit VALUE", True)
    assert provision_problem(right) is None


def test_prose_that_reads_as_a_command_is_checked_too() -> None:
    problem = check(Named("here", "labctl provision --tag torch --limit VALUE) or pass", False))
    assert problem is not None and "--tag" in problem
    assert check(Named("here", "labctl sim needs root to create network namespaces.", False)) is None
