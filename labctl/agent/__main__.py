"""Entry point: `python3 -m labctl.agent COMMAND [JSON-ARGS]` or `python3 agent.pyz COMMAND ...`.

Prints exactly one JSON object on stdout. Exit 0 with the command's result, or exit 1 with
`{"error": "...", "kind": "..."}`. JSON-ARGS is an object; `-` reads it from stdin and
`@PATH` from a file (deleted once read), for args too long for a command line.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import traceback
from typing import Any, Dict, List, Optional

from .commands import call
from .core.errors import AgentError

USAGE = "usage: agent COMMAND [JSON-ARGS | -]"


def _parse_args(argv: List[str]) -> Dict[str, Any]:
    if len(argv) < 2:
        return {}
    if len(argv) > 2:
        raise AgentError("too many arguments; " + USAGE, "bad_args")
    if argv[1] == "-":
        text = sys.stdin.read()
    elif argv[1].startswith("@"):
        # Args too large for a command line arrive as a file the controller uploaded.
        with open(argv[1][1:]) as f:
            text = f.read()
        os.unlink(argv[1][1:])
    else:
        text = argv[1]
    if not text.strip():
        return {}
    try:
        args = json.loads(text)
    except ValueError as exc:
        raise AgentError(f"JSON-ARGS is not valid JSON: {exc}", "bad_args") from None
    if not isinstance(args, dict):
        raise AgentError(f"JSON-ARGS must be a JSON object, got {type(args).__name__}", "bad_args")
    return args


class _StdoutGuard:
    """Point fd 1 at stderr while a command runs.

    The controller parses stdout as one JSON document, and libraries (torch, NVML, a child
    process) may print there from C or Python; their noise belongs on stderr.
    """

    def __init__(self) -> None:
        self.saved: Optional[int] = None

    def __enter__(self) -> "_StdoutGuard":
        try:
            sys.stdout.flush()
            self.saved = os.dup(1)
            os.dup2(2, 1)
        except (OSError, ValueError, AttributeError):
            self.saved = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.saved is None:
            return
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        os.dup2(self.saved, 1)
        os.close(self.saved)


def _dumps(obj: Dict[str, Any]) -> str:
    # default=str: a handler returning a Path or bytes should still produce an answer.
    return json.dumps(obj, default=str, sort_keys=True)


def _emit(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def run(argv: List[str]) -> Dict[str, Any]:
    """Run one command and return its result; raises AgentError or any handler exception."""
    if not argv:
        raise AgentError("no command given; " + USAGE, "usage")
    args = _parse_args(argv)
    result = call(argv[0], args)
    if not isinstance(result, dict):
        raise AgentError(f"command {argv[0]!r} returned {type(result).__name__}, not an object")
    return result


def main(argv: Optional[List[str]] = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--serve"] and len(argv) == 2:
        # `--serve DIGEST`: kept running for the connection keeper; every later call forks from
        # here (core/serve.py).
        from .commands import resolve
        from .core.serve import Agent, serve

        return serve(Agent(main, resolve), argv[1])
    try:
        with _StdoutGuard():
            text = _dumps(run(list(argv)))
    except AgentError as exc:
        _emit(_dumps({"error": exc.message, "kind": exc.kind}))
        return 1
    except KeyboardInterrupt:
        _emit(_dumps({"error": "interrupted", "kind": "interrupted"}))
        return 1
    except OSError as exc:
        kind = _FILE_KINDS.get(errno.errorcode.get(exc.errno or 0, ""))
        if kind is None:
            return _exception(exc)
        # A full or read-only disk is the host's condition, not labctl's bug: name it and where.
        _emit(_dumps({"error": exc.strerror or str(exc), "kind": kind, "path": exc.filename}))
        return 1
    except Exception as exc:  # the controller needs an answer whatever broke
        return _exception(exc)
    _emit(text)
    return 0


# errno names of an OSError the controller words as a fault of the host's disk.
_FILE_KINDS = {
    "ENOSPC": "disk_full",
    "EDQUOT": "disk_full",
    "EROFS": "read_only",
    "EACCES": "permission_denied",
    "EPERM": "permission_denied",
}


def _exception(exc: BaseException) -> int:
    error = {"error": f"{type(exc).__name__}: {exc}", "kind": "exception"}
    error["traceback"] = traceback.format_exc()
    _emit(_dumps(error))
    return 1


if __name__ == "__main__":
    sys.exit(main())
