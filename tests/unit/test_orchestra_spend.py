"""Remote tiers used as the lab's plan uses them (labctl/agent/orchestra/spend.py): the share of
phase 3's tries a tier is asked for, the host's ledger of what the tiers cost (kept across
processes and runs, safe to add to at once, never trusting a damaged file), and how `monitor.status` and
`metrics` show it. Phase 3 skipping a tier past its budget, against a stand-in API:
test_orchestra_remote.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.commands import answer_problem
from labctl.agent.orchestra.client import Answer, Endpoint
from labctl.agent.orchestra.spend import Ledger, RemoteUse, SpendError, chosen, month_of, status
from labctl.monitor import metrics
from labctl.monitor.collect import HostStatus
from labctl.monitor.render import host_rows
from tests.unit.test_metrics import bare_sample, parsed, value

REPO = Path(__file__).resolve().parents[2]
NOV = 1_793_600_000.0  # 2026-11-02, UTC
KEYS = [f"{step}:0:{i}:task-{i % 7}" for step in range(1, 2001) for i in range(5)]


def test_a_share_asks_a_tier_for_that_part_of_the_tries_the_same_ones_in_every_process() -> None:
    picked = [k for k in KEYS if chosen("gpt-4o", k, 0.05)]
    assert 0.04 * len(KEYS) < len(picked) < 0.06 * len(KEYS)
    assert all(chosen("gpt-4o", k, 1.0) for k in KEYS[:100])
    # Spread over the run, not bunched at its start or end: each tenth of the steps gets its part.
    tenth = len(KEYS) // 10
    for part in range(10):
        got = sum(1 for k in KEYS[part * tenth : (part + 1) * tenth] if chosen("gpt-4o", k, 0.05))
        assert 0.025 * tenth < got < 0.075 * tenth, (part, got)
    # Two tiers at 0.05 fall on tries of their own, not on the same twentieth.
    other = {k for k in KEYS if chosen("claude", k, 0.05)}
    assert len(other & set(picked)) < 0.2 * len(picked)
    # No draw and no per-process hash seed: another interpreter picks exactly the same tries.
    code = (
        "import json, sys\n"
        "from labctl.agent.orchestra.spend import chosen\n"
        "keys = json.load(sys.stdin)\n"
        "print(json.dumps([k for k in keys if chosen('gpt-4o', k, 0.05)]))\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(KEYS),
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert json.loads(out.stdout) == picked


def test_the_ledger_keeps_a_months_spend_per_tier_across_instances_and_processes(tmp_path: Path) -> None:
    root = str(tmp_path / "spend")
    Ledger(root).add("gpt-4o", "2026-11", 0.25, prompt_tokens=1000, completion_tokens=200, budget=75.0)
    code = (
        "import sys\n"
        "from labctl.agent.orchestra.spend import Ledger\n"
        "Ledger(sys.argv[1]).add('gpt-4o', '2026-11', 0.5, 10, 20, 75.0)\n"
    )
    subprocess.run([sys.executable, "-c", code, root], check=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    again = Ledger(environ={"LABCTL_REMOTE_SPEND": root})  # a later run finds it by the variable
    record = again.read("gpt-4o", "2026-11")
    assert record["usd"] == pytest.approx(0.75)
    assert (record["prompt_tokens"], record["completion_tokens"], record["answers"]) == (1010, 220, 2)
    assert record["budget_per_month"] == 75.0
    assert again.spent("gpt-4o", "2026-12") == 0.0  # a new month starts from nothing
    assert again.spent("claude", "2026-11") == 0.0  # and so does each tier
    path = tmp_path / "spend" / "2026-11" / "gpt-4o.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in path.parent.iterdir()) == ["gpt-4o.json"]  # no temporary left
    assert month_of(NOV) == "2026-11"


def test_adds_at_once_from_processes_and_threads_are_all_counted(tmp_path: Path) -> None:
    root = str(tmp_path / "spend")
    code = (
        "import sys\n"
        "from labctl.agent.orchestra.spend import Ledger\n"
        "ledger = Ledger(sys.argv[1])\n"
        "for _ in range(40):\n"
        "    ledger.add('gpt-4o', '2026-11', 0.25, 3, 1)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", code, root], env=env) for _ in range(4)]
    ledger = Ledger(root)
    threads = [
        threading.Thread(target=lambda: [ledger.add("gpt-4o", "2026-11", 0.25, 3, 1) for _ in range(40)])
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [p.wait(60) for p in procs] == [0] * 4
    record = ledger.read("gpt-4o", "2026-11")
    # A read-add-replace without the lock loses adds that overlap: 320 of them would not all land.
    assert record["answers"] == 320 and record["usd"] == 80.0 and record["prompt_tokens"] == 960


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[]", b'{"tier": "gpt-4o", "month": "2026-11", "usd": "lots"}', b""],
)
def test_a_damaged_file_is_reported_never_overwritten_and_stops_a_budgeted_tier(
    tmp_path: Path, content: bytes
) -> None:
    root = tmp_path / "spend"
    (root / "2026-11").mkdir(parents=True)
    path = root / "2026-11" / "gpt-4o.json"
    path.write_bytes(content)
    ledger = Ledger(str(root))
    with pytest.raises(SpendError, match=r"gpt-4o\.json is damaged .* fix or remove it"):
        ledger.read("gpt-4o", "2026-11")
    with pytest.raises(SpendError, match="is damaged"):
        ledger.add("gpt-4o", "2026-11", 1.0)
    assert path.read_bytes() == content  # left for someone to look at, not replaced by a fresh count
    # Not known is not zero: a tier with a budget is not asked while its spend cannot be read.
    budgeted = Endpoint("gpt-4o", "https://api.example.com/v1", budget_per_month=50, remote=True)
    use = RemoteUse(ledger, clock=lambda: NOV)
    assert use.endpoints_for([budgeted], "1:0:0:t") == []
    assert "budget 50 not checkable" in use.flush()["skipped"]["gpt-4o"]
    # One without a budget is still asked; what it spent and could not be counted is said.
    free = Endpoint("gpt-4o", "https://api.example.com/v1", remote=True)
    assert use.endpoints_for([free], "1:0:0:t") == [free]
    a = Answer("gpt-4o")
    a.text, a.cost_usd = "x", 0.01
    use.record([free], [a])
    got = use.flush()
    assert got["spend_usd"] == {"gpt-4o": 0.01} and "is damaged" in got["errors"]["gpt-4o"]
    shown = status(ledger, str(tmp_path / "none.json"), NOV)
    assert shown is not None and shown["tiers"] == [] and "gpt-4o.json is damaged" in shown["errors"][0]


def test_remote_use_asks_the_warm_set_always_and_a_tier_for_its_share_until_its_budget(
    tmp_path: Path,
) -> None:
    ledger = Ledger(str(tmp_path))
    use = RemoteUse(ledger, clock=lambda: NOV)
    warm = Endpoint("demo-a", "http://10.0.0.5:8101/v1")
    tier = Endpoint(
        "gpt-4o", "https://api.example.com/v1", share=0.05, budget_per_month=0.03, remote=True,
        price_per_mtok={"input": 1000.0, "output": 1000.0},
    )  # fmt: skip
    keys = KEYS[:400]
    each = [use.endpoints_for([warm, tier], k) for k in keys]
    assert use.flush()["asked"] == {"gpt-4o": sum(1 for e in each if tier in e)}
    assert all(e[0] is warm for e in each)
    asked = [k for k, e in zip(keys, each, strict=True) if tier in e]
    assert asked == [k for k in keys if chosen("gpt-4o", k, 0.05)] and asked
    for _ in range(3):  # each answer 10 tokens at $1000 per million: $0.01
        a = Answer("gpt-4o")
        a.text, a.prompt_tokens, a.cost_usd = "x", 10, 0.01
        use.record([warm, tier], [a])
    assert ledger.spent("gpt-4o", "2026-11") == pytest.approx(0.03)
    assert [e.name for e in use.endpoints_for([warm, tier], asked[0])] == ["demo-a"]
    got = use.flush()
    assert got["skipped"] == {"gpt-4o": "budget 0.03 reached (0.03 spent in 2026-11)"}
    assert got["spend_usd"] == {"gpt-4o": pytest.approx(0.03)} and got["asked"] == {}
    # The next month counts afresh.
    december = RemoteUse(ledger, clock=lambda: NOV + 31 * 86400)
    assert tier in december.endpoints_for([warm, tier], asked[0])


def test_status_shows_each_tiers_spend_against_the_budget_the_endpoints_file_gives(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "spend"))
    ledger.add("gpt-4o", "2026-11", 12.5, 1000, 500, budget=50.0)
    ledger.add("old", "2026-10", 99.0)  # last month's: not this month's figure
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(
        json.dumps(
            {
                "models": [],
                "remote": [
                    {"name": "gpt-4o", "budget_per_month": 75},  # raised since: the new budget counts
                    {"name": "claude", "budget_per_month": 20},
                    {"name": "open", "budget_per_month": None},
                ],
            }
        )
    )
    shown = status(ledger, str(endpoints), NOV)
    assert shown == {
        "month": "2026-11",
        "dir": str(tmp_path / "spend"),
        "tiers": [
            {"tier": "claude", "usd": 0.0, "prompt_tokens": 0, "completion_tokens": 0, "answers": 0,
             "budget_per_month": 20.0},
            {"tier": "gpt-4o", "usd": 12.5, "prompt_tokens": 1000, "completion_tokens": 500, "answers": 1,
             "budget_per_month": 75.0},
        ],
        "errors": [],
    }  # fmt: skip
    assert (
        answer_problem("monitor.status", {"time": NOV, "memory": {"used_bytes": 1}, "remote_spend": shown})
        is None
    )
    assert (
        answer_problem("monitor.status", {"time": NOV, "memory": {"used_bytes": 1}, "remote_spend": None})
        is None
    )
    # A host that trains nothing has nothing to say.
    assert status(Ledger(str(tmp_path / "none")), str(tmp_path / "none.json"), NOV) is None


def spend_sample(usd: float = 80.0) -> dict[str, Any]:
    s = bare_sample()
    s["remote_spend"] = {
        "month": "2026-11",
        "tiers": [
            {"tier": "gpt-4o", "usd": usd, "budget_per_month": 75.0},
            {"tier": "open", "usd": 1.5, "budget_per_month": None},
        ],
        "errors": ["/x/2026-11/claude.json is damaged (not JSON)"],
    }
    return s


def test_metrics_export_each_tiers_spend_and_budget_per_host_and_month() -> None:
    s = parsed(metrics.exposition([HostStatus("trainer", True, spend_sample())]))
    assert value(s, "labctl_remote_spend_usd", host="trainer", tier="gpt-4o", month="2026-11") == 80.0
    assert value(s, "labctl_remote_budget_usd", host="trainer", tier="gpt-4o", month="2026-11") == 75.0
    assert value(s, "labctl_remote_spend_usd", host="trainer", tier="open", month="2026-11") == 1.5
    # No budget is no series, not a budget of 0.
    assert [lab_["tier"] for lab_, _ in s["labctl_remote_budget_usd"]] == ["gpt-4o"]


def test_status_shows_a_row_per_tier_and_says_when_the_budget_is_reached() -> None:
    rows = [r for r in host_rows(HostStatus("trainer", True, spend_sample())) if r[0] == "remote"]
    texts = [str(r[5]) for r in rows]
    assert rows[0][1] == "107%" and texts[0].startswith("gpt-4o $80.00 of $75.00 in 2026-11")
    assert "budget reached" in texts[0]
    assert texts[1] == "open $1.50 in 2026-11" and rows[1][1] == "-"
    assert "claude.json is damaged" in texts[2]
    under = [r for r in host_rows(HostStatus("t", True, spend_sample(10.0))) if r[0] == "remote"]
    assert "budget reached" not in str(under[0][5]) and under[0][1] == "13%"


def test_the_agents_status_answers_the_ledger_of_whoever_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from labctl.agent.core import paths
    from labctl.agent.monitor import status as agent_status

    monkeypatch.setattr(paths, "status_history", lambda: str(tmp_path / "history.jsonl"))
    monkeypatch.setenv("LABCTL_REMOTE_SPEND", str(tmp_path / "spend"))
    monkeypatch.setenv("LABCTL_ORCHESTRA_ENDPOINTS", str(tmp_path / "endpoints.json"))
    Ledger().add("gpt-4o", month_of(time.time()), 2.0, budget=75.0)
    out = agent_status.status_command({"record": False})
    assert answer_problem("monitor.status", out) is None
    assert [(t["tier"], t["usd"], t["budget_per_month"]) for t in out["remote_spend"]["tiers"]] == [
        ("gpt-4o", 2.0, 75.0)
    ]


def test_a_step_line_says_which_tier_its_budget_kept_out_and_what_the_tiers_cost() -> None:
    from labctl.train.launch import format_event

    event = {
        "event": "step",
        "step": 4,
        "steps": 8,
        "loss": 5.0,
        "lr": 1e-3,
        "tokens_per_s": 10,
        "reward": 0.5,
    }
    plain = format_event(event)
    assert "remote" not in plain and "not asked" not in plain
    line = format_event(
        dict(
            event,
            remote_spend_usd={"gpt-4o": 0.0125, "claude": 0.0025},
            remote_skipped={"big": "budget 50 reached (50.12 spent in 2026-11)"},
        )
    )
    assert "remote $0.0150" in line
    assert "big not asked: budget 50 reached (50.12 spent in 2026-11)" in line
