"""bench network end to end on the simulated lab: two hosts' agents, host to host, 1 Gbit links."""

from __future__ import annotations

import json
from typing import Any

import pytest

from labctl.sim.plan import parse_rate
from tests.conftest import labctl

pytestmark = pytest.mark.integration

# A rate measured over a few seconds can land a little above the shaper's: tbf lets one
# bucket (~4 ms of traffic) through at once, and the first and last reads bound the span.
NOISE = 1.03


def test_bench_network_measures_host_to_host_within_the_shaped_rate(lab: Any) -> None:
    inv = str(lab.inventory_path)
    shaped_mbps = parse_rate(lab.rate) / 1e6
    proc = labctl(
        "--json", "-i", inv, "bench", "network", "--from", "irina", "--to", "m5",
        "--streams", "2,1", "--seconds", "2", timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["from"], doc["to"], doc["address"], doc["seconds"]) == ("irina", "m5", lab.hosts["m5"], 2)
    assert [r["streams"] for r in doc["runs"]] == [1, 2]
    for r in doc["runs"]:
        assert 0 < r["mbps"] <= shaped_mbps * NOISE, r
        assert len(r["per_stream_mbps"]) == r["streams"] and all(x > 0 for x in r["per_stream_mbps"])
        assert r["bytes"] > 0 and r["seconds"] > 0
        assert r["share"] == pytest.approx(r["mbps"] / 1000)
        assert r["seconds_48gb"] == pytest.approx(48e9 * 8 / (r["mbps"] * 1e6))
    # Sim veths report no speed: the link is the inventory's declared 1000 Mbit/s at both ends.
    link = doc["link"]
    assert link["mbps"] == 1000 and link["known"] is True
    assert [(e["host"], e["nic"], e["source"]) for e in link["ends"]] == [
        ("irina", "eth0", "inventory"),
        ("m5", "eth0", "inventory"),
    ]
    assert "no bond at either end" in doc["explanation"]
    assert "m5 declares bond0 (802.3ad) in the inventory but has no such bond up" in doc["explanation"]
    best = max(doc["runs"], key=lambda r: r["mbps"])
    assert doc["best"]["mbps"] == best["mbps"]
    assert doc["seed"]["seed_seconds_1g"] == 384 and doc["seed"]["seed_seconds_bonded"] == 192
    # Host to host: the only peer the receiver saw is the sender, not this controller.
    sink = doc["sink"]
    assert sink["peers"] == [lab.hosts["irina"]] and sink["reason"] == "shutdown"
    assert sink["streams"] == 3 and sink["refused"] == 0


def test_bench_network_prints_a_table_on_stderr_and_nothing_on_stdout(lab: Any) -> None:
    inv = str(lab.inventory_path)
    proc = labctl(
        "-i", inv, "bench", "network", "--from", "m5", "--to", "pharaoh", "--streams", "2", "--seconds", "1",
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    err = proc.stderr
    assert "network: m5 → pharaoh" in err and "share of link" in err
    assert "why: no bond at either end" in err
    assert "the lab's 48 GB model at the best rate" in err and "384 s over 1 Gb" in err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--from", "m5", "--to", "m5"], "both name m5"),
        (["--from", "m5", "--to", "nosuch"], "No host 'nosuch'"),
        (["--from", "m5"], "--to HOST"),
        (["--from", "m5", "--to", "irina", "--streams", "0,2"], "not a stream count"),
        (["--from", "m5", "--to", "irina", "--streams", "two"], "not a stream count"),
        (["--from", "m5", "--to", "irina", "--seconds", "0"], "--seconds 0 is out of range"),
    ],
)
def test_bench_network_bad_arguments_exit_2(lab: Any, args: list[str], expected: str) -> None:
    proc = labctl("--json", "-i", str(lab.inventory_path), "bench", "network", *args)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    assert expected in doc["error"] and doc["exit_code"] == 2


def test_bench_network_to_a_dead_host_exits_1(lab: Any) -> None:
    inv = str(lab.inventory_path)
    lab.stop_host("pharaoh")
    try:
        proc = labctl("--json", "-i", inv, "bench", "network", "--from", "m5", "--to", "pharaoh", timeout=300)
    finally:
        lab.start_host("pharaoh")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    assert "pharaoh" in doc["error"] and doc["exit_code"] == 1
