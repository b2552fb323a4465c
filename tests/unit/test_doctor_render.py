"""doctor's report: a line per check with its fix under anything not passing; JSON; bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO
from pathlib import Path

from rich.console import Console

from labctl.doctor.model import FAIL, PASS, WARN, Line
from labctl.doctor.render import render, to_json

REPO = Path(__file__).resolve().parents[2]
LINES = [
    Line(PASS, "reachable", "m5", "agent answered", ""),
    Line(
        FAIL,
        "GPUs declared",
        "m5",
        "declared 1x Tesla V100 (32 GB), found 0",
        "Install the NVIDIA driver on m5.",
    ),
    Line(WARN, "bandwidth", None, "irina -> m5: 300 Mbit/s", "Run labctl bench network."),
]


def test_the_text_report_gives_each_line_and_a_fix_under_what_does_not_pass() -> None:
    out = StringIO()
    render(Console(file=out, width=200, color_system=None), LINES)
    text = out.getvalue().splitlines()
    assert text[0].split() == ["pass", "m5", "reachable:", "agent", "answered"]
    assert text[1].startswith("fail m5") and text[2].strip() == "fix: Install the NVIDIA driver on m5."
    assert text[3].startswith("warn lab") and text[4].strip() == "fix: Run labctl bench network."
    assert text[5] == "doctor: 1 pass, 1 warn, 1 fail"


def test_the_json_report_counts_and_keeps_every_field() -> None:
    doc = to_json(LINES, "dev")
    assert doc["tier"] == "dev" and doc["summary"] == {"pass": 1, "warn": 1, "fail": 1}
    assert doc["lines"][1] == {
        "status": "fail",
        "check": "GPUs declared",
        "host": "m5",
        "found": "declared 1x Tesla V100 (32 GB), found 0",
        "fix": "Install the NVIDIA driver on m5.",
    }


def test_an_unknown_tier_is_bad_input_exit_2_with_the_tiers_named() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", "--json", "doctor", "--tier", "huge"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    assert "--tier 'huge'" in doc["error"] and "dev, research, prod" in doc["hint"]
