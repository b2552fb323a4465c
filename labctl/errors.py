"""Errors that labctl reports to a person, each with the fix and an exit code.

Exit codes follow DESIGN.md: 2 bad input, 1 a host failed, 130 interrupted.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_HOST = 1
EXIT_INPUT = 2
EXIT_INTERRUPTED = 130


class LabctlError(Exception):
    """An error a person can act on: `message` says what is wrong, `hint` what to do."""

    exit_code = EXIT_HOST

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def paragraph(self) -> str:
        return f"{self.message} {self.hint}".strip()


class InputError(LabctlError):
    """Bad input: inventory, playbook or arguments. Exit code 2."""

    exit_code = EXIT_INPUT


class HostError(LabctlError):
    """A host failed or could not be reached. Exit code 1."""

    exit_code = EXIT_HOST
