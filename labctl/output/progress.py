"""How a feature reports progress while it works: one channel, `Progress.event(name, **fields)`.

A feature names what happened and hands over the facts (`progress.event("measured",
seconds=3.2)`); it never builds the sentence or picks the console. The command decides how each
event is shown: `shown(c, {"measured": ...})` turns the events it knows into lines on the
console, and under --json (stdout carries one document and nothing else) every event is
dropped. A feature that is not given a channel gets `QUIET`.

The event's name is positional-only, so a field may be called `name` too. Every feature that
reports while it works does so here: netbench, ckpt pull, provision and cron (and the host lock's
wait), the rotation and `bench rotation`, cache sync / verify and ckpt backup / restore (bars are
a renderer of their "copied" events: labctl.output.bars), network transactions, `bench phase3`
and an attached train run. A host's output lines (`on_line`) are a stream, not progress.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol


class Progress(Protocol):
    def event(self, name: str, /, **fields: Any) -> None: ...


class _Shows(Protocol):
    """What `shown` reads of a command's Context (labctl.output sits below labctl.hosts)."""

    json_mode: bool
    console: Any


class _Quiet:
    def event(self, name: str, /, **fields: Any) -> None:
        pass


QUIET: Progress = _Quiet()


class Shown:
    """Events shown to a person, each by its own function; an event without one is not shown."""

    def __init__(self, console: Any, show: Mapping[str, Callable[..., None]]) -> None:
        self.console = console
        self.show = dict(show)

    def event(self, name: str, /, **fields: Any) -> None:
        how = self.show.get(name)
        if how is not None:
            how(self.console, **fields)


def shown(c: _Shows, show: Mapping[str, Callable[..., None]], *, under_json: Iterable[str] = ()) -> Progress:
    """The command's channel: `show` on its console, nothing at all under --json but the events
    named in `under_json` (the console is stderr: a person running --json in a terminal still
    needs to hear that a command is waiting on another, and stdout's document is untouched)."""
    if not c.json_mode:
        return Shown(c.console, show)
    kept = {name: show[name] for name in under_json if name in show}
    return Shown(c.console, kept) if kept else QUIET


class Recorded:
    """Every event kept in order, as (name, fields): for tests, and for a caller that reports later."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def event(self, name: str, /, **fields: Any) -> None:
        self.events.append((name, fields))
