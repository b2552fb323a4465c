"""The week as a Gantt chart (PNG): one row per platform, one bar per session, coloured by job."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from labctl.plan.schedule import WeekPlan


def write_gantt(week: WeekPlan, path: Path) -> None:
    # matplotlib is optional (the `plot` extra) and slow to import: only here, headless.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [u.platform.name for u in week.platforms]
    jobs = [o.job.name for o in week.jobs]
    colours = {j: plt.get_cmap("tab10")(i % 10) for i, j in enumerate(jobs)}
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.7 * len(names)))
    for s in week.sessions:
        row = names.index(s.platform)
        ax.barh(
            row,
            (s.end - s.start) / 60,
            left=s.start / 60,
            color=colours[s.job],
            edgecolor="black",
            height=0.6,
        )
        if s.end - s.start >= 120:
            ax.text(
                (s.start + s.end) / 120,
                row,
                f"{s.from_step}→{s.to_step}",
                ha="center",
                va="center",
                fontsize=7,
            )
    ax.set_yticks(range(len(names)), [f"{u.platform.name} ({u.platform.gpu})" for u in week.platforms])
    ax.set_xticks([d * 24 for d in range(8)], [week.at(d * 24 * 60).strftime("%a %d") for d in range(8)])
    ax.set_xlim(0, 7 * 24)
    ax.invert_yaxis()
    ax.grid(axis="x", linestyle=":")
    handles = [matplotlib.patches.Patch(color=colours[j], label=j) for j in jobs]
    ax.legend(handles=handles, loc="upper right", fontsize=8)
    ax.set_title(f"Training sessions, week of {week.start.isoformat()}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
