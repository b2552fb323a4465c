"""The two readings doctor added to existing agent commands, taken from the real agent over
real sockets and a real process: ping's clock (for clock skew) and netbench.send's connect time
(for latency), carried through bench network's report."""

from __future__ import annotations

import time
from pathlib import Path

from labctl.doctor.checks import LATENCY_WARN_MS, check_clocks, check_network
from labctl.doctor.gather import Clock, HostFound, NetworkProbe
from labctl.inventory.model import Host
from labctl.netbench.plan import HostLink, build_report
from tests.unit.test_agent_facts import run_agent
from tests.unit.test_netbench import sink


def test_the_agents_ping_reads_its_clock_between_the_controllers_two_reads() -> None:
    before = time.time()
    rc, result = run_agent("ping")
    after = time.time()
    assert rc == 0 and before <= result["time"] <= after
    (line,) = check_clocks(
        [HostFound(Host(name="here", address="127.0.0.1"), clock=Clock(before, result["time"], after))]
    )
    assert line.status == "pass"


def test_net_send_reports_its_connect_time_and_the_report_carries_it_to_a_latency_line(
    tmp_path: Path,
) -> None:
    from labctl.agent.netbench.transfer import send_command

    with sink() as (info, proc):
        token_file = tmp_path / "token"
        token_file.write_text(info["token"])
        token_file.chmod(0o600)
        sent = send_command(
            {
                "address": "127.0.0.1",
                "port": info["port"],
                "token_file": str(token_file),
                "streams": [1],
                "seconds": 0.2,
            }
        )
        proc.communicate(timeout=30)
    (run,) = sent["runs"]
    assert 0 < run["connect_ms"] < 1000
    a, b = Host(name="a", address="127.0.0.1"), Host(name="b", address="127.0.0.1")
    report = build_report(a, b, 0.2, sent, [HostLink("a", 1000), HostLink("b", 1000)])
    assert report["runs"][0]["connect_ms"] == run["connect_ms"]
    lat = check_network(NetworkProbe("a", "b", report=report), None)[1]
    # The line judges the measured figure: loopback on a loaded machine may pass the warning mark.
    judged = "pass" if run["connect_ms"] <= LATENCY_WARN_MS else "warn"
    assert lat.check == "latency" and lat.status == judged and f"{run['connect_ms']:.2f} ms" in lat.found
