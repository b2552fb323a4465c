"""`--time-limit` durations (labctl/train/duration.py): what parses, what is refused, and back."""

from __future__ import annotations

import pytest

from labctl.output.errors import InputError
from labctl.train.duration import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("3h50m", 13800),
        ("90s", 90),
        ("45m", 2700),
        ("1h", 3600),
        ("1d12h", 129600),
        ("1h30m15s", 5415),
        (" 2H 5M ", 7500),
        ("90m", 5400),
    ],
)
def test_durations_parse_to_seconds(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("90", "has no unit"),
        ("", "is not a duration"),
        ("3.5h", "is not a duration"),
        ("50m3h", "is not a duration"),  # largest unit first
        ("1h1h", "is not a duration"),
        ("-5m", "is not a duration"),
        ("02:00:00", "is not a duration"),
        ("0m", "no time at all"),
        ("1w", "is not a duration"),
    ],
)
def test_bad_durations_are_input_errors_naming_the_option(text: str, says: str) -> None:
    with pytest.raises(InputError) as e:
        parse_duration(text)
    assert e.value.exit_code == 2
    assert says in e.value.message and "--time-limit" in e.value.message and e.value.hint


@pytest.mark.parametrize(
    ("seconds", "text"), [(13800, "3h50m"), (90, "1m30s"), (3600, "1h"), (129600, "1d12h"), (5, "5s")]
)
def test_format_duration_reads_back(seconds: int, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(format_duration(seconds)) == seconds
