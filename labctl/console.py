"""Where output goes: human text and progress to stderr (rich), machine JSON to stdout."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console

# Output to a pipe or a file has no width of its own; rich would take 80 columns and fold every
# table cell. A table then takes the width its cells need, up to this.
UNBOUNDED_WIDTH = 1000


def make_console() -> Console:
    console = Console(stderr=True, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = UNBOUNDED_WIDTH
    return console


def emit_json(obj: Any) -> None:
    """Write one JSON document to stdout: the only thing `--json` puts there."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def render_error(console: Console, title: str, paragraph: str) -> None:
    console.print(f"[bold red]error:[/] [bold]{title}[/]" if title else "[bold red]error:[/]", soft_wrap=True)
    # soft_wrap: a FILE:LINE must stay on one line so editors and terminals can follow it.
    console.print(paragraph, soft_wrap=True, markup=False)
