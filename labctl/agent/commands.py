"""The agent's command table: name -> handler(args: dict) -> dict, merged from every feature's
host package (`labctl/agent/<feature>/__init__.py` declares its COMMANDS).

Each handler declares what it takes and what it answers with `@command` (core/spec.py), next
to its code. `call` checks a command's args against it once, before the handler runs, so a
missing, unknown or wrongly typed argument is refused as bad_args naming the command and the
argument; `answer_problem` is the controller's check of an answer against the declared shape.

A handler is either a callable or a "module:function" string relative to this package; the
string form is imported only when that command runs, so a heavy or broken module for one
command (bench, load) never slows down or breaks another (ping, facts).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from typing import Any, Callable, Dict, Optional, Union

from . import (
    AGENT_VERSION,
    cache,
    ckpt,
    cron,
    facts,
    modelload,
    monitor,
    netbench,
    network,
    orchestra,
    provision,
    sandbox,
    train,
)
from .core import registry, spec
from .core.errors import AgentError
from .core.spec import command

Handler = Callable[[Dict[str, Any]], Dict[str, Any]]


@command(
    takes={},
    answers={"agent_version?": "any", "python_version?": "str", "pid?": "int", "time": "time"},
)
def ping(args: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "agent_version": AGENT_VERSION,
        "python_version": platform.python_version(),
        "python": sys.executable,
        "pid": os.getpid(),
        # Read against the controller's clock around the call: `labctl doctor`'s clock skew.
        "time": time.time(),
    }


# Each feature's host package declares its own commands (its COMMANDS: name -> "module:function"
# inside it); this table only merges them. The imports are static so that the in-memory agent
# (agent_ship.agent_blob), which follows imports in the source, carries every table.
FEATURES = (
    cache,
    ckpt,
    cron,
    facts,
    modelload,
    monitor,
    netbench,
    network,
    orchestra,
    provision,
    sandbox,
    train,
)

COMMANDS: Dict[str, Union[str, Handler]] = {"ping": ping}
for _feature in FEATURES:
    _short = _feature.__name__.rpartition(".")[2]
    for _name, _entry in _feature.COMMANDS.items():
        # A command's name is its place: "cache.state" is `state` in labctl/agent/cache/.
        COMMANDS[f"{_short}.{_name}"] = f".{_short}{_entry}"


def register(name: str, handler: Union[str, Handler]) -> None:
    COMMANDS[name] = handler


def resolve(name: str) -> Handler:
    try:
        entry = COMMANDS[name]
    except KeyError:
        known = ", ".join(sorted(COMMANDS))
        raise AgentError(f"unknown command {name!r}; known: {known}", "unknown_command") from None
    if callable(entry):
        return entry
    handler: Handler = registry.load(entry, __package__)
    return handler


def call(name: str, args: Dict[str, Any]) -> Dict[str, Any]:
    """Run command `name` with `args`, checked once against the spec its handler declares."""
    return spec.call(name, resolve(name), args)


def declared(name: str) -> Optional[spec.Command]:
    """What command `name`'s handler declares (its arguments and answer), or None for a command
    the table lacks or a handler declared without."""
    try:
        handler = resolve(name)
    except AgentError:
        return None
    return spec.spec_of(handler)


def answer_problem(name: str, answer: Any, args: Optional[Dict[str, Any]] = None) -> Optional[str]:
    """What is wrong with `answer` as command `name`'s answer to `args` ("at PATH: expected X,
    got Y"), or None (also for a command with no declared answer). The controller's check: it
    imports the handler's module to read the declaration, which runs nothing of the command."""
    found = declared(name)
    return None if found is None else found.answer_problem(answer, args)
