"""Where output goes: human text and progress to stderr (rich), machine JSON to stdout."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console


def make_console() -> Console:
    return Console(stderr=True, highlight=False)


def emit_json(obj: Any) -> None:
    """Write one JSON document to stdout: the only thing `--json` puts there."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def render_error(console: Console, title: str, paragraph: str) -> None:
    console.print(f"[bold red]error:[/] [bold]{title}[/]" if title else "[bold red]error:[/]", soft_wrap=True)
    # soft_wrap: a FILE:LINE must stay on one line so editors and terminals can follow it.
    console.print(paragraph, soft_wrap=True, markup=False)
