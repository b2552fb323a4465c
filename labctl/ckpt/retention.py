"""STAND-IN (part D of issue 16): part E owns this module; the lead replaces it with E's at merge.

Only the contract's signature and rule, so `labctl ckpt backup` can prune: the newest copy of
each of the last `daily` days, `weekly` ISO weeks and `monthly` months that have a copy, and
the newest copy of each run, are kept; the rest are pruned.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class Retention:
    daily: int = 30
    weekly: int = 13
    monthly: int = 12


@dataclass
class RetentionPlan:
    keep: list[str] = field(default_factory=list)
    prune: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)


def plan_retention(entries: list[tuple[str, datetime]], now: datetime, policy: Retention) -> RetentionPlan:
    newest_first = sorted((e for e in entries if e[1] <= now), key=lambda e: e[1], reverse=True)
    why: dict[str, str] = {}

    def keep_buckets(n: int, bucket: Callable[[datetime], Hashable], label: str) -> None:
        seen: list[Hashable] = []
        for key, when in newest_first:
            b = bucket(when)
            if b in seen:
                continue
            if len(seen) >= n:
                break
            seen.append(b)
            why.setdefault(key, label)

    keep_buckets(policy.daily, lambda d: d.date(), "daily")
    keep_buckets(policy.weekly, lambda d: d.isocalendar()[:2], "weekly")
    keep_buckets(policy.monthly, lambda d: (d.year, d.month), "monthly")
    runs: set[str] = set()
    for key, _when in sorted(entries, key=lambda e: e[1], reverse=True):
        run = key.split("/", 1)[0]
        if run not in runs:
            runs.add(run)
            why.setdefault(key, "newest of its run")
    keep = [k for k, _ in entries if k in why]
    prune = [k for k, _ in entries if k not in why]
    return RetentionPlan(keep, prune, why)
