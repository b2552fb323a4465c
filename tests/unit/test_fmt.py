"""Sizes, rates, durations and ages as a person reads them, and the rate/ETA of a copy."""

from __future__ import annotations

import pytest

from labctl.output.fmt import RateMeter, fmt_age, fmt_bytes, fmt_duration

MIB = 1 << 20


def test_formatting() -> None:
    assert fmt_bytes(512) == "512 B"
    assert fmt_bytes(3 * MIB) == "3.0 MiB"
    assert fmt_bytes(5 << 30) == "5.0 GiB"
    assert fmt_duration(3.24) == "3.2s"
    assert fmt_duration(125) == "2m05s"
    assert fmt_duration(7300) == "2h01m"
    assert fmt_age(None, 100.0) == "never"
    assert fmt_age(90.0, 100.0) == "just now"
    assert fmt_age(100.0, 400.0) == "5m00s ago"


# ---------------------------------------------------------------------------------------------
# rate and ETA


def test_rate_meter_uses_a_sliding_window() -> None:
    m = RateMeter(window=5.0)
    assert m.rate() is None and m.eta(100) is None
    m.update(0.0, 0)
    assert m.rate() is None  # one sample: no rate yet
    for t in range(1, 11):
        m.update(float(t), t * 100.0)  # a steady 100 B/s
    assert m.rate() == pytest.approx(100.0)
    assert m.eta(2000) == pytest.approx(10.0)
    for t in range(11, 21):
        m.update(float(t), 1000 + (t - 10) * 10.0)  # slows to 10 B/s
    assert m.rate() == pytest.approx(10.0)  # today's rate, not the average since the start
    assert m.eta(1100) == 0.0


def test_rate_meter_resumed_start_is_not_counted_as_speed() -> None:
    m = RateMeter()
    m.update(0.0, 600.0)  # a resumed copy starts 60% done
    m.update(2.0, 800.0)
    assert m.rate() == pytest.approx(100.0)
    assert m.eta(1000.0) == pytest.approx(2.0)
