"""A host whose agent answers JSON of the wrong shape, through the real CLI: status, metrics,
facts and doctor name that host as answering wrongly (exit 1) and show every other host as usual.

Both hosts are this machine over a local connection (no SSH: the answer's path from the agent's
stdout through call_agent is the same); the bad one's `python:` is a script that prints the same
JSON to every command, as a wrapper or a replaced interpreter would.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ON_THIS_MACHINE, REPO

pytestmark = [pytest.mark.integration, ON_THIS_MACHINE]
GARBAGE = '{"time": "soon", "gpus": "many", "memory": [], "jobs": 3}'


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    bad = tmp_path / "bin" / "python3"
    bad.parent.mkdir()
    bad.write_text(f"#!/bin/sh\ncat <<'EOF'\n{GARBAGE}\nEOF\n")
    bad.chmod(bad.stat().st_mode | stat.S_IXUSR)
    inv = tmp_path / "lab.yaml"
    inv.write_text(
        "lab: l\nhosts:\n"
        f"  good: {{address: 127.0.0.1, connection: local, python: {sys.executable}}}\n"
        f"  bad: {{address: 127.0.0.1, connection: local, python: {bad}}}\n"
    )
    return inv


def run(inv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # HOME: the local hosts' agent is cached under it, here the test's folder.
    env = {**os.environ, "HOME": str(inv.parent), "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", "-i", str(inv), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert "internal error" not in proc.stderr + proc.stdout, proc.stderr
    return proc


def named(text: str, command: str) -> bool:
    return f"bad answered `{command}` with a reply labctl cannot read: at " in " ".join(text.split())


def test_status_names_the_bad_host_and_shows_the_good_one(lab: Path) -> None:
    proc = run(lab, "status")
    assert proc.returncode == 1, proc.stderr
    assert named(proc.stderr, "monitor.status"), proc.stderr
    good = [line for line in proc.stderr.splitlines() if line.startswith("good")]
    assert good and "cpu" in good[0], proc.stderr
    proc = run(lab, "--json", "status")
    rows = {h["host"]: h for h in json.loads(proc.stdout)["hosts"]}
    assert proc.returncode == 1
    assert rows["good"]["reachable"] and rows["good"]["sample"]["memory"]["used_bytes"] > 0
    assert rows["bad"]["status"] == "failed" and not rows["bad"]["reachable"]
    assert rows["bad"]["error"].startswith(
        "bad answered `monitor.status` with a reply labctl cannot read: at time:"
    )


def test_metrics_textfile_is_written_with_the_good_hosts_series(lab: Path, tmp_path: Path) -> None:
    out = tmp_path / "textfile"
    out.mkdir()
    proc = run(lab, "metrics", "--textfile", str(out))
    assert proc.returncode == 1, proc.stderr
    assert named(proc.stderr, "monitor.status"), proc.stderr
    text = (out / "labctl.prom").read_text()
    assert 'labctl_host_up{host="good"} 1.0' in text and 'labctl_host_up{host="bad"} 0.0' in text
    assert 'labctl_host_memory_total_bytes{host="good"}' in text
    assert 'labctl_host_memory_total_bytes{host="bad"}' not in text


def test_facts_names_the_bad_host_and_shows_the_good_one(lab: Path) -> None:
    proc = run(lab, "--json", "facts", "--no-torch")
    assert proc.returncode == 1, proc.stderr
    rows = {r["host"]: r for r in json.loads(proc.stdout)["results"]}
    assert rows["good"]["status"] == "ok" and rows["good"]["facts"]["memory"]["total_bytes"] > 0
    assert rows["bad"]["status"] == "failed" and rows["bad"]["facts"] is None
    assert named(rows["bad"]["error"], "facts.collect"), rows["bad"]
    assert "labctl exec --limit bad" in rows["bad"]["hint"]
    proc = run(lab, "facts", "--no-torch")
    assert proc.returncode == 1 and named(proc.stderr, "facts.collect"), proc.stderr


def test_doctor_fails_the_bad_host_by_name_and_checks_the_good_one(lab: Path) -> None:
    proc = run(lab, "--json", "doctor")
    assert proc.returncode == 1, proc.stderr
    lines = json.loads(proc.stdout)["lines"]
    bad = [x for x in lines if x["host"] == "bad"]
    assert [x["status"] for x in bad] == ["fail"], bad
    assert named(bad[0]["found"], "ping"), bad
    good = {x["check"]: x for x in lines if x["host"] == "good"}
    assert good["reachable"]["status"] == "pass" and any(k.startswith("alert") for k in good)
