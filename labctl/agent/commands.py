"""The agent's command table: name -> handler(args: dict) -> dict, merged from every feature's
host package (`labctl/agent/<feature>/__init__.py` declares its COMMANDS).

Each handler declares the arguments it takes with `@takes` (argspec.py), next to its code;
`call` checks a command's args against it once, before the handler runs, so a missing, unknown
or wrongly typed argument is refused as bad_args naming the command and the argument.

A handler is either a callable or a "module:function" string relative to this package; the
string form is imported only when that command runs, so a heavy or broken module for one
command (bench, load) never slows down or breaks another (ping, facts). What each command
answers is declared in answers.py: the controller refuses an answer of another shape.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from typing import Any, Callable, Dict, Union

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
from .core import argspec, registry
from .core.argspec import takes
from .core.errors import AgentError

Handler = Callable[[Dict[str, Any]], Dict[str, Any]]


@takes()
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
    return argspec.call(name, resolve(name), args)
