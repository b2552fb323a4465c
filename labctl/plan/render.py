"""`labctl plan week`'s tables: the sessions, the platforms' hours, the jobs' outcome."""

from __future__ import annotations

from typing import TYPE_CHECKING

from labctl.plan.throughput import TABLE_SOURCE

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console

    from labctl.plan.schedule import WeekPlan


def render(console: Console, week: WeekPlan) -> None:
    from rich.table import Table

    t = Table(title=f"Training sessions, week of {week.start.isoformat()}", title_justify="left")
    for col in ("job", "platform", "start", "end", "hours", "steps", "checkpoint", "tokens/s"):
        t.add_column(col, justify="right" if col in ("hours", "tokens/s") else "left")
    for s in week.sessions:
        steps = f"{s.from_step} → {s.to_step}"
        hand = (
            "resume → save"
            if s.resumes and s.hands_off
            else "save"
            if s.hands_off
            else "resume"
            if s.resumes
            else ""
        )
        t.add_row(
            s.job,
            f"{s.platform} ({s.gpu})",
            week.at(s.start).strftime("%a %d %H:%M"),
            week.at(s.end).strftime("%a %d %H:%M"),
            f"{s.minutes / 60:.1f}",
            steps,
            hand,
            f"{s.rate.tokens_per_s:,.0f} {s.rate.source}",
        )
    console.print(t)

    p = Table(title="Hours per platform", title_justify="left")
    for col in ("platform", "gpu", "quota h", "used h", "unused h"):
        p.add_column(col, justify="left" if col in ("platform", "gpu") else "right")
    for u in week.platforms:
        name = u.platform.name + (" (lab)" if u.platform.lab else "")
        p.add_row(
            name,
            u.platform.gpu,
            f"{u.platform.weekly_hours:g}",
            f"{u.used_minutes / 60:.1f}",
            f"{u.unused_minutes / 60:.1f}",
        )
    console.print(p)

    j = Table(title="Jobs", title_justify="left")
    for col in ("job", "steps left", "this week", "left after", "finishes"):
        j.add_column(col, justify="left" if col in ("job", "finishes") else "right")
    for o in week.jobs:
        if o.finished_at is not None:
            when = week.at(o.finished_at).strftime("%a %d %H:%M") + " (this week)"
        elif o.finishes_in_week is None:
            when = "not at all: no session this week"
        else:
            when = f"week {o.finishes_in_week} at this week's pace"
        j.add_row(o.job.name, str(o.job.steps_left), str(o.steps_scheduled), str(o.steps_left_after), when)
    console.print(j)
    if any(r.source == "scaled" for r in week.rates.values()):
        console.print(
            f"Scaled tokens/s use {TABLE_SOURCE}; a measured run replaces them.",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
    else:
        console.print("No tokens/s was scaled.", markup=False, highlight=False)


def render_week(console: Console, result: WeekPlan, plan_file: Path, plot: Path | None) -> None:
    """`labctl plan week`: the plan file it read, the schedule, and the chart it wrote (--plot)."""
    console.print(f"plan: {plan_file}", markup=False, highlight=False, soft_wrap=True)
    render(console, result)
    if plot is not None:
        console.print(f"wrote {plot}", markup=False, highlight=False, soft_wrap=True)
