"""Dates and durations at the edges of what Python represents: `plan week --start` near year
10000 or 1, plan files and run records with numbers no job has, `--time-limit` and `--every` of
hundreds of digits, seconds past a timer's range. Each is a named input error (exit 2) or a
plan; never an OverflowError's traceback."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from labctl.cron.every import every_to_schedule
from labctl.output.errors import InputError
from labctl.plan.schedule import schedule
from labctl.plan.spec import PlanFile
from labctl.plan.throughput import measured_rates
from labctl.train.duration import parse_duration
from tests.conftest import REPO
from tests.unit.test_plan_throughput import write_run

LAST_START = date(9999, 12, 24)  # its week ends at 9999-12-31 24:00
MAX_COUNT, MIN_RATE, MAX_RATE = 10**15, 1e-3, 1e12  # the plan file's bounds

PLAN = """\
platforms:
  - {name: kaggle, gpu: P100, weekly_hours: 30, max_session_hours: 12}
  - {name: m5, gpu: V100, lab: true, weekly_hours: 168, max_session_hours: 168}
jobs:
  - {name: j, phase: 1, steps_left: STEPS, tokens_per_step: TPS, tokens_per_s: {P100: RATE}}
"""


def plan_text(steps: Any = 20000, tps: Any = 524288, rate: Any = 9000) -> str:
    return PLAN.replace("STEPS", str(steps)).replace("TPS", str(tps)).replace("RATE", str(rate))


def plan_week(tmp_path: Path, *args: str, plan: str | None = None) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "plan.yaml"
    path.write_text(plan or plan_text())
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "labctl",
            "-i",
            str(tmp_path / "lab.yaml"),
            "plan",
            "week",
            "-f",
            str(path),
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "TZ": "UTC", "COLUMNS": "200"},
        timeout=60,
    )


def test_a_start_whose_week_ends_past_9999_is_a_named_error(tmp_path: Path) -> None:
    proc = plan_week(tmp_path, "--start", "9999-12-30")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        "--start 9999-12-30: the week would end after the last date Python can represent (9999-12-31)"
        in proc.stderr
    )
    assert "Give --start 9999-12-24 or earlier" in proc.stderr
    assert plan_week(tmp_path, "--start", "9999-12-24", "--json").returncode == 0


@pytest.mark.parametrize("start", ["0001-01-01T00:00+05:00", "9999-12-31T23:00-05:00"])
def test_a_start_outside_the_calendar_in_local_time_is_a_named_error(tmp_path: Path, start: str) -> None:
    proc = plan_week(tmp_path, "--start", start)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"--start {start}: in local time it falls outside the dates Python can represent" in proc.stderr


@pytest.mark.parametrize(
    ("plan", "says"),
    [
        (plan_text(steps="1" + "0" * 400), "steps_left: Input should be less than or equal to"),
        (plan_text(tps="1" + "0" * 400), "tokens_per_step: Input should be less than or equal to"),
        (plan_text(rate="1e-320"), "tokens_per_s for P100 must be from 0.001 to 1e+12"),
    ],
)
def test_plan_file_numbers_no_job_has_are_named(tmp_path: Path, plan: str, says: str) -> None:
    proc = plan_week(tmp_path, "--start", "2026-11-30", plan=plan)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "plan.yaml:5: jobs[0]." in proc.stderr and says in proc.stderr


@given(start=st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)))
@example(start=datetime(9999, 12, 30))
@example(start=datetime(9999, 12, 24, 23, 59, 59))
@example(start=datetime(1, 1, 1))
def test_any_start_gives_a_week_or_the_named_error(start: datetime) -> None:
    plan = PlanFile.model_validate(
        {
            "platforms": [
                {"name": "kaggle", "gpu": "P100", "weekly_hours": 30, "max_session_hours": 12},
                {"name": "m5", "gpu": "V100", "weekly_hours": 168, "max_session_hours": 168},
            ],
            "jobs": [
                {"name": "j", "steps_left": 10**9, "tokens_per_step": 1000, "tokens_per_s": {"P100": 9000}}
            ],
        }
    )
    try:
        week = schedule(plan, {}, start)
    except InputError as e:
        assert start.date() > LAST_START and "the week would end after the last date" in e.message
        return
    doc = week.to_json()  # every session's end, the week's last minute included, is a date
    assert doc["start"] == start.date().isoformat()
    week_end = datetime.combine(start.date(), datetime.min.time()) + timedelta(days=7)
    assert all(datetime.fromisoformat(s["end"]) <= week_end for s in doc["sessions"])


@given(
    steps=st.integers(1, MAX_COUNT),
    from_step=st.integers(0, MAX_COUNT),
    tps=st.integers(1, MAX_COUNT),
    rate=st.floats(MIN_RATE, MAX_RATE),
    checkpoint=st.floats(0, 24 * 60),
)
def test_any_job_within_the_plan_files_bounds_is_scheduled(
    steps: int, from_step: int, tps: int, rate: float, checkpoint: float
) -> None:
    plan = PlanFile.model_validate(
        {
            "platforms": [{"name": "m5", "gpu": "V100", "weekly_hours": 168, "max_session_hours": 168}],
            "jobs": [
                {
                    "name": "j",
                    "steps_left": steps,
                    "from_step": from_step,
                    "tokens_per_step": tps,
                    "tokens_per_s": {"P100": rate},
                    "checkpoint_minutes": checkpoint,
                }
            ],
        }
    )
    week = schedule(plan, {}, date(2026, 11, 30))
    (outcome,) = week.jobs
    assert 0 <= outcome.steps_scheduled <= steps
    json.dumps(week.to_json())


def test_damaged_run_records_give_no_figure_instead_of_failing(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    write_run(root, "text", 1, "Tesla V100-SXM2-16GB", [9000.0, 9000.0])
    lines = (root / "text/metrics.jsonl").read_text().replace("9000.0", '"fast"')
    (root / "text/metrics.jsonl").write_text(lines)
    write_run(root, "nan", 2, "Tesla V100-SXM2-16GB", [math.nan, math.nan, 1e-320])
    write_run(root, "world", 3, "Tesla V100-SXM2-16GB", [1.0, 900.0, 900.0])
    lines = (root / "world/metrics.jsonl").read_text().replace('"world_size": 1', '"world_size": "x"')
    (root / "world/metrics.jsonl").write_text(lines)
    (root / "world/run.json").write_text(json.dumps({"run_id": "world", "phase": 3, "started": "yesterday"}))
    (root / "list").mkdir()
    (root / "list/run.json").write_text("[1, 2]")
    (root / "list/metrics.jsonl").write_text("")
    rates = measured_rates(root)
    assert set(rates) == {(3, "V100")} and rates[(3, "V100")].tokens_per_s == 900.0


@pytest.mark.parametrize("text", ["99999999999999999999999d", "9" * 5000 + "h", "366d", "365d1s"])
def test_a_time_limit_past_a_year_is_named(text: str) -> None:
    with pytest.raises(InputError) as e:
        parse_duration(text)
    assert "is over a year (365d)" in e.value.message
    assert parse_duration("365d") == 365 * 86400


def test_a_period_of_thousands_of_digits_is_not_a_period() -> None:
    with pytest.raises(InputError, match="is not a period"):
        every_to_schedule("9" * 5000 + "d")


def wide_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI, 300 columns wide so that its error box does not wrap the message asserted."""
    return subprocess.run(
        [sys.executable, "-m", "labctl", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "300"},
        timeout=60,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["status", "--watch", "1e10"],
        ["exec", "--timeout", "1e300", "--", "true"],
    ],
)
def test_seconds_past_a_timers_range_are_refused(tmp_path: Path, args: list[str]) -> None:
    inv = tmp_path / "local.yaml"  # this machine, no SSH: `status --watch 1e10` slept into an OverflowError
    inv.write_text(
        "lab: l\nhosts:\n  here: {address: 127.0.0.1, connection: local, python: /usr/bin/python3}\n"
    )
    proc = wide_cli("-i", str(inv), *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "is not a number above 0 and at most 1e+09" in proc.stderr


@pytest.mark.parametrize("args", [["orchestra", "stop", "--wait", "inf"], ["rotate", "--wait", "1e300"]])
def test_a_wait_with_no_end_is_refused(args: list[str]) -> None:
    # typer's min=0 lets inf through: `orchestra stop --wait inf` waited for ever on a held lock.
    proc = wide_cli("-i", "/nonexistent/lab.yaml", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "is not a finite number of at most 1e+09" in proc.stderr
