"""Where output goes: human text and progress to stderr (rich), machine JSON to stdout."""

from __future__ import annotations

import json
import os
import sys
from typing import IO, Any

from rich.console import Console

# Output to a pipe or a file has no width of its own; rich would take 80 columns and fold every
# table cell. A table then takes the width its cells need, up to this.
UNBOUNDED_WIDTH = 1000

READER_GONE_NOTE = (
    "labctl: the reader of stdout has gone (e.g. `| head`): nothing more is printed there, "
    "and the command carries on to its end (Ctrl-C stops it).\n"
)


class LabConsole(Console):
    """A rich Console whose reader may go away (`| head -4`) while hosts still work.

    rich's own answer to a broken pipe is SystemExit(1) from whichever thread was printing: in a
    host's thread that ended the thread without a result (fan_out then waited for ever) and, over
    SSH, closed the channel, whose watchdog killed the command (a training run without its
    checkpoint). Here the console falls silent instead and the command runs to its own end.
    """

    closed_by_reader = False

    def on_broken_pipe(self) -> None:
        self.quiet = True
        self.closed_by_reader = True
        reader_gone(self.file)


def has_no_reader(console: Console) -> bool:
    """Whether `console`'s reader has gone: a command that only shows something (a watch) can stop."""
    return isinstance(console, LabConsole) and console.closed_by_reader


def reader_gone(stream: IO[str]) -> None:
    """`stream`'s reader has closed it: point its descriptor at /dev/null, so that later writes
    (and the flush at exit) succeed and go nowhere instead of failing again."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    if fd == 1:
        try:
            sys.stderr.write(READER_GONE_NOTE)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass  # stderr has gone too: nobody is left to tell


def make_console() -> Console:
    console = LabConsole(stderr=True, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = UNBOUNDED_WIDTH
    return console


def make_stdout_console() -> Console:
    """Hosts' stdout lines, as they print them; silent once stdout's reader has gone."""
    # soft_wrap: a long line stays one line, as the host printed it.
    return LabConsole(highlight=False, soft_wrap=True)


def write_stdout(text: str) -> None:
    """Write `text` to stdout; a reader that has gone is no error (see LabConsole)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        reader_gone(sys.stdout)


def emit_json(obj: Any) -> None:
    """Write one JSON document to stdout: the only thing `--json` puts there."""
    write_stdout(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def render_error(console: Console, title: str, paragraph: str) -> None:
    console.print(f"[bold red]error:[/] [bold]{title}[/]" if title else "[bold red]error:[/]", soft_wrap=True)
    # soft_wrap: a FILE:LINE must stay on one line so editors and terminals can follow it.
    console.print(paragraph, soft_wrap=True, markup=False)
