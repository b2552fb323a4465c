"""The time the checkpoint library's retention goes by: `LABCTL_NOW` when set, else the system clock.

Tests and dry runs set the calendar (`LABCTL_NOW=2027-03-01T02:00:00Z`) instead of sleeping.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

from labctl.output.errors import InputError

ENV = "LABCTL_NOW"


def parse_utc(text: str) -> datetime:
    """An ISO 8601 time as an aware UTC datetime (no zone given: UTC); ValueError when it is none,
    or when its UTC falls outside the years 1-9999 (9999-12-31T23:00-05:00 is in 10000 UTC)."""
    value = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{text!r} in UTC is outside the years 1-9999") from None


def now() -> datetime:
    """Now, UTC and aware: `LABCTL_NOW` (ISO 8601) when it is set, else the system clock."""
    text = os.environ.get(ENV)
    if not text:
        return datetime.now(UTC)
    try:
        return parse_utc(text)
    except ValueError as e:
        why = str(e) if "outside the years" in str(e) else "it is not an ISO 8601 time"
        raise InputError(
            f"{ENV}={text!r} cannot be used: {why}.",
            f"Set it like {ENV}=2027-03-01T02:00:00Z, or unset it to use the system clock.",
        ) from None


def parse_record_time(text: object) -> datetime | None:
    """A record's time (`backed_up_at`) as aware UTC, or None when it is missing or unreadable."""
    if not isinstance(text, str):
        return None
    try:
        return parse_utc(text)
    except ValueError:
        return None


def iso(when: datetime) -> str:
    """The library records' time format (UTC, seconds, Z)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
