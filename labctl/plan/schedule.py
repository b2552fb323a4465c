"""A week of training sessions over the platforms' quotas, as data: pure (no clock, no I/O).

Time is whole minutes from the week's start (00:00 of `start`); no session starts before the
plan's own start (`WeekPlan.first`: a time of day given with `start`, by default the next whole hour
from now, see `plan_start`), so a plan made at 15:00 never books the morning. Each platform runs one session
at a time; one job never runs in two places at once, so its sessions form a chain: each but
the last of the week ends with a checkpoint (its last `checkpoint_minutes` kept free for the
write) that the next session resumes from. Greedy and deterministic: the earliest free slot
of any platform (ties: the file's order) goes to the first job by priority that is free then
and has a throughput on that platform's GPU; a session is as long as the platform allows
(longest session, weekly and daily quota, its window) or as the job still needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from typing import Any

from labctl.output.errors import InputError
from labctl.plan.spec import DAYS, Job, PlanFile, Platform, clock_minutes
from labctl.plan.throughput import TABLE_SOURCE, Measured, Rate, gpu_key, rate_for

DAY = 24 * 60
WEEK = 7 * DAY
# The last day a week can start on: its end (the 8th day's 00:00) is datetime.max's day at 24:00.
LAST_START = date.max - timedelta(days=7)


@dataclass(frozen=True)
class Session:
    job: str
    platform: str
    gpu: str
    start: int  # minutes from the week's start
    end: int
    from_step: int
    to_step: int
    hands_off: bool  # ends with a checkpoint the job's next session resumes from
    resumes: bool  # starts from a checkpoint (an earlier session's, or the job's own from_step)
    rate: Rate

    @property
    def steps(self) -> int:
        return self.to_step - self.from_step

    @property
    def minutes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class PlatformUse:
    platform: Platform
    used_minutes: int
    days: list[int]  # minutes used on each of the week's 7 days

    @property
    def unused_minutes(self) -> int:
        return max(round(self.platform.weekly_hours * 60) - self.used_minutes, 0)


@dataclass(frozen=True)
class JobOutcome:
    job: Job
    steps_scheduled: int
    finished_at: int | None  # minutes from the week's start; None: not this week

    @property
    def steps_left_after(self) -> int:
        return self.job.steps_left - self.steps_scheduled

    @property
    def finishes_in_week(self) -> int | None:
        """1 for this week; later weeks at this week's pace (None: no progress at all this week)."""
        if self.finished_at is not None:
            return 1
        if self.steps_scheduled <= 0:
            return None
        return 1 + math.ceil(self.steps_left_after / self.steps_scheduled)


@dataclass(frozen=True)
class WeekPlan:
    start: date
    sessions: list[Session]
    platforms: list[PlatformUse]
    jobs: list[JobOutcome]
    rates: dict[tuple[str, str], Rate] = field(default_factory=dict)  # (job, platform) -> rate
    first: int = 0  # minutes from the week's start before which no session starts (the plan's start)

    def at(self, minute: int) -> datetime:
        return datetime.combine(self.start, datetime.min.time()) + timedelta(minutes=minute)

    def to_json(self) -> dict[str, Any]:
        def hours(m: int) -> float:
            return round(m / 60, 2)

        return {
            "start": self.start.isoformat(),
            "plan_from": self.at(self.first).isoformat(timespec="minutes"),
            "throughput_table": TABLE_SOURCE,
            "sessions": [
                {
                    "job": s.job,
                    "platform": s.platform,
                    "gpu": s.gpu,
                    "start": self.at(s.start).isoformat(timespec="minutes"),
                    "end": self.at(s.end).isoformat(timespec="minutes"),
                    "hours": hours(s.minutes),
                    "from_step": s.from_step,
                    "to_step": s.to_step,
                    "steps": s.steps,
                    "resumes_from_checkpoint": s.resumes,
                    "ends_with_checkpoint": s.hands_off,
                    "tokens_per_s": round(s.rate.tokens_per_s, 1),
                    "throughput": s.rate.source,
                    "throughput_basis": s.rate.basis,
                }
                for s in self.sessions
            ],
            "platforms": [
                {
                    "platform": u.platform.name,
                    "gpu": u.platform.gpu,
                    "lab": u.platform.lab,
                    "quota_hours": u.platform.weekly_hours,
                    "used_hours": hours(u.used_minutes),
                    "unused_hours": hours(u.unused_minutes),
                    "daily_hours": [hours(m) for m in u.days],
                }
                for u in self.platforms
            ],
            "jobs": [
                {
                    "job": o.job.name,
                    "phase": o.job.phase,
                    "steps_left": o.job.steps_left,
                    "steps_scheduled": o.steps_scheduled,
                    "steps_left_after": o.steps_left_after,
                    "finished": o.finished_at is not None,
                    "finishes_at": self.at(o.finished_at).isoformat(timespec="minutes")
                    if o.finished_at is not None
                    else None,
                    "finishes_in_week": o.finishes_in_week,
                }
                for o in self.jobs
            ],
            "throughput": [
                {
                    "job": j,
                    "platform": p,
                    "tokens_per_s": round(r.tokens_per_s, 1),
                    "source": r.source,
                    "basis": r.basis,
                }
                for (j, p), r in self.rates.items()
            ],
        }


