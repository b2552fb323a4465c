"""Which copies of the checkpoint library to keep: keep-daily / keep-weekly / keep-monthly.

As restic's and borg's `--keep-daily N` etc.: for the newest N days (ISO weeks, months) that
have a copy, the newest copy of that day (week, month) is kept. Days, weeks and months are
UTC calendar ones; each rule counts its own periods, so a copy several rules pick is kept
once (and `why` names every rule that keeps it). The defaults are seed 000 §5.3: 30 daily,
weekly for 3 months (13 ISO weeks), monthly for a year.

The rules run per run (the key's first part, "RUN/step-00000120"): a library holding several
runs keeps each run's own history, and a run's newest copy is always kept, whatever the
rules say, so the checkpoint a run would resume from is never pruned. A copy dated after
`now` (a clock set wrong somewhere) is kept: it is not for this plan to judge.

Pure: no clock, no files. The caller gives `now` (labctl.ckpt.clock.now()).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime


@dataclass(frozen=True)
class Retention:
    daily: int = 30
    weekly: int = 13
    monthly: int = 12

    def __post_init__(self) -> None:
        for name in ("daily", "weekly", "monthly"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"keep-{name} must be a whole number of 0 or more, got {value!r}")


@dataclass
class RetentionPlan:
    keep: list[str] = field(default_factory=list)
    prune: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)


def _utc(when: datetime) -> datetime:
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _day(t: datetime) -> str:
    return t.strftime("%Y-%m-%d")


def _week(t: datetime) -> str:
    year, week, _ = t.isocalendar()
    return f"{year}-W{week:02d}"


def _month(t: datetime) -> str:
    return t.strftime("%Y-%m")


RULES: tuple[tuple[str, Callable[[datetime], str]], ...] = (
    ("daily", _day),
    ("weekly", _week),
    ("monthly", _month),
)


def run_of(key: str) -> str:
    return key.split("/", 1)[0]


def plan_retention(entries: list[tuple[str, datetime]], now: datetime, policy: Retention) -> RetentionPlan:
    """Split the library's copies (key, backed_up_at) into those to keep and those to prune.

    `keep` and `prune` come in the order of `entries`; `why` says for every key why it is kept
    (each rule that keeps it) or pruned.
    """
    now = _utc(now)
    reasons: dict[str, list[str]] = {key: [] for key, _ in entries}
    runs: dict[str, list[tuple[datetime, str]]] = {}
    for key, when in entries:
        runs.setdefault(run_of(key), []).append((_utc(when), key))
    for run, copies in runs.items():
        # Newest first; a tie on the time goes to the later key (the higher step).
        copies.sort(reverse=True)
        reasons[copies[0][1]].append(f"newest copy of {run}")
        for when, key in copies:
            if when > now:
                reasons[key].append(f"dated after now ({when:%Y-%m-%dT%H:%M:%SZ})")
        for name, bucket in RULES:
            limit = getattr(policy, name)
            seen: set[str] = set()
            for when, key in copies:
                if when > now:
                    continue
                period = bucket(when)
                if period in seen:
                    continue
                if len(seen) == limit:
                    break
                seen.add(period)
                reasons[key].append(f"{name} {period}")
    plan = RetentionPlan()
    for key, _ in entries:
        if key in plan.why:
            continue  # a key given twice is planned once
        if reasons[key]:
            plan.keep.append(key)
            plan.why[key] = "kept: " + "; ".join(reasons[key])
        else:
            plan.prune.append(key)
            plan.why[key] = (
                f"pruned: no rule keeps it (keep-daily {policy.daily}, weekly {policy.weekly}, "
                f"monthly {policy.monthly})"
            )
    return plan
