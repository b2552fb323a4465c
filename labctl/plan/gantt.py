"""The week as a Gantt chart (PNG): one row per platform, one bar per session, coloured by job."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.figure import Figure
    from matplotlib.transforms import Bbox

    from labctl.plan.schedule import WeekPlan


def steps_label(n: int) -> str:
    """A step count short enough for a bar: 950, 9999, 12k, 12.3k, 1.3M (the table has it exact)."""
    if n < 10_000:
        return str(n)
    size, unit = (1_000, "k") if n < 1_000_000 else (1_000_000, "M")
    return f"{n / size:.1f}".removesuffix(".0") + unit


def gantt_figure(week: WeekPlan) -> Figure:
    """The chart as a Figure (drawn on Agg, no pyplot state), for write_gantt and for tests to inspect.

    Session bars carry gid "session:<index in week.sessions>". A bar's "from→to" label is kept only
    where it fits inside the bar (a run of back-to-back sessions of one job shares one label), so
    labels never overlap one another or a neighbour's bar.
    """
    # matplotlib is optional (the `plot` extra) and slow to import: only here, headless.
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from labctl.plan.schedule import DAY, WEEK

    names = [u.platform.name for u in week.platforms]
    jobs = [o.job.name for o in week.jobs]
    tab10 = colormaps["tab10"]
    colours = {j: tab10(i % 10) for i, j in enumerate(jobs)}
    fig = Figure(figsize=(12, 1.2 + 0.7 * len(names)), layout="constrained")
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    hours = WEEK / 60
    first = week.first / 60
    if week.first > 0:
        ax.axvspan(0, first, color="0.92", zorder=0)
    for i, s in enumerate(week.sessions):
        ax.barh(
            names.index(s.platform),
            s.minutes / 60,
            left=s.start / 60,
            color=colours[s.job],
            edgecolor="black",
            height=0.6,
            gid=f"session:{i}",
        )
    ax.axvline(first, color="black", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(names)), [f"{u.platform.name} ({u.platform.gpu})" for u in week.platforms])
    ax.set_xticks([d * 24 for d in range(8)], [week.at(d * DAY).strftime("%a %d %b") for d in range(8)])
    ax.set_xticks(range(0, 7 * 24, 6), minor=True)
    ax.set_xlim(0, hours)
    ax.set_ylim(len(names) - 0.5, -0.5)  # first platform on top
    ax.grid(axis="x", which="major", linestyle=":")
    ax.grid(axis="x", which="minor", linestyle=":", alpha=0.3)
    ax.set_ylabel("platform (GPU)")
    ax.set_xlabel("day (local time; minor ticks every 6 h)   bar labels: training steps from→to")
    handles: list[Artist] = [Patch(facecolor=colours[j], edgecolor="black", label=f"job {j}") for j in jobs]
    handles.append(
        Line2D([], [], color="black", linestyle="--", label=f"plan starts {week.at(week.first):%a %H:%M}")
    )
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0)
    ax.set_title(
        f"Training sessions by platform, {week.at(week.first):%a %d %b %Y %H:%M} to "
        f"{week.at(WEEK):%a %d %b %Y %H:%M}"
    )
    # Labels are measured where they will be drawn: lay the figure out once, then freeze it.
    canvas.draw()
    fig.set_layout_engine("none")
    renderer = canvas.get_renderer()
    placed: list[Bbox] = []
    for row, start, end, label in _label_spans(week, names):
        (x0, _), (x1, _) = ax.transData.transform([(start / 60, row), (end / 60, row)])
        for size in (8, 7):
            text = ax.text(
                (start + end) / 120,
                row,
                label,
                ha="center",
                va="center",
                fontsize=size,
                bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "alpha": 0.8, "linewidth": 0},
            )
            box = text.get_window_extent(renderer)
            if box.width + 6 <= x1 - x0 and not any(box.overlaps(p) for p in placed):
                placed.append(box)
                break
            text.remove()  # too narrow even so: the table lists every session's steps
    return fig


def _label_spans(week: WeekPlan, names: list[str]) -> list[tuple[int, int, int, str]]:
    """(row, start, end, "from→to") per run of back-to-back sessions of one job on one platform.

    Short sessions in a row (a 2 h quota, say) are too narrow for a label each; their run is not.
    """
    spans: list[tuple[int, int, int, int, int, str]] = []  # row, start, end, from, to, job
    for s in sorted(week.sessions, key=lambda s: (names.index(s.platform), s.start)):
        row = names.index(s.platform)
        if spans and spans[-1][0] == row and spans[-1][2] == s.start and spans[-1][5] == s.job:
            spans[-1] = (row, spans[-1][1], s.end, spans[-1][3], s.to_step, s.job)
        else:
            spans.append((row, s.start, s.end, s.from_step, s.to_step, s.job))
    return [(row, a, b, f"{steps_label(f)}→{steps_label(t)}") for row, a, b, f, t, _ in spans]


def write_gantt(week: WeekPlan, path: Path) -> None:
    from labctl.output.files import save_figure

    save_figure(gantt_figure(week), path, dpi=100)