def allowed(job: Job, platform: Platform) -> bool:
    return not job.gpus or gpu_key(platform.gpu) in {gpu_key(g) for g in job.gpus}


def all_rates(plan: PlanFile, measured: dict[tuple[int, str], Measured]) -> dict[tuple[str, str], Rate]:
    out = {}
    for job in plan.jobs:
        for p in plan.platforms:
            if allowed(job, p):
                r = rate_for(job, p.gpu, measured)
                if r is not None:
                    out[(job.name, p.name)] = r
    return out


def check_feasible(plan: PlanFile, rates: dict[tuple[str, str], Rate]) -> None:
    """Every reason the plan cannot be scheduled at all, as one InputError (exit 2)."""
    reasons = []
    have = ", ".join(f"{p.name} ({p.gpu})" for p in plan.platforms)
    if sum(p.weekly_hours for p in plan.platforms) <= 0:
        reasons.append("every platform's weekly_hours is 0: there is no time to plan")
    for job in plan.jobs:
        places = [p for p in plan.platforms if allowed(job, p)]
        if not places:
            reasons.append(
                f"job {job.name} needs a GPU of type {', '.join(job.gpus)}; no platform has one ({have})"
            )
            continue
        if not any((job.name, p.name) in rates for p in places):
            where = f"phase {job.phase}" if job.phase is not None else "a phase (none given)"
            reasons.append(
                f"job {job.name} has no tokens/s on any platform's GPU: no `labctl train` run of {where} "
                "on the lab, no tokens_per_s in the plan for these GPUs or for one the scaling table knows"
            )
        for p in places:
            for what, hours in (("longest session", p.max_session_hours), ("daily limit", p.daily_hours)):
                if hours is not None and hours * 60 <= job.checkpoint_minutes:
                    reasons.append(
                        f"platform {p.name}'s {what} ({hours:g} h) is no longer than job {job.name}'s "
                        f"checkpoint margin ({job.checkpoint_minutes:g} min): no step fits before the checkpoint"
                    )
    if reasons:
        raise InputError(
            "The plan cannot be scheduled:\n  " + "\n  ".join(reasons),
            "Fix the plan file: add a platform with that GPU or drop the job's gpus list, give tokens_per_s "
            "(or run `labctl train --phase N` on the lab to measure it), raise the quotas, or shorten checkpoint_minutes.",
        )


def intervals(p: Platform, start: date) -> list[tuple[int, int]]:
    """The week's minutes when `p` may run, as sorted, merged (start, end) pairs."""
    if not p.windows:
        return [(0, WEEK)]
    spans = []
    for d in range(7):
        weekday = DAYS[(start.weekday() + d) % 7]
        for w in p.windows:
            if weekday in w.days:
                spans.append((d * DAY + clock_minutes(w.start), d * DAY + clock_minutes(w.end)))
    merged: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


