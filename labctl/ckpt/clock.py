"""STAND-IN (part D of issue 16): part E owns this module; the lead replaces it with E's at merge.

The contract's clock: `now()` is UTC and aware, `LABCTL_NOW` (ISO 8601) when set, so tests set
the calendar instead of sleeping.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

from labctl.errors import InputError

ENV = "LABCTL_NOW"


def now() -> datetime:
    text = os.environ.get(ENV)
    if not text:
        return datetime.now(UTC)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            f"{ENV}={text!r} is not an ISO 8601 time.", f"For example: {ENV}=2026-11-23T03:00:00Z."
        ) from None
    return when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)
