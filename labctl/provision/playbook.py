"""Playbooks: which resources apply to which hosts, validated like the inventory.

    name: seed lab
    plays:
      - hosts: role:cache          # same syntax as --limit
        tags: [cache]
        resources:
          - model_cache: {reserve_gb: 16}
          - cron: {name: facts, schedule: "*/30 * * * *", command: "..."}
            tags: [cron]

Every error names the file, the line and the field, and exits 2.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from labctl.documents.defaults import shown_path
from labctl.documents.loader import open_document
from labctl.documents.suggest import did_you_mean
from labctl.documents.validation import (
    DocumentError,
    Problem,
    dotted,
    fix_the_lines,
    problems_from,
    unknown_key,
)
from labctl.inventory.model import Inventory
from labctl.inventory.select import Selection, select_in_lab
from labctl.output.errors import InputError
from labctl.provision.resource import Params, resource_class, resource_types

PLAY_KEYS = {"name", "hosts", "tags", "resources"}
ENTRY_KEYS = {"name", "tags"}
DEFAULT_PLAYBOOK = Path("playbooks/provision.yaml")


@dataclass
class Entry:
    type_name: str
    params: dict[str, Any]
    tags: list[str]
    line: int | None
    name: str | None = None


@dataclass
class Play:
    hosts: str
    entries: list[Entry] = field(default_factory=list)
    name: str | None = None
    line: int | None = None  # of `hosts:` (of the play when it has none), for selector errors


@dataclass
class Playbook:
    path: Path
    name: str
    plays: list[Play]


def playbook_error(path: Path, problems: list[Problem]) -> DocumentError:
    # -p always: without it, --check would validate the default playbook, not this one
    check = shlex.join(["labctl", "provision", "-p", shown_path(path), "--check"])
    return DocumentError(
        "playbook",
        path,
        problems,
        fix_the_lines(len(problems), f"`{check}` validates without changing anything"),
    )


def _tags(value: Any, loc: tuple[Any, ...], problems: list[Problem], line: int | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return list(value)
    problems.append((line, dotted(loc), "tags must be a list of words, e.g. tags: [cache, cron]"))
    return []


def load_playbook(path: Path | None, inventory_path: Path | None = None) -> Playbook:
    """The playbook `path`; by default playbooks/provision.yaml beside the inventory, else here."""
    if path is None:
        from labctl.documents.defaults import find_default
        from labctl.hosts.context import resolve_inventory_path

        path = find_default(DEFAULT_PLAYBOOK, resolve_inventory_path(inventory_path), "playbook", "-p")
    doc = open_document(
        path, "playbook", f"Pass one with -p, or use the default {DEFAULT_PLAYBOOK}.", playbook_error
    )
    path, pos, problems = doc.path, doc.pos, doc.problems
    registry = resource_types()
    data = doc.mapping("a playbook is a mapping with 'name' and 'plays'")
    for key in data:
        if key not in ("name", "plays"):
            problems.append(
                (pos.line_of((key,)), str(key), f"unknown key '{key}'. Keys allowed here: name, plays.")
            )
    plays: list[Play] = []
    raw_plays = data.get("plays")
    if not isinstance(raw_plays, list) or not raw_plays:
        problems.append(
            (
                pos.line_of(("plays",)),
                "plays",
                "at least one play is required: plays: [{hosts: all, resources: [...]}]",
            )
        )
        raw_plays = []
    for i, raw in enumerate(raw_plays):
        loc: tuple[Any, ...] = ("plays", i)
        if not isinstance(raw, dict):
            problems.append((pos.line_of(loc), dotted(loc), "a play is a mapping with hosts and resources"))
            continue
        for key in raw:
            if key not in PLAY_KEYS:
                problems.append(
                    (pos.line_of((*loc, key)), dotted((*loc, key)), unknown_key(key, sorted(PLAY_KEYS)))
                )
        hosts = raw.get("hosts", "all")
        if not isinstance(hosts, str):
            problems.append(
                (
                    pos.line_of((*loc, "hosts")),
                    dotted((*loc, "hosts")),
                    "hosts is a --limit expression, e.g. hosts: role:cache",
                )
            )
            hosts = "all"
        play = Play(hosts=hosts, name=raw.get("name"), line=pos.line_of((*loc, "hosts")))
        play_tags = _tags(raw.get("tags"), (*loc, "tags"), problems, pos.line_of((*loc, "tags")))
        entries = raw.get("resources")
        if not isinstance(entries, list) or not entries:
            problems.append(
                (
                    pos.line_of((*loc, "resources")),
                    dotted((*loc, "resources")),
                    "a play needs a list of resources, e.g. resources: [{model_cache: {}}]",
                )
            )
            entries = []
        for j, entry in enumerate(entries):
            eloc = (*loc, "resources", j)
            line = pos.line_of(eloc)
            if not isinstance(entry, dict):
                problems.append(
                    (
                        line,
                        dotted(eloc),
                        f"a resource is a mapping such as {{file: {{path: /x, content: y}}}}; types: {', '.join(sorted(registry))}",
                    )
                )
                continue
            types = [k for k in entry if k not in ENTRY_KEYS]
            if len(types) != 1 or types[0] not in registry:
                unknown = [k for k in types if k not in registry]
                hint = did_you_mean(unknown[0], registry) if unknown else ""
                what = (
                    f"unknown resource type '{unknown[0]}'.{hint}"
                    if unknown
                    else "give exactly one resource type per entry."
                )
                problems.append(
                    (
                        pos.line_of((*eloc, unknown[0])) if unknown else line,
                        dotted(eloc),
                        f"{what} Types: {', '.join(sorted(registry))}; other keys: name, tags.",
                    )
                )
                continue
            tname = types[0]
            params = entry[tname] or {}
            ploc = (*eloc, tname)
            if not isinstance(params, dict):
                problems.append(
                    (
                        pos.line_of(ploc),
                        dotted(ploc),
                        f"the parameters of {tname} must be a mapping, e.g. {tname}: {{}}",
                    )
                )
                continue
            model: type[Params] = resource_class(tname).params_model
            try:
                # Validate now for the error positions; each host validates again with its inventory defaults.
                model.model_validate(params)
            except ValidationError as e:
                bad = [err for err in e.errors() if err["type"] != "missing" or tname != "model_cache"]
                if bad:
                    problems.extend(problems_from(e, model, ploc, pos))
                    continue
            tags = play_tags + _tags(
                entry.get("tags"), (*eloc, "tags"), problems, pos.line_of((*eloc, "tags"))
            )
            play.entries.append(Entry(tname, params, tags, line, entry.get("name")))
        plays.append(play)
    doc.finish()
    return Playbook(path=path, name=str(data.get("name") or path.stem), plays=plays)


def parse_tags(value: str | None, label: str) -> set[str]:
    """`--tags a,b` as a set; None is no filter, and an empty term (`''`, `a,,b`) is refused."""
    if value is None:
        return set()
    terms = [t.strip() for t in value.split(",")]
    if not all(terms):
        raise InputError(
            f"{label} {value!r} has an empty term, so it would not say which resources to use.",
            "Name resource types or tags separated by single commas, e.g. --tags model_cache,cron.",
        )
    return set(terms)


def check_tags(book: Playbook, tags: set[str], label: str) -> None:
    """Every tag in `tags` must name a resource type or tag used in `book`: a typo in --tags
    would otherwise select nothing and succeed having done nothing."""
    known = {n for play in book.plays for e in play.entries for n in (e.type_name, *e.tags)}
    unknown = sorted(tags - known)
    if unknown:
        raise InputError(
            f"{label} {', '.join(map(repr, unknown))} matches no resource in {book.path}.",
            f"Resource types and tags there: {', '.join(sorted(known))}.",
        )


def play_selections(book: Playbook, inventory: Inventory) -> list[Selection]:
    """What each play's `hosts:` selects from the whole inventory.

    A term that matches no host is an error, as for --limit: a typo in a playbook must not
    silently shrink the run. Only a role labctl knows that this lab has no host for selects
    nothing without error (the play is skipped, and says why). The whole inventory, not the
    --limit subset, is what a selector must match, so narrowing a run with --limit is never
    an error.
    """
    selections: list[Selection] = []
    problems: list[Problem] = []
    for i, play in enumerate(book.plays):
        try:
            selections.append(select_in_lab(inventory, play.hosts))
        except InputError as e:
            selections.append(Selection([]))
            problems.append((play.line, dotted(("plays", i, "hosts")), e.paragraph()))
    if problems:
        raise playbook_error(book.path, problems)
    return selections


def play_members(book: Playbook, inventory: Inventory) -> list[set[str]]:
    """The names each play's `hosts:` selects (see play_selections)."""
    return [{h.name for h in s.hosts} for s in play_selections(book, inventory)]


def skipped_plays(book: Playbook, inventory: Inventory) -> list[dict[str, Any]]:
    """The plays this lab has no host for, each with why ("no host has role train")."""
    return [
        {"play": i, "name": play.name, "hosts": play.hosts, "line": play.line, "reason": sel.why_empty}
        for i, (play, sel) in enumerate(zip(book.plays, play_selections(book, inventory), strict=True))
        if sel.why_empty
    ]
