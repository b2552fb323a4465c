"""plan week's schedule (pure): quotas, session lengths, chains of checkpoints, infeasible plans."""

from __future__ import annotations

import itertools
from datetime import date
from typing import Any

import pytest

from labctl.output.errors import InputError
from labctl.plan.schedule import DAY, WEEK, WeekPlan, intervals, schedule
from labctl.plan.spec import PlanFile

MONDAY = date(2026, 11, 23)

SEED_001: dict[str, Any] = {
    "platforms": [
        {"name": "kaggle", "gpu": "P100", "weekly_hours": 30, "max_session_hours": 12},
        {"name": "sagemaker", "gpu": "V100", "weekly_hours": 28, "max_session_hours": 4, "daily_hours": 4},
    ],
    "jobs": [
        {
            "name": "main",
            "phase": 1,
            "steps_left": 50000,
            "tokens_per_step": 65536,
            "tokens_per_s": {"V100": 9000},
        },
        {
            "name": "mgr",
            "steps_left": 900,
            "tokens_per_step": 32768,
            "tokens_per_s": {"P100": 4000},
            "priority": 1,
        },
    ],
}

# Windows, a daily limit that sessions cross midnight against, a lab platform, three jobs.
BUSY: dict[str, Any] = {
    "platforms": [
        {"name": "kaggle", "gpu": "P100", "weekly_hours": 30, "max_session_hours": 12},
        {
            "name": "sagemaker",
            "gpu": "V100",
            "weekly_hours": 28,
            "max_session_hours": 3,
            "daily_hours": 4,
            "windows": [{"start": "20:00", "end": "24:00"}, {"start": "00:00", "end": "02:00"}],
        },
        {
            "name": "m5",
            "gpu": "Tesla V100-PCIE-32GB",
            "lab": True,
            "weekly_hours": 40,
            "max_session_hours": 5,
            "daily_hours": 7,
            "windows": [{"days": ["mon", "wed", "fri", "sun"], "start": "01:00", "end": "09:00"}],
        },
    ],
    "jobs": [
        {"name": "a", "steps_left": 500000, "tokens_per_step": 8192, "tokens_per_s": {"V100": 5000}},
        {"name": "b", "steps_left": 700, "tokens_per_step": 16384, "tokens_per_s": {"P100": 3000}},
        {"name": "c", "steps_left": 60, "from_step": 1200, "tokens_per_step": 4096, "tokens_per_s": {"T4": 800},
         "checkpoint_minutes": 25, "gpus": ["V100"]},
    ],
}  # fmt: skip


def plan_of(doc: dict[str, Any]) -> PlanFile:
    return PlanFile.model_validate(doc)


def week_of(doc: dict[str, Any], start: date = MONDAY) -> WeekPlan:
    return schedule(plan_of(doc), {}, start)


