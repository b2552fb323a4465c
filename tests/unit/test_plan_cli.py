"""`labctl plan week` as a user runs it: the table, --json, --plot, the plan file's errors, init."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from labctl.documents.starter import write_starter
from labctl.plan.spec import load_plan
from tests.conftest import REPO, labctl
from tests.unit.test_plan_throughput import write_run

PLAN = """\
platforms:
  - name: kaggle
    gpu: P100
    weekly_hours: 30
    max_session_hours: 12
  - name: sagemaker
    gpu: V100
    weekly_hours: 28
    max_session_hours: 4
    daily_hours: 4
jobs:
  - name: main
    phase: 1
    steps_left: 50000
    tokens_per_step: 65536
    tokens_per_s: {P100: 4000}
  - name: mgr
    steps_left: 900
    tokens_per_step: 32768
    tokens_per_s: {P100: 4000}
"""


def lab(tmp_path: Path, plan: str = PLAN) -> tuple[Path, Path]:
    """(inventory path, plan path) in a lab folder; the inventory file itself is not needed."""
    (tmp_path / "playbooks").mkdir()
    path = tmp_path / "playbooks/plan.yaml"
    path.write_text(plan)
    return tmp_path / "lab.yaml", path


def test_json_schedules_with_measured_and_scaled_figures(tmp_path: Path) -> None:
    inv, plan = lab(tmp_path)
    write_run(tmp_path / ".labctl/runs", "p1-run", 1, "Tesla V100-SXM2-16GB", [1.0, 9000.0, 9000.0])
    proc = labctl("--json", "-i", str(inv), "plan", "week", "-f", str(plan), "--start", "2026-11-23")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    rates = {(r["job"], r["platform"]): (r["source"], r["tokens_per_s"]) for r in doc["throughput"]}
    assert rates[("main", "sagemaker")] == ("measured", 9000.0)
    assert rates[("main", "kaggle")] == ("given", 4000.0)
    assert rates[("mgr", "sagemaker")][0] == "scaled"
    assert "NVIDIA datasheets" in doc["throughput_table"]
    assert doc["start"] == "2026-11-23" and doc["sessions"][0]["start"].startswith("2026-11-23T")
    used = {p["platform"]: (p["used_hours"], p["unused_hours"]) for p in doc["platforms"]}
    assert used == {"kaggle": (30.0, 0.0), "sagemaker": (28.0, 0.0)}
    jobs = {j["job"]: j for j in doc["jobs"]}
    assert jobs["mgr"]["finished"] and jobs["mgr"]["finishes_at"].startswith("2026-11-2")
    assert not jobs["main"]["finished"] and jobs["main"]["steps_left_after"] > 0
    assert jobs["main"]["finishes_in_week"] > 1


def test_the_table_names_sessions_hours_jobs_and_the_scaling_source(tmp_path: Path) -> None:
    inv, plan = lab(tmp_path)
    proc = subprocess.run(  # the plan beside the inventory; wide enough that no cell wraps
        [sys.executable, "-m", "labctl", "-i", str(inv), "plan", "week", "--start", "2026-11-23"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "250"},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stderr
    for text in ("Training sessions, week of 2026-11-23", "sagemaker (V100)", "resume → save", "Hours per platform",
                 "unused h", "at this week's pace", "(this week)", "scaled", "NVIDIA datasheets", str(plan)):  # fmt: skip
        assert text in out, text


def test_plot_writes_a_png_matplotlib_reads_back(tmp_path: Path) -> None:
    import matplotlib.image

    inv, _plan = lab(tmp_path)
    png = tmp_path / "out/week.png"
    proc = labctl("-i", str(inv), "plan", "week", "--start", "2026-11-23", "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    assert png.stat().st_size > 0
    img = matplotlib.image.imread(str(png))
    height, width = img.shape[:2]
    assert (width, height) == (1200, round(100 * (1.2 + 0.7 * 2)))


def test_a_plan_file_with_mistakes_names_each_line(tmp_path: Path) -> None:
    bad = PLAN.replace("weekly_hours: 30", "weekly_hour: 30").replace("steps_left: 900", "steps_left: -5")
    inv, plan = lab(tmp_path, bad)
    proc = labctl("-i", str(inv), "plan", "week", "-f", str(plan))
    assert proc.returncode == 2
    err = " ".join(proc.stderr.split())
    assert "has 3 problems" in err
    assert (
        f"{plan}:4: platforms[0].weekly_hour: unknown key 'weekly_hour'. Did you mean 'weekly_hours'?" in err
    )
    assert f"{plan}:2: platforms[0].weekly_hours: 'weekly_hours' is required." in err
    assert f"{plan}:18: jobs[1].steps_left:" in err
    assert "Traceback" not in proc.stderr


def test_an_infeasible_plan_is_exit_2_with_the_reason_in_json(tmp_path: Path) -> None:
    inv, plan = lab(tmp_path, PLAN.replace("  - name: mgr\n", "  - name: mgr\n    gpus: [A100]\n"))
    proc = labctl("--json", "-i", str(inv), "plan", "week", "-f", str(plan))
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    assert (
        "job mgr needs a GPU of type A100; no platform has one (kaggle (P100), sagemaker (V100))"
        in doc["error"]
    )


def test_a_bad_start_date_is_exit_2(tmp_path: Path) -> None:
    inv, _plan = lab(tmp_path)
    proc = labctl("-i", str(inv), "plan", "week", "--start", "next monday")
    assert proc.returncode == 2 and "YYYY-MM-DD" in proc.stderr


def test_init_writes_seed_001s_plan_and_it_schedules(tmp_path: Path) -> None:
    written = write_starter(tmp_path / "lab")
    path = tmp_path / "lab/playbooks/plan.yaml"
    assert path in written
    plan = load_plan(path)
    assert {(p.name, p.gpu, p.weekly_hours, p.max_session_hours, p.daily_hours) for p in plan.platforms} == {
        ("kaggle", "P100", 30, 12, None),
        ("sagemaker", "V100", 28, 4, 4),
    }
    assert (REPO / "playbooks/plan.yaml").read_bytes() == path.read_bytes()
    proc = labctl(
        "--json", "-i", str(tmp_path / "lab/inventory/lab.yaml"), "plan", "week", "--start", "2026-11-30"
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["plan_file"] == str(path)
