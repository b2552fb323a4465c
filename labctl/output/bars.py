"""Progress bars for copies that report `{"done", "total"}` per host (cache sync, ckpt backup
and restore): one rich bar per host, on stderr, gone when the copy ends."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class Bars:
    """One rich progress bar per cache host, fed by the pull's progress lines (stderr only)."""

    def __init__(self, console: Any, enabled: bool) -> None:
        self.console = console
        self.enabled = enabled
        self.progress: Any = None
        self.tasks: dict[str, Any] = {}
        self.meters: dict[str, Any] = {}

    def __enter__(self) -> Bars:
        if self.enabled:
            from rich.progress import BarColumn, Progress, TextColumn

            self.progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.percentage:>3.0f}%"),
                TextColumn("{task.fields[sizes]}"),
                TextColumn("{task.fields[rate]}"),
                TextColumn("ETA {task.fields[eta]}"),
                console=self.console,
                transient=True,
            )
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def shows(self) -> dict[str, Callable[..., None]]:
        """The bars as a renderer of a copy's "copied" events (labctl.output.progress)."""
        return {"copied": lambda _console, what, done, total: self.update(what, done, total)}

    def update(self, host: str, done: Any, total: Any) -> None:
        if self.progress is None:
            return
        from labctl.output.fmt import RateMeter, fmt_bytes, fmt_duration, fmt_rate

        done, total = float(done), float(total) or 1.0
        if host not in self.tasks:
            self.meters[host] = RateMeter()
            self.tasks[host] = self.progress.add_task(host, total=total, sizes="", rate="", eta="")
        meter = self.meters[host]
        meter.update(time.monotonic(), done)
        self.progress.update(
            self.tasks[host],
            completed=done,
            total=total,
            sizes=f"{fmt_bytes(done)}/{fmt_bytes(total)}",
            rate=fmt_rate(meter.rate()),
            eta=fmt_duration(meter.eta(total)),
        )