class _Platform:
    """One platform's bookkeeping while the week is filled."""

    def __init__(self, p: Platform, start: date, first: int) -> None:
        self.p = p
        self.spans = intervals(p, start)
        self.cursor = first
        self.weekly_left = math.floor(p.weekly_hours * 60)
        self.daily = None if p.daily_hours is None else math.floor(p.daily_hours * 60)
        self.days = [0] * 7

    def room(self, s: int, end: int) -> int:
        """Minutes from `s` (at most up to `end`) that the daily limit allows in one stretch."""
        if self.daily is None:
            return end - s
        t = s
        while t < end:
            day = t // DAY
            free = self.daily - self.days[day]
            stretch = min(end, (day + 1) * DAY) - t
            if free < stretch:
                return t - s + max(free, 0)
            t += stretch
        return end - s

    def next_slot(self) -> tuple[int, int] | None:
        """(start, longest length) of the next session this platform can hold, or None."""
        t = self.cursor
        while self.weekly_left > 0 and t < WEEK:
            span = next(((a, b) for a, b in self.spans if b > t), None)
            if span is None:
                return None
            s = max(t, span[0])
            end = min(s + math.floor(self.p.max_session_hours * 60), s + self.weekly_left, span[1], WEEK)
            length = self.room(s, end)
            if length > 0:
                return s, length
            t = (s // DAY + 1) * DAY  # today's allowance is spent
        return None

    def use(self, s: int, e: int) -> None:
        self.weekly_left -= e - s
        self.cursor = e
        t = s
        while t < e:
            day = t // DAY
            stretch = min(e, (day + 1) * DAY) - t
            self.days[day] += stretch
            t += stretch


def plan_start(now: datetime) -> datetime:
    """The first whole hour at or after `now`: where a plan made now puts its first session."""
    hour = now.replace(minute=0, second=0, microsecond=0)
    return hour if hour == now else hour + timedelta(hours=1)


def schedule(plan: PlanFile, measured: dict[tuple[int, str], Measured], start: date | datetime) -> WeekPlan:
    """The week of `start`'s day; no session before `start`'s time of day (a date: 00:00).

    Infeasible plans are an InputError naming why.
    """
    if isinstance(start, datetime):  # a datetime is a date too: test it first
        day = start.date()
        opens = math.ceil((start - datetime.combine(day, time())).total_seconds() / 60)
    else:
        day, opens = start, 0
    if day > LAST_START:
        raise InputError(
            f"--start {day.isoformat()}: the week would end after the last date Python can represent "
            f"({date.max.isoformat()}).",
            f"Give --start {LAST_START.isoformat()} or earlier.",
        )
    rates = all_rates(plan, measured)
    check_feasible(plan, rates)
    order = sorted(plan.jobs, key=lambda j: j.priority)  # sorted() is stable: the file's order breaks ties
    done = {j.name: 0 for j in plan.jobs}
    free_at = {j.name: 0 for j in plan.jobs}
    finished_at: dict[str, int] = {}
    books = [_Platform(p, day, opens) for p in plan.platforms]
    sessions: list[Session] = []
    while True:
        slots = [(slot, i) for i, b in enumerate(books) if (slot := b.next_slot()) is not None]
        if not slots:
            break
        (s, length), i = min(slots)
        book = books[i]
        runnable = [j for j in order if j.name not in finished_at and (j.name, book.p.name) in rates]
        if not runnable:
            book.cursor = WEEK
            continue
        free = [j for j in runnable if free_at[j.name] <= s]
        if not free:
            book.cursor = min(free_at[j.name] for j in runnable)
            continue
        job = free[0]
        rate = rates[(job.name, book.p.name)]
        margin = math.ceil(job.checkpoint_minutes)
        per_minute = rate.tokens_per_s * 60 / job.tokens_per_step  # steps a minute
        left = job.steps_left - done[job.name]
        need = math.ceil(left / per_minute) + margin
        if need <= length:
            steps, end, last = left, s + need, True
        else:
            steps, end, last = min(math.floor((length - margin) * per_minute), left), s + length, False
            if steps < 1:  # too short for one step and the checkpoint: try later
                book.cursor = s + length
                continue
        first = job.from_step + done[job.name]
        sessions.append(
            Session(
                job.name,
                book.p.name,
                book.p.gpu,
                s,
                end,
                first,
                first + steps,
                hands_off=not last,
                resumes=first > 0,
                rate=rate,
            )
        )
        book.use(s, end)
        done[job.name] += steps
        free_at[job.name] = end
        if last:
            finished_at[job.name] = end
    return WeekPlan(
        day,
        sessions,
        [PlatformUse(b.p, sum(b.days), list(b.days)) for b in books],
        [JobOutcome(j, done[j.name], finished_at.get(j.name)) for j in plan.jobs],
        rates,
        opens,
    )
