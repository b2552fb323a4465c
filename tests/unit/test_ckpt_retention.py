"""Retention of the checkpoint library over a calendar the test sets (nothing sleeps)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from labctl.ckpt import clock
from labctl.ckpt.retention import Retention, plan_retention
from labctl.output.errors import InputError


def at(text: str) -> datetime:
    return clock.parse_utc(text)


def daily_copies(run: str, first: datetime, days: int) -> list[tuple[str, datetime]]:
    """One copy a night at 02:00, step = day number."""
    return [(f"{run}/step-{d:08d}", first + timedelta(days=d, hours=2)) for d in range(days)]


def test_400_nights_keep_30_daily_then_weekly_then_monthly_each_once() -> None:
    first = datetime(2026, 1, 1, tzinfo=UTC)
    entries = daily_copies("r", first, 400)
    now = first + timedelta(days=400)
    plan = plan_retention(entries, now, Retention())
    when = dict(entries)
    kept = sorted(when[k] for k in plan.keep)
    assert len(plan.keep) == len(set(plan.keep)) and set(plan.keep) | set(plan.prune) == set(when)
    assert not set(plan.keep) & set(plan.prune)
    # The 30 newest nights, every one of them.
    last30 = sorted(when.values())[-30:]
    assert set(last30) <= set(kept)
    daily = [k for k in plan.keep if "daily" in plan.why[k]]
    assert len(daily) == 30
    # 13 ISO weeks: each week's newest copy (its Sunday, or the newest night of the current week).
    weekly = [k for k in plan.keep if "weekly" in plan.why[k]]
    assert len(weekly) == 13
    assert len({when[k].isocalendar()[:2] for k in weekly}) == 13
    for k in weekly[:-1]:
        assert when[k].isoweekday() == 7, (k, when[k])
    # 12 months: each month's newest copy, the last night of the month (or the newest night).
    monthly = [k for k in plan.keep if "monthly" in plan.why[k]]
    assert len(monthly) == 12 and len({(when[k].year, when[k].month) for k in monthly}) == 12
    for k in monthly[:-1]:
        assert (when[k] + timedelta(days=1)).day == 1, (k, when[k])
    # Kept once though picked by several rules: the total is the union, not the sum.
    assert len(plan.keep) == len(set(daily) | set(weekly) | set(monthly))
    assert len(plan.keep) < 30 + 13 + 12
    newest = max(when, key=lambda k: when[k])
    assert plan.why[newest].startswith("kept: newest copy of r; daily ")
    assert all(plan.why[k].startswith("pruned:") for k in plan.prune)
    # The oldest copy kept is the newest of a month a year back, nothing older.
    assert min(kept) >= now - timedelta(days=366)


def test_several_copies_a_day_keep_the_days_newest() -> None:
    base = datetime(2026, 6, 10, tzinfo=UTC)
    entries = [(f"r/step-{i:08d}", base + timedelta(hours=i)) for i in range(6)]
    plan = plan_retention(entries, base + timedelta(days=1), Retention(daily=3, weekly=0, monthly=0))
    assert plan.keep == ["r/step-00000005"]
    assert len(plan.prune) == 5


def test_gaps_count_days_that_have_a_copy_not_calendar_days() -> None:
    # Copies on 5 days spread over two months: keep-daily 3 keeps the newest 3 of those days.
    days = ["2026-03-01", "2026-03-20", "2026-04-02", "2026-04-28", "2026-04-30"]
    entries = [(f"r/step-{i:08d}", at(d + "T01:00:00Z")) for i, d in enumerate(days)]
    plan = plan_retention(entries, at("2026-06-01T00:00:00Z"), Retention(daily=3, weekly=0, monthly=0))
    assert plan.keep == ["r/step-00000002", "r/step-00000003", "r/step-00000004"]


def test_a_year_boundary_and_iso_week_53() -> None:
    # 2026 has an ISO week 53 (Mon 28 Dec 2026 .. Sun 3 Jan 2027): 31 Dec and 2 Jan share it.
    entries = [
        ("r/step-00000001", at("2026-12-27T02:00:00Z")),  # 2026-W52 (Sunday)
        ("r/step-00000002", at("2026-12-31T02:00:00Z")),  # 2026-W53, December
        ("r/step-00000003", at("2027-01-02T02:00:00Z")),  # 2026-W53, January
        ("r/step-00000004", at("2027-01-05T02:00:00Z")),  # 2027-W01
    ]
    now = at("2027-01-06T00:00:00Z")
    weekly = plan_retention(entries, now, Retention(daily=0, weekly=3, monthly=0))
    assert weekly.keep == ["r/step-00000001", "r/step-00000003", "r/step-00000004"]
    assert "weekly 2026-W53" in weekly.why["r/step-00000003"]
    monthly = plan_retention(entries, now, Retention(daily=0, weekly=0, monthly=2))
    assert monthly.keep == ["r/step-00000002", "r/step-00000004"]
    assert "monthly 2026-12" in monthly.why["r/step-00000002"]


def test_the_newest_copy_of_every_run_is_kept_and_runs_keep_their_own_history() -> None:
    old = [
        ("old/step-00000900", at("2025-01-01T00:00:00Z")),
        ("old/step-00000800", at("2024-12-01T00:00:00Z")),
    ]
    new = daily_copies("new", at("2026-01-01T00:00:00Z"), 5)
    plan = plan_retention(old + new, at("2026-02-01T00:00:00Z"), Retention(daily=2, weekly=0, monthly=0))
    # Per run: old's two days are its own newest two, whatever new did since.
    assert "old/step-00000900" in plan.keep and "old/step-00000800" in plan.keep
    assert [k for k in plan.keep if k.startswith("new/")] == ["new/step-00000003", "new/step-00000004"]
    none = plan_retention(old + new, at("2026-02-01T00:00:00Z"), Retention(daily=0, weekly=0, monthly=0))
    assert none.keep == ["old/step-00000900", "new/step-00000004"]
    assert none.why["old/step-00000900"] == "kept: newest copy of old"


def test_a_copy_dated_after_now_is_kept_and_named() -> None:
    entries = [
        ("r/step-00000001", at("2026-05-01T00:00:00Z")),
        ("r/step-00000002", at("2026-05-03T00:00:00Z")),
    ]
    plan = plan_retention(entries, at("2026-05-02T00:00:00Z"), Retention(daily=0, weekly=0, monthly=0))
    assert plan.keep == ["r/step-00000002"] and "dated after now" in plan.why["r/step-00000002"]


def test_a_negative_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="keep-weekly"):
        Retention(weekly=-1)


def test_labctl_now_sets_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LABCTL_NOW", "2027-03-01T02:00:00Z")
    assert clock.now() == datetime(2027, 3, 1, 2, 0, tzinfo=UTC)
    monkeypatch.setenv("LABCTL_NOW", "2027-03-01T04:00:00+02:00")
    assert clock.now() == datetime(2027, 3, 1, 2, 0, tzinfo=UTC)
    monkeypatch.setenv("LABCTL_NOW", "2027-03-01")
    assert clock.now() == datetime(2027, 3, 1, tzinfo=UTC)
    monkeypatch.setenv("LABCTL_NOW", "next tuesday")
    with pytest.raises(InputError, match="LABCTL_NOW"):
        clock.now()
    # A local time whose UTC is in the year 10000: named, not an OverflowError.
    monkeypatch.setenv("LABCTL_NOW", "9999-12-31T23:00:00-05:00")
    with pytest.raises(InputError, match="outside the years 1-9999"):
        clock.now()
    monkeypatch.delenv("LABCTL_NOW")
    assert clock.now().tzinfo is not None


def test_an_older_step_backed_up_after_a_newer_one_never_costs_the_newer_copy() -> None:
    # Step 800 backed up first; the host's 800 went bad, so the next backup took 600, later the same day.
    entries = [
        ("r/step-00000800", at("2026-11-01T03:00:00Z")),
        ("r/step-00000600", at("2026-11-01T15:00:00Z")),
    ]
    plan = plan_retention(entries, at("2026-11-01T16:00:00Z"), Retention())
    assert "r/step-00000800" in plan.keep and plan.newest == {"r": "r/step-00000800"}
    assert plan.why["r/step-00000800"].startswith("kept: newest copy of r")
    none = plan_retention(entries, at("2026-11-01T16:00:00Z"), Retention(daily=0, weekly=0, monthly=0))
    assert none.keep == ["r/step-00000800"] and none.prune == ["r/step-00000600"]


def test_a_damaged_copy_is_never_the_newest_good_one_and_retention_leaves_it() -> None:
    entries = [
        ("r/step-00000400", at("2026-11-01T03:00:00Z")),
        ("r/step-00000600", at("2026-11-02T03:00:00Z")),
        ("r/step-00000800", at("2026-11-03T03:00:00Z")),
    ]
    plan = plan_retention(
        entries,
        at("2026-11-04T00:00:00Z"),
        Retention(daily=0, weekly=0, monthly=0),
        damaged={"r/step-00000800"},
    )
    assert plan.newest == {"r": "r/step-00000600"}
    assert plan.keep == ["r/step-00000600", "r/step-00000800"] and plan.prune == ["r/step-00000400"]
    assert "damaged" in plan.why["r/step-00000800"]
    # A damaged copy fills no rule's day: that day's good copy is the one kept for it.
    same_day = [
        ("r/step-00000001", at("2026-11-01T03:00:00Z")),
        ("r/step-00000002", at("2026-11-01T04:00:00Z")),
        ("r/step-00000009", at("2026-11-05T04:00:00Z")),
    ]
    daily = plan_retention(
        same_day,
        at("2026-11-06T00:00:00Z"),
        Retention(daily=2, weekly=0, monthly=0),
        damaged={"r/step-00000002"},
    )
    assert daily.prune == [] and "daily 2026-11-01" in daily.why["r/step-00000001"]


@st.composite
def libraries(draw: st.DrawFn) -> tuple[list[tuple[str, datetime]], set[str], datetime, Retention]:
    """Backups of up to 3 runs, steps in any order, some damaged, some dated after now, any rules."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    entries: list[tuple[str, datetime]] = []
    damaged: set[str] = set()
    for run in draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True)):
        steps = draw(st.lists(st.integers(0, 10**6), min_size=1, max_size=25, unique=True))
        for step in steps:  # drawn in any order: the order the backups happened in
            key = f"{run}/step-{step:08d}"
            entries.append((key, start + timedelta(minutes=draw(st.integers(0, 800 * 24 * 60)))))
            if draw(st.booleans()):
                damaged.add(key)
    now = start + timedelta(days=draw(st.integers(0, 800)))
    policy = Retention(*(draw(st.integers(0, 40)) for _ in range(3)))
    return entries, damaged, now, policy


@given(libraries())
def test_retention_never_removes_a_runs_newest_verified_copy(
    library: tuple[list[tuple[str, datetime]], set[str], datetime, Retention],
) -> None:
    entries, damaged, now, policy = library
    plan = plan_retention(entries, now, policy, damaged=damaged)
    keys = {k for k, _ in entries}
    assert set(plan.keep) | set(plan.prune) == keys and not set(plan.keep) & set(plan.prune)
    for run in {k.split("/")[0] for k in keys}:
        good = [k for k in keys if k.startswith(run + "/") and k not in damaged]
        if good:
            newest = max(good, key=lambda k: int(k.rsplit("-", 1)[1]))
            assert newest in plan.keep and plan.newest[run] == newest, (run, plan.why)
    assert not damaged & set(plan.prune)
