"""`--every 30m|4h|1d` as the cron schedule that runs at that period, or the nearest one cron
can say: cron counts minutes within an hour and hours within a day, so a period must divide
the hour (minutes) or the day (hours); a day and a week are the longer ones it can say."""

from __future__ import annotations

import re

from labctl.output.errors import InputError
from labctl.provision.resources.cron import check_schedule

UNITS = {"m": 1, "h": 60, "d": 1440}


def _schedules() -> dict[int, str]:
    out: dict[int, str] = {}
    for n in range(1, 60):
        if 60 % n == 0:
            out[n] = "* * * * *" if n == 1 else f"*/{n} * * * *"
    for n in range(1, 24):
        if 24 % n == 0:
            out[n * 60] = "0 * * * *" if n == 1 else f"0 */{n} * * *"
    out[1440] = "0 0 * * *"
    out[10080] = "0 0 * * 0"
    return out


SCHEDULES = _schedules()


def period_text(minutes: int) -> str:
    for unit, size in (("d", 1440), ("h", 60)):
        if minutes % size == 0:
            return f"{minutes // size}{unit}"
    return f"{minutes}m"


def every_to_schedule(every: str) -> str:
    m = re.fullmatch(r"\s*(\d{1,9})\s*([mhd])\s*", every.lower(), re.ASCII)  # int() refuses 4300 digits
    if not m or int(m.group(1)) == 0:
        raise InputError(
            f"--every {every!r} is not a period.",
            "Write a number and a unit, m (minutes), h (hours) or d (days): e.g. --every 30m, 4h, 1d.",
        )
    minutes = int(m.group(1)) * UNITS[m.group(2)]
    if minutes in SCHEDULES:
        return SCHEDULES[minutes]
    nearest = min(SCHEDULES, key=lambda p: (abs(p - minutes), p))
    raise InputError(
        f"--every {every} cannot be said in cron, which counts minutes within an hour and hours "
        "within a day (a period must divide 60 minutes or 24 hours, or be 1d or 7d).",
        f"The nearest it can say is --every {period_text(nearest)} ('{SCHEDULES[nearest]}'); "
        "or give --schedule with the exact cron fields.",
    )


def resolve_schedule(every: str | None, schedule: str | None) -> str:
    if every and schedule:
        raise InputError(
            "Give --every or --schedule, not both.", "e.g. --every 4h or --schedule '0 */4 * * *'."
        )
    if schedule:
        try:
            return " ".join(check_schedule(schedule))
        except ValueError as e:
            raise InputError(f"--schedule: {e}.", "e.g. --schedule '0 */4 * * *' (every 4 hours).") from None
    if every:
        return every_to_schedule(every)
    raise InputError("When should the job run?", "Give --every 4h or --schedule '0 */4 * * *'.")
