"""How sizes, rates, durations and ages read to a person, and the rate and ETA of a running copy."""

from __future__ import annotations

from collections import deque


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def fmt_rate(bps: float | None) -> str:
    return "-" if not bps else f"{bps / 1e6:.1f} MB/s"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = round(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def fmt_age(when: float | None, now: float) -> str:
    if not when:
        return "never"
    ago = max(0.0, now - when)
    if ago < 60:
        return "just now"
    return fmt_duration(ago) + " ago"


class RateMeter:
    """Rate over a sliding window of (time, bytes done) samples, and the ETA it implies.

    A window, not the average since the start: a resumed copy starts at 60% done in no time,
    and a copy slowed by another flow should show today's rate, not the morning's.
    """

    def __init__(self, window: float = 5.0) -> None:
        self.window = window
        self.samples: deque[tuple[float, float]] = deque()

    def update(self, t: float, done: float) -> None:
        self.samples.append((t, done))
        # Keep one sample older than the window so the rate always spans the whole window.
        while len(self.samples) > 2 and self.samples[1][0] <= t - self.window:
            self.samples.popleft()

    def rate(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        if t1 <= t0:
            return None
        return max(0.0, (d1 - d0) / (t1 - t0))

    def eta(self, total: float) -> float | None:
        rate = self.rate()
        if not self.samples:
            return None
        left = max(0.0, total - self.samples[-1][1])
        if left == 0:
            return 0.0
        return left / rate if rate else None