def minutes_per_day(week: WeekPlan, platform: str) -> list[int]:
    days = [0] * 7
    for s in week.sessions:
        if s.platform != platform:
            continue
        for m in range(s.start, s.end):
            days[m // DAY] += 1
    return days


@pytest.mark.parametrize("doc", [SEED_001, BUSY], ids=["seed001", "busy"])
def test_quotas_session_lengths_and_windows_hold(doc: dict[str, Any]) -> None:
    plan = plan_of(doc)
    week = schedule(plan, {}, MONDAY)
    assert week.sessions
    for p in plan.platforms:
        mine = [s for s in week.sessions if s.platform == p.name]
        assert sum(s.minutes for s in mine) <= p.weekly_hours * 60
        if p.daily_hours is not None:
            assert max(minutes_per_day(week, p.name)) <= p.daily_hours * 60
        spans = intervals(p, MONDAY)
        for s in mine:
            assert 0 < s.minutes <= p.max_session_hours * 60
            assert 0 <= s.start < s.end <= WEEK
            assert any(a <= s.start and s.end <= b for a, b in spans), (s, spans)
        # one session at a time on a platform
        ordered = sorted(mine, key=lambda s: s.start)
        assert all(x.end <= y.start for x, y in itertools.pairwise(ordered))
        use = next(u for u in week.platforms if u.platform.name == p.name)
        assert use.used_minutes == sum(s.minutes for s in mine)
        assert use.unused_minutes == max(round(p.weekly_hours * 60) - use.used_minutes, 0)


@pytest.mark.parametrize("doc", [SEED_001, BUSY], ids=["seed001", "busy"])
def test_a_jobs_sessions_never_overlap_and_chain_step_to_step(doc: dict[str, Any]) -> None:
    plan = plan_of(doc)
    week = schedule(plan, {}, MONDAY)
    for job in plan.jobs:
        mine = sorted((s for s in week.sessions if s.job == job.name), key=lambda s: s.start)
        outcome = next(o for o in week.jobs if o.job.name == job.name)
        assert all(x.end <= y.start for x, y in itertools.pairwise(mine)), "one job in two places at once"
        assert all(x.to_step == y.from_step for x, y in itertools.pairwise(mine)), "a step lost or repeated"
        assert all(s.steps > 0 for s in mine)
        if mine:
            assert mine[0].from_step == job.from_step
            assert mine[-1].to_step - job.from_step == outcome.steps_scheduled
        assert sum(s.steps for s in mine) == outcome.steps_scheduled <= job.steps_left
        # every session but a finished job's last hands a checkpoint on; each later one resumes from it
        assert all(s.hands_off for s in mine[:-1])
        assert all(s.resumes for s in mine[1:])
        if outcome.finished_at is not None:
            assert outcome.steps_scheduled == job.steps_left and not mine[-1].hands_off
            assert outcome.finished_at == mine[-1].end and outcome.finishes_in_week == 1
        else:
            assert all(s.hands_off for s in mine)
            assert outcome.steps_left_after == job.steps_left - outcome.steps_scheduled > 0


def test_a_session_leaves_room_for_its_checkpoint() -> None:
    week = week_of(SEED_001)
    for s in week.sessions:
        job = next(j for j in plan_of(SEED_001).jobs if j.name == s.job)
        train_minutes = s.steps * job.tokens_per_step / s.rate.tokens_per_s / 60
        assert train_minutes + job.checkpoint_minutes <= s.minutes + 1e-9


def test_seed_001_uses_the_58_hours_and_says_when_jobs_finish() -> None:
    week = week_of(SEED_001)
    used = {u.platform.name: u.used_minutes for u in week.platforms}
    assert used == {"kaggle": 30 * 60, "sagemaker": 28 * 60}
    main, mgr = week.jobs
    assert mgr.finished_at is not None  # 900 steps fit
    assert main.finished_at is None and main.finishes_in_week is not None and main.finishes_in_week > 1
    doc = week.to_json()
    assert {j["job"]: j["finished"] for j in doc["jobs"]} == {"main": False, "mgr": True}


def test_job_limited_to_a_gpu_runs_only_there_from_its_checkpoint() -> None:
    week = week_of(BUSY)
    c = [s for s in week.sessions if s.job == "c"]
    assert c and {s.platform for s in c} <= {"sagemaker", "m5"}
    assert c[0].from_step == 1200 and c[0].resumes


def test_a_job_nothing_can_run_is_reported_not_scheduled() -> None:
    doc = {**SEED_001, "jobs": [{**SEED_001["jobs"][0], "steps_left": 10**9}]}
    week = week_of(doc)
    (only,) = week.jobs
    assert only.finished_at is None and only.steps_left_after > 0


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            lambda d: d["jobs"][0].update(gpus=["A100"]),
            "job main needs a GPU of type A100; no platform has one",
        ),
        (
            lambda d: [p.update(weekly_hours=0) for p in d["platforms"]],
            "every platform's weekly_hours is 0",
        ),
        (
            lambda d: d["platforms"][1].update(max_session_hours=0.25),
            "platform sagemaker's longest session (0.25 h) is no longer than job main's checkpoint margin (30 min)",
        ),
        (
            lambda d: d["jobs"][1].update(tokens_per_s={"Mystery 9000": 100}),
            "job mgr has no tokens/s on any platform's GPU",
        ),
    ],
    ids=["gpu-nobody-has", "zero-quotas", "session-shorter-than-checkpoint", "no-throughput"],
)
def test_infeasible_plans_are_refused_with_the_reason(change: Any, says: str) -> None:
    import copy

    doc = copy.deepcopy(SEED_001)
    doc["jobs"][0]["checkpoint_minutes"] = 30
    change(doc)
    with pytest.raises(InputError) as e:
        week_of(doc)
    assert says in e.value.message
    assert e.value.exit_code == 2


def test_windows_follow_the_weekday_of_the_start() -> None:
    plan = plan_of(BUSY)
    m5 = plan.platforms[2]
    # Monday start: mon, wed, fri, sun are days 0, 2, 4, 6; a Tuesday start shifts them to 6, 1, 3, 5.
    assert [a // DAY for a, _ in intervals(m5, MONDAY)] == [0, 2, 4, 6]
    assert [a // DAY for a, _ in intervals(m5, date(2026, 11, 24))] == [1, 3, 5, 6]


def test_the_same_input_gives_the_same_week() -> None:
    assert week_of(BUSY).to_json() == week_of(BUSY).to_json()
