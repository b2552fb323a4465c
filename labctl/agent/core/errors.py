"""The one error an agent command raises: the agent answers it as {"error", "kind"}, and the
controller turns it into a host failure naming the host."""

from __future__ import annotations


class AgentError(Exception):
    """A failure the handler can name: `kind` is a short machine-readable word."""

    def __init__(self, message: str, kind: str = "failed") -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
