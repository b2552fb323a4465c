"""Output lines from many hosts at once, each after its host's label: `m5    │ text`."""

from __future__ import annotations

import threading

from rich.console import Console
from rich.markup import escape

from labctl.output.console import make_stdout_console


class HostLinePrinter:
    """Prints whole lines from concurrent hosts: stdout lines to stdout, the rest to `err_console`.

    Labels are padded to `width` so the bars line up; one lock keeps two hosts' lines from
    interleaving mid-line.
    """

    def __init__(self, err_console: Console, width: int) -> None:
        self.out_console = make_stdout_console()
        self.err_console = err_console
        self.width = width
        self.lock = threading.Lock()

    def print(self, label: str, text: str, stream: str, colour: str = "cyan") -> None:
        target = self.out_console if stream == "stdout" else self.err_console
        with self.lock:
            target.print(f"[{colour}]{label:<{self.width}}[/] │ {escape(text)}")
