"""Which copies of the checkpoint library to keep: keep-daily / keep-weekly / keep-monthly.

As restic's and borg's `--keep-daily N` etc.: for the newest N days (ISO weeks, months) that
have a copy, the newest copy of that day (week, month) is kept. Days, weeks and months are
UTC calendar ones; each rule counts its own periods, so a copy several rules pick is kept
once (and `why` names every rule that keeps it). The defaults are seed 000 §5.3: 30 daily,
weekly for 3 months (13 ISO weeks), monthly for a year.

The rules run per run (the key's first part, "RUN/step-00000120"): a library holding several
runs keeps each run's own history, and a run's newest good copy (the highest step not known
to be damaged: an older step backed up after a newer one is not the newer) is always kept,
whatever the rules say, so the checkpoint a run would resume from is never pruned. The caller
names the copies it found `damaged`; those count for no rule and are never pruned here
(mending or dropping one is `ckpt backup`'s and `ckpt verify --remove-damaged`'s to say). A
copy dated after `now` (a clock set wrong somewhere) is kept: it is not for this plan to judge.

Pure: no clock, no files. The caller gives `now` (labctl.ckpt.clock.now()).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
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
    # Per run, the key of the copy kept as its newest good one (absent: every copy is damaged).
    newest: dict[str, str] = field(default_factory=dict)


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


_STEP = re.compile(r"step-([0-9]+)\Z")


def step_of(key: str) -> int:
    """The step a key names ("RUN/step-00000120" -> 120); -1 for a key that names none."""
    m = _STEP.search(key)
    return int(m.group(1)) if m else -1


def plan_retention(
    entries: list[tuple[str, datetime]],
    now: datetime,
    policy: Retention,
    damaged: Collection[str] = (),
) -> RetentionPlan:
    """Split the library's copies (key, backed_up_at) into those to keep and those to prune.

    `damaged`: the keys of copies known not to re-hash. `keep` and `prune` come in the order of
    `entries`; `why` says for every key why it is kept (each rule that keeps it) or pruned.
    """
    now = _utc(now)
    bad = set(damaged)
    reasons: dict[str, list[str]] = {key: [] for key, _ in entries}
    runs: dict[str, list[tuple[datetime, int, str]]] = {}
    for key, when in entries:
        if key in bad:
            reasons[key] = [
                "damaged: left to `labctl ckpt backup`, which mends it or names the command that drops it"
            ]
            continue
        runs.setdefault(run_of(key), []).append((_utc(when), step_of(key), key))
    plan = RetentionPlan()
    for run, copies in runs.items():
        # By step, not by when it was backed up: an older step copied later is not the newest.
        newest = max(copies, key=lambda c: (c[1], c[0], c[2]))[2]
        plan.newest[run] = newest
        reasons[newest].append(f"newest copy of {run}")
        # Newest first; a tie on the time goes to the higher step.
        copies.sort(reverse=True)
        for when, _step, key in copies:
            if when > now:
                reasons[key].append(f"dated after now ({when:%Y-%m-%dT%H:%M:%SZ})")
        for name, bucket in RULES:
            limit = getattr(policy, name)
            seen: set[str] = set()
            for when, _step, key in copies:
                if when > now:
                    continue
                period = bucket(when)
                if period in seen:
                    continue
                if len(seen) == limit:
                    break
                seen.add(period)
                reasons[key].append(f"{name} {period}")
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
