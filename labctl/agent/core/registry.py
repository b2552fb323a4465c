"""The one shape of every registry in labctl: a table of name -> "module:attribute", loaded
only when that name is used.

Agent commands (each `labctl/agent/<feature>/__init__.py`'s COMMANDS), provision resources,
train backends and CLI command groups are all such tables, read through `load`. A module that
is slow or broken to import then costs only the command that names it: `labctl --help` does
not import torch, and a host whose Docker client is broken still answers `facts.collect`.

Standard library only (Python 3.8): the agent uses it on the host, the controller here.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional


def load(entry: str, package: Optional[str] = None) -> Any:
    """The object an entry names: "pkg.module:attr", or ".module:attr" relative to `package`."""
    module_name, sep, attr = entry.partition(":")
    if not sep or not attr:
        raise ValueError(f"registry entry {entry!r} is not 'module:attribute'")
    return getattr(importlib.import_module(module_name, package), attr)
