"""An agent command that listens on a host, kept running in a thread while another host uses it.

`cache sync`'s server (labctl/cache/sync.py) and `bench network`'s sink
(labctl/netbench/measure.py) both work this way: the agent announces a "listening" event
(port, token, ...) on its output, the controller passes it to a second host's agent, and the
listener ends on that agent's word, when idle, or when its channel is closed.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Self

from labctl.output.errors import HostError, LabctlError

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.inventory.model import Host


class Listener:
    """`command` on `host`, in a thread; `what` names it in errors ("cache.serve")."""

    def __init__(
        self,
        ctx: Context,
        host: Host,
        command: str,
        args: dict[str, Any],
        *,
        what: str,
        timeout: float,
        ready_timeout: float,
        timeout_hint: str = "",
        thread_name: str,
    ) -> None:
        self.ctx = ctx
        self.host = host
        self.command = command
        self.args = args
        self.what = what
        self.timeout = timeout
        self.ready_timeout = ready_timeout
        self.timeout_hint = timeout_hint
        self.cancel = threading.Event()
        self.ready = threading.Event()
        self.info: dict[str, Any] | None = None
        self.result: dict[str, Any] | None = None
        self.error: LabctlError | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name=thread_name)

    def _run(self) -> None:
        from labctl.hosts.agent_ship import ask_agent

        try:
            self.result = ask_agent(
                self.ctx,
                self.host,
                self.command,
                self.args,
                cancel=self.cancel,
                timeout=self.timeout,
                on_line=self._line,
            )
        except LabctlError as e:
            self.error = e
        finally:
            self.ready.set()

    def _line(self, stream: str, line: str) -> None:
        from labctl.hosts.agent_ship import agent_event

        event = None if self.info is not None else agent_event(stream, line, "listening")
        if event is not None:
            self.info = event
            self.ready.set()

    def begin(self) -> Self:
        self.thread.start()
        return self

    def wait_ready(self, cancel: threading.Event | None = None) -> dict[str, Any]:
        """The listener's announcement; raises when it could not start or `cancel` was set."""
        deadline = time.monotonic() + self.ready_timeout
        while not self.ready.wait(0.05):
            cancelled = cancel is not None and cancel.is_set()
            if cancelled or time.monotonic() > deadline:
                self.stop(0)
                if cancelled:
                    raise HostError(f"{self.host.name}: {self.what} did not start listening (cancelled).")
                raise HostError(
                    f"{self.host.name}: {self.what} did not start listening within {self.ready_timeout:g} s.",
                    self.timeout_hint,
                )
        if self.info is None:
            if self.error is not None:
                raise self.error
            raise HostError(f"{self.host.name}: {self.what} ended before it listened.")
        return self.info

    def stop(self, grace: float = 5.0) -> None:
        """Wait for the listener's own exit (the other host tells it to stop), else close its channel."""
        if self.thread.is_alive():
            self.thread.join(grace)
        if self.thread.is_alive():
            self.cancel.set()  # the channel closes and the host's watchdog ends the agent
            self.thread.join(10)
