"""Errors that labctl reports to a person, each with the fix and an exit code.

Exit codes (README, "A tour of the commands"): 2 bad input, 1 a host failed, 130 interrupted.
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


def install_extra(extra: str) -> str:
    """The command that adds labctl's optional `extra` (torch, plot, cloud, ...) to the environment
    this labctl runs from, whichever way it was installed (a wheel in a venv, pipx, a checkout):
    this interpreter's pip with the extra's pinned packages, as the installed metadata lists them."""
    import re
    import shlex
    import sys
    from importlib import metadata
    from pathlib import Path

    python = shlex.quote(sys.executable)
    try:
        requires = metadata.requires("labctl") or []
    except metadata.PackageNotFoundError:
        requires = []
    marker = re.compile(rf"""extra\s*==\s*["']{re.escape(extra)}["']""")
    pins = [r.split(";")[0].strip() for r in requires if marker.search(r)]
    if pins:
        return f"{python} -m pip install {' '.join(shlex.quote(p) for p in pins)}"
    # Run from a checkout without installing it (PYTHONPATH): the extra of that checkout.
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file():
        return f"{python} -m pip install {shlex.quote(f'{checkout}[{extra}]')}"
    return f"{python} -m pip install 'labctl[{extra}]' from the wheel or checkout labctl came from"


# errno names (as errno.errorcode spells them) of a file system that cannot take a write: the
# errors a host's or this machine's full or read-only disk is named by.
DISK_FULL = frozenset({"ENOSPC", "EDQUOT"})
NOT_WRITABLE = frozenset({"EROFS", "EACCES", "EPERM"})
