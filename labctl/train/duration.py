"""Durations on the command line (`--time-limit 3h50m`): text to seconds and back.

Standard library only: the CLI parses `--time-limit` before anything heavy is imported.
"""

from __future__ import annotations

import re

from labctl.errors import InputError

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def parse_duration(text: str) -> int:
    """Seconds in `text`: a plain number of seconds, or units in order: 1d, 3h50m, 45m, 90s."""
    t = text.strip().lower()
    if t.isdigit():
        seconds = int(t)
    else:
        m = _DURATION.fullmatch(t)
        if not t or m is None:
            seconds = 0
        else:
            seconds = sum(int(v) * unit for v, unit in zip(m.groups(), _UNITS.values(), strict=True) if v)
    if seconds <= 0:
        raise InputError(
            f"{text!r} is not a duration.", "Write e.g. 3h50m, 45m, 90s or 1h (more than zero seconds)."
        )
    return seconds


def format_duration(seconds: int) -> str:
    """`seconds` as parse_duration reads it back: 13800 -> "3h50m", 90 -> "1m30s"."""
    if seconds <= 0:
        return "0s"
    out = ""
    for unit, size in _UNITS.items():
        n, seconds = divmod(seconds, size)
        if n:
            out += f"{n}{unit}"
    return out
