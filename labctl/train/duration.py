"""`--time-limit 3h50m`: a duration as people write it, in whole seconds, and back.

Units d, h, m and s, largest first, each at most once: `3h50m`, `90s`, `45m`, `1h`, `1d12h`.
A bare number is refused: Slurm reads `90` as minutes, most tools as seconds, and a run
stopped 59 minutes early by a misread unit costs a session. Standard library only (the CLI
parses the option before anything heavy is imported).
"""

from __future__ import annotations

import re

from labctl.output.errors import InputError

UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", re.ASCII)
MAX_SECONDS = 365 * 86400
_HINT = "Write a number and a unit, largest first: e.g. 3h50m, 45m, 90s, 1h or 1d12h."


def parse_duration(text: str, option: str = "--time-limit") -> int:
    """Seconds in `text` ("3h50m" -> 13800); InputError (exit 2) naming `option` otherwise."""
    compact = str(text).strip().lower().replace(" ", "")
    m = _DURATION.fullmatch(compact)
    if not compact or m is None:
        if compact.isascii() and compact.isdigit():
            raise InputError(
                f"{option} {text!r} has no unit: seconds, minutes or hours?",
                f"Write e.g. {compact}s or {compact}m.",
            )
        raise InputError(f"{option} {text!r} is not a duration.", _HINT)
    if any(n and len(n.lstrip("0")) > 9 for n in m.groups()):  # past a year; int() refuses 4300 digits
        seconds = MAX_SECONDS + 1
    else:
        seconds = sum(int(n) * size for n, (_, size) in zip(m.groups(), UNITS, strict=True) if n)
    if seconds <= 0:
        raise InputError(f"{option} {text!r} is no time at all.", "Give a duration above zero, e.g. 30m.")
    if seconds > MAX_SECONDS:
        # Job files carry it as seconds (Slurm's --time, activeDeadlineSeconds): beyond this they overflow.
        raise InputError(
            f"{option} {text!r} is over a year ({format_duration(MAX_SECONDS)}).",
            "Give a shorter limit, e.g. 3h50m: a paused run resumes when it is started again.",
        )
    return seconds


def format_duration(seconds: int) -> str:
    """`13800` -> "3h50m": what parse_duration reads back to the same number of seconds."""
    left = int(seconds)
    if left <= 0:
        return "0s"
    parts = []
    for unit, size in UNITS:
        n, left = divmod(left, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts)
