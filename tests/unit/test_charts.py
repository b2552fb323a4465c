"""The --plot charts as a reader sees them, read back from the drawn Figure (no pixel comparisons):
what each bar is made of, what is said about skipped stages and the speedup, when the week's
sessions start, and that no two texts overlap or leave the figure."""

from __future__ import annotations

import itertools
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from labctl.modelload.measure import write_plot
from labctl.modelload.stages import STAGES, attach_seed, make_stage, speedup_ram_vs_network
from labctl.plan.gantt import steps_label, write_gantt
from labctl.plan.schedule import schedule
from labctl.plan.spec import PlanFile
from tests.conftest import labctl
from tests.unit.test_plan_cli import lab

pytest.importorskip("matplotlib")


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every Figure the code under test saves, kept for inspection (the PNG is still written)."""
    from matplotlib.figure import Figure

    figures: list[Any] = []
    save = Figure.savefig

    def keep(self: Any, *args: Any, **kwargs: Any) -> None:
        save(self, *args, **kwargs)
        figures.append(self)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def shown_texts(fig: Any) -> list[Any]:
    """The texts a reader sees: non-empty, visible, and (tick labels) at a tick inside the axis."""
    from matplotlib.text import Text

    out = []
    for t in fig.findobj(Text):
        if not (t.get_visible() and t.get_text().strip()):
            continue
        axis = t.axes.xaxis if t.axes is not None and t in t.axes.get_xticklabels(which="both") else None
        if axis is None and t.axes is not None and t in t.axes.get_yticklabels(which="both"):
            axis = t.axes.yaxis
        if axis is not None:
            lo, hi = sorted(axis.get_view_interval())
            where = t.get_position()[0 if axis is t.axes.xaxis else 1]
            if not lo - 1e-9 <= where <= hi + 1e-9:
                continue
        out.append(t)
    return out


def assert_texts_apart_and_inside(fig: Any) -> None:
    fig.canvas.draw()  # at the figure's own dpi, as fig.bbox is (savefig may have drawn at another)
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in shown_texts(fig)]
    for text, box in boxes:
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, (
            f"{text!r} leaves the figure"
        )
    for (a, abox), (b, bbox) in itertools.combinations(boxes, 2):
        assert not abox.overlaps(bbox), f"{a!r} overlaps {b!r}"


def all_text(fig: Any) -> str:
    return "\n".join(" ".join(t.get_text().split()) for t in shown_texts(fig))


# --- bench model-load --plot ---------------------------------------------------------------


def load_result(measured: dict[str, dict[str, Any]], nbytes: int, device: str) -> dict[str, Any]:
    """A `bench model-load` result as measure_model_load builds it, from per-stage figures."""
    stages = [make_stage(n, measured.get(n)) for n in STAGES]
    attach_seed(stages, nbytes, bonded=False)
    return {
        "host": "m5",
        "model": "tinylm-2g",
        "device": device,
        "bytes": nbytes,
        "stages": [s.to_json() for s in stages],
        "speedup_ram_vs_network": speedup_ram_vs_network(stages),
    }


# No GPU here: a cuda:0 run's figures, made up in the shape the agent returns.
MOCK_GPU = load_result(
    {
        "network": {"bytes": 2e9, "seconds": 17.1},
        "storage_cold": {"bytes": 2e9, "seconds": 4.2},
        "ram_cache": {"bytes": 2e9, "seconds": 0.35},
        "h2d": {"bytes": 2e9, "seconds": 0.81},
        "cuda_init": {"seconds": 1.9},
        "warmup": {"seconds": 2.6},
        "forward": {"seconds": 0.04},
    },
    2_000_000_000,
    "cuda:0",
)
# --file on a CPU host: no network stage, no GPU stages (the agent's own reasons).
CPU_FILE = load_result(
    {
        "network": {"skipped": "--file: the model is already on the host"},
        "storage_cold": {"skipped": "--file: the model is already on the host"},
        "ram_cache": {"bytes": 5e8, "seconds": 0.09},
        "h2d": {"skipped": "no GPU here"},
        "cuda_init": {"skipped": "no GPU here"},
        "warmup": {"seconds": 7.4},
        "forward": {"seconds": 5.1},
    },
    500_000_000,
    "cpu",
)


def measured_bars(fig: Any) -> list[list[tuple[str, float, float]]]:
    """The solid bars, each as its (stage, left, width) segments; a stage known by its legend colour.

    Seed bars are lighter (alpha < 1) and match no legend colour, so they are not among these.
    """
    from matplotlib.colors import to_rgba
    from matplotlib.patches import Rectangle

    ax = fig.axes[0]
    legend = ax.get_legend()
    colour = {
        t.get_text(): to_rgba(h.get_facecolor())
        for t, h in zip(legend.get_texts(), legend.legend_handles, strict=True)
        if to_rgba(h.get_facecolor())[3] == 1.0
    }
    stage_of = {c: name for name, c in colour.items()}
    bars: dict[tuple[float, float], list[tuple[str, float, float]]] = {}
    for p in ax.patches:
        if isinstance(p, Rectangle) and to_rgba(p.get_facecolor()) in stage_of:
            bars.setdefault((round(p.get_y(), 6), round(p.get_height(), 6)), []).append(
                (stage_of[to_rgba(p.get_facecolor())], p.get_x(), p.get_width())
            )
    return [sorted(segs, key=lambda s: s[1]) for _key, segs in sorted(bars.items())]


def test_load_chart_draws_each_alternative_apart_with_the_tables_figures_mock_gpu(
    tmp_path: Path, drawn: list[Any]
) -> None:
    write_plot(MOCK_GPU, tmp_path / "load.png", datetime(2026, 11, 26, 9, 5))
    (fig,) = drawn
    seconds = {s["name"]: s["seconds"] for s in MOCK_GPU["stages"]}
    bars = measured_bars(fig)
    stages_of = [[name for name, _x, _w in bar] for bar in bars]
    network = [b for b in stages_of if "network" in b]
    ram = [b for b in stages_of if "ram_cache" in b]
    assert network and ram, stages_of
    assert not [b for b in stages_of if "network" in b and "ram_cache" in b], "one bar sums both alternatives"
    assert network == [["network", "h2d"]] and ram == [["ram_cache", "h2d"]]
    for bar in bars:
        left = 0.0
        for name, x, width in bar:  # stacked from 0, each segment the table's seconds
            assert x == pytest.approx(left) and width == pytest.approx(seconds[name]), (name, bar)
            left += width
    drawn_stages = [name for bar in stages_of for name in bar]
    assert sorted(set(drawn_stages)) == sorted(STAGES)  # every measured stage is on the chart
    assert drawn_stages.count("h2d") == 2 and drawn_stages.count("warmup") == 1
    text = all_text(fig)
    speedup = MOCK_GPU["speedup_ram_vs_network"]
    assert f"{speedup:.1f}x faster" in text  # the table's figure, on the chart
    assert "tinylm-2g" in text and "m5" in text and "2026-11-26 09:05" in text and "seconds" in text
    assert "skipped" not in text
    assert_texts_apart_and_inside(fig)


def test_load_chart_labels_skipped_stages_instead_of_dropping_them(tmp_path: Path, drawn: list[Any]) -> None:
    write_plot(CPU_FILE, tmp_path / "load.png", datetime(2026, 11, 26, 9, 5))
    (fig,) = drawn
    stages_of = [[name for name, _x, _w in bar] for bar in measured_bars(fig)]
    assert stages_of == [["ram_cache"], ["warmup", "forward"]]  # nothing drawn for what was not measured
    text = all_text(fig)
    for name in ("network", "storage_cold", "h2d", "cuda_init"):
        assert f"{name} (skipped)" in text, name  # in the legend
    assert "network skipped: --file: the model is already on the host" in text  # on its row
    assert "cuda_init: no GPU here" in text or "h2d, cuda_init: no GPU here" in text
    assert "faster" not in text  # no network figure: no speedup claimed
    assert_texts_apart_and_inside(fig)


# --- plan week --plot ----------------------------------------------------------------------

# Back-to-back 2 h sessions: far too narrow for a "from→to" label each.
CROWDED = PlanFile.model_validate(
    {
        "platforms": [
            {"name": "kaggle", "gpu": "P100", "weekly_hours": 30, "max_session_hours": 2},
            {
                "name": "sagemaker",
                "gpu": "V100",
                "weekly_hours": 28,
                "max_session_hours": 3,
                "daily_hours": 4,
            },
            {"name": "m5", "gpu": "V100", "lab": True, "weekly_hours": 60, "max_session_hours": 5},
        ],
        "jobs": [
            {
                "name": "main",
                "steps_left": 500000,
                "from_step": 123456,
                "tokens_per_step": 8192,
                "tokens_per_s": {"V100": 5000, "P100": 3000},
            },
            {"name": "mgr", "steps_left": 900, "tokens_per_step": 16384, "tokens_per_s": {"P100": 3000}},
        ],
    }
)


def test_week_chart_labels_never_overlap(tmp_path: Path, drawn: list[Any]) -> None:
    week = schedule(CROWDED, {}, datetime(2026, 11, 26, 15, 0))
    assert len(week.sessions) > 30
    write_gantt(week, tmp_path / "week.png")
    (fig,) = drawn
    assert_texts_apart_and_inside(fig)
    text = all_text(fig)
    assert "123.5k→" in text  # a run of short sessions still says where it starts
    assert "Thu 26 Nov 2026 15:00" in text and "platform" in text and "local time" in text


def test_week_starts_at_the_given_time_and_draws_nothing_before_it(tmp_path: Path, drawn: list[Any]) -> None:
    now = datetime(2026, 11, 26, 15, 0)
    week = schedule(CROWDED, {}, now)
    assert week.start.isoformat() == "2026-11-26" and week.at(week.first) == now
    assert week.sessions and all(week.at(s.start) >= now for s in week.sessions)
    write_gantt(week, tmp_path / "week.png")
    (fig,) = drawn
    bars = [p for p in fig.axes[0].patches if (p.get_gid() or "").startswith("session:")]
    assert len(bars) == len(week.sessions)
    assert min(p.get_x() for p in bars) >= 15  # hours from the week's 00:00


def test_plan_week_without_start_begins_at_the_next_hour_not_at_midnight(tmp_path: Path) -> None:
    inv, plan = lab(tmp_path)
    before = datetime.now()
    proc = labctl("--json", "-i", str(inv), "plan", "week", "-f", str(plan))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    first = min(datetime.fromisoformat(s["start"]) for s in doc["sessions"])
    assert first >= before
    plan_from = datetime.fromisoformat(doc["plan_from"])
    assert plan_from >= before and plan_from.minute == 0 and (plan_from - before).total_seconds() <= 3600


def test_a_start_time_on_the_command_line_is_where_the_plan_begins(tmp_path: Path) -> None:
    inv, plan = lab(tmp_path)
    proc = labctl("--json", "-i", str(inv), "plan", "week", "-f", str(plan), "--start", "2026-11-30T09:30")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["start"] == "2026-11-30" and doc["plan_from"] == "2026-11-30T09:30"
    assert min(s["start"] for s in doc["sessions"]) == "2026-11-30T09:30"


@pytest.mark.parametrize(
    ("n", "label"),
    [(0, "0"), (950, "950"), (9999, "9999"), (12000, "12k"), (12345, "12.3k"), (1_260_000, "1.3M")],
)
def test_step_labels_are_short(n: int, label: str) -> None:
    assert steps_label(n) == label
