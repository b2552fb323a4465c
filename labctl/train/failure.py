"""Why a run failed, in the trainer's words: never torchrun's traceback.

torchrun ends a failed run with a Python traceback of its own and a ChildFailedError report
("error_file: <N/A> | traceback : To enable traceback see: https://…"); neither says what went
wrong. The trainer says it: a fatal error (agent/train/fatal.py) comes as a `fatal` event on a
rank's stdout and as a file in the run's folder, and any other failure leaves a worker's
"error:" line. `TorchrunText` drops torchrun's traceback and report from what is shown;
`failure_line` turns a failed host's output into the one line its row shows. Pure functions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:")
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
# Bits of torchrun's report that must never reach a user, even outside a traceback block.
NOISE = ("ChildFailedError", "To enable traceback see", "error_file:", "SignalException")


class TorchrunText:
    """Tells torchrun's traceback and its failure report apart from the lines worth showing.

    One per host stream: a traceback spans lines, and the report that follows a
    ChildFailedError is framed by two rules of "=" signs.
    """

    def __init__(self) -> None:
        self.state: str | None = None  # None, "traceback", "after" (its exception line) or "report"
        self.rules = 0

    def keep(self, line: str) -> bool:
        """Whether `line` (one of torchrun's own, not a rank's) is worth showing."""
        text = line.rstrip()
        if text.startswith("Traceback (most recent call last)"):
            self.state = "traceback"
            return False
        if self.state == "traceback":
            if not text or text[0].isspace():
                return False
            # The exception line ends the traceback; a ChildFailedError's report follows it.
            self.state, self.rules = ("report", 0) if "ChildFailedError" in text else ("after", 0)
            return False
        if self.state == "report":
            if text.startswith("====="):
                self.rules += 1
                if self.rules >= 2:
                    self.state = None
            return False
        if self.state == "after":
            if not text or text.startswith(("During handling of the above", "The above exception")):
                return False
            self.state = None
        return not any(n in text for n in NOISE)


def fatal_event(body: str) -> str | None:
    """The reason in a rank's `{"event": "fatal", "reason": ...}` line, else None."""
    if not body.startswith("{") or '"fatal"' not in body:
        return None  # rank 0's every event passes here: parse only what may be one
    try:
        event = json.loads(body)
    except ValueError:
        return None
    if isinstance(event, dict) and event.get("event") == "fatal" and isinstance(event.get("reason"), str):
        return event["reason"]
    return None


def fatal_line(reason: str) -> str:
    return f"the trainer stopped the run (no restart): {reason}"


def failure_line(rc: int | None, lines: Iterable[str], limit: int = 400) -> str:
    """One line for a host whose torchrun failed: the failing rank and the worker's own error,
    from its output (ranks' lines prefixed "[rankN]:", torchrun's not); never torchrun's traceback."""
    text = TorchrunText()
    code = rank = None
    worker_error = None
    kept: list[str] = []
    for line in lines:
        m = RANK_PREFIX.match(line)
        if m:
            body = line[m.end() :].strip()
            reason = fatal_event(body)
            if reason is not None:
                return fatal_line(reason)[:limit]
            if "error:" in body or re.match(r"^[A-Za-z_.]*(Error|Exception)\b", body):
                worker_error = f"rank {m.group(1)}: {body}"
            continue
        if text.state == "report":
            found = _EXITCODE.match(line)
            code = int(found.group(1)) if found and code is None else code
            found = _RANK.match(line)
            rank = int(found.group(1)) if found and rank is None else rank
        if text.keep(line) and line.strip():
            kept.append(line.strip())
    out = f"torchrun exited {rc}"
    if code is not None:
        out += f": rank {rank} exited {code}" if rank is not None else f": a worker exited {code}"
    if worker_error is not None:
        out += f" ({worker_error})"
    elif code is None and kept:
        out += ": " + " | ".join(kept[-3:])
    return out[:limit]
