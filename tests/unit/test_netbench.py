"""`labctl bench network`: arguments, the link from facts, the explanation, the seed's figure,
the table, and both agent ends over real sockets on this machine."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.core.errors import AgentError
from labctl.agent.netbench.transfer import send_command
from labctl.inventory.model import NIC, Bond, Host, Inventory
from labctl.modelload.stages import SEED_SECONDS
from labctl.netbench.plan import (
    HostLink,
    build_report,
    check_seconds,
    explain,
    host_link,
    parse_streams,
    path_mbps,
    pick_hosts,
    seed_transfer,
)
from labctl.output.errors import InputError
from tests.conftest import agent_server

M5 = Host(
    name="m5",
    address="10.0.0.1",
    nics=[NIC(name="eth0", speed_mbps=1000), NIC(name="eth1", speed_mbps=1000)],
    bond=Bond(name="bond0", mode="802.3ad", interfaces=["eth0", "eth1"]),
)
IRINA = Host(name="irina", address="10.0.0.2", nics=[NIC(name="eth0", speed_mbps=100)])
BARE = Host(name="pharaoh", address="10.0.0.3")
WIN = Host(name="workstation", address="10.0.0.4", os="windows")
INV = Inventory(lab="t", path=Path("/tmp/inv.yaml"), hosts={h.name: h for h in (M5, IRINA, BARE, WIN)})


def input_error(fn: Callable[..., object], *args: object) -> str:
    with pytest.raises(InputError) as e:
        fn(*args)
    assert e.value.exit_code == 2
    assert "\n" not in e.value.message
    return f"{e.value.message} {e.value.hint}"


def test_streams_are_positive_whole_numbers_sorted_once_each() -> None:
    assert parse_streams("1,2,4") == [1, 2, 4]
    assert parse_streams(" 4, 1,1 ") == [1, 4]
    for bad in ("", " ", "0", "-1", "a", "1,,2", "1.5", "2,x", "65"):
        assert "e.g. --streams 1,2,4" in input_error(parse_streams, bad), bad
    assert "'0', 'x'" in input_error(parse_streams, "0,x,2")


def test_seconds_out_of_range_are_input_errors() -> None:
    assert check_seconds(0.5) == 0.5
    for bad in (0.0, -1.0, float("nan"), float("inf"), 301.0):
        assert "--seconds" in input_error(check_seconds, bad)


def test_the_two_ends_must_be_two_known_linux_hosts() -> None:
    assert [h.name for h in pick_hosts(INV, "irina", "m5")] == ["irina", "m5"]
    assert "both name m5" in input_error(pick_hosts, INV, "m5", "m5")
    assert "No host 'nope'" in input_error(pick_hosts, INV, "m5", "nope")
    assert "--to HOST" in input_error(pick_hosts, INV, "m5", None)
    assert "Linux only" in input_error(pick_hosts, INV, "workstation", "m5")


def nic(name: str, address: str | None, speed: int | None = None, **kw: Any) -> dict[str, Any]:
    return {
        "name": name,
        "operstate": "up",
        "speed_mbps": speed,
        "addresses": [f"{address}/24", "fe80::1/64"] if address else [],
        "is_bond": False,
        **kw,
    }


def bond_nic(address: str, speed: int, mode: str, policy: str | None) -> dict[str, Any]:
    bond = {"mode": mode, "xmit_hash_policy": policy, "slaves": [{"name": "eno1"}, {"name": "eno2"}]}
    return nic("bond0", address, speed, is_bond=True, bond=bond)


def test_the_link_is_the_up_bond_carrying_the_address() -> None:
    facts = {
        "nics": [
            nic("eno1", None, 1000),
            nic("eno2", None, 1000),
            bond_nic("10.0.0.1", 2000, "802.3ad", "layer3+4"),
        ]
    }
    link = host_link(M5, facts)
    assert (link.mbps, link.source, link.nic, link.members) == (2000, "bond", "bond0", 2)
    assert link.declared_bond is None  # the inventory's bond is the one that is up


def test_a_nic_that_reports_its_speed_wins_over_the_inventory() -> None:
    link = host_link(IRINA, {"nics": [nic("eth0", "10.0.0.2", 1000), nic("eth1", "10.9.9.9", 10000)]})
    assert (link.mbps, link.source, link.nic) == (1000, "nic", "eth0")


def test_a_nic_with_no_speed_falls_back_to_the_inventory_and_a_down_bond_is_named() -> None:
    link = host_link(M5, {"nics": [nic("eth0", "10.0.0.1"), nic("eth1", None)]})  # sim veths: no speed
    assert (link.mbps, link.source, link.nic) == (1000, "inventory", "eth0")
    assert link.declared_bond == "bond0 (802.3ad)"
    assert "declares 1000 Mbit/s" in link.describe()


def test_a_virtual_nics_speed_is_not_the_links() -> None:
    # What the sim's veths report (facts of a sim host): 10000 Mbit/s on a link tc shapes to 1 Gbit.
    veth = nic("eth0", "10.0.0.1", 10000, virtual=True)
    link = host_link(M5, {"nics": [veth, nic("eth1", None, 10000, virtual=True)]})
    assert (link.mbps, link.source, link.nic, link.virtual_mbps) == (1000, "inventory", "eth0", 10000)
    assert (
        "eth0 is virtual (it reports 10000 Mbit/s, no link's speed); the inventory declares 1000"
        in link.describe()
    )
    bare = host_link(BARE, {"nics": [nic("eth0", "10.0.0.3", 10000, virtual=True)]})
    assert (bare.mbps, bare.source) == (None, "unknown")
    assert "is virtual" in bare.describe() and "declares none" in bare.describe()


def test_nothing_known_says_so() -> None:
    link = host_link(BARE, {"nics": [nic("eth0", "10.0.0.3")]})
    assert (link.mbps, link.source) == (None, "unknown")
    assert "declares none" in link.describe()
    assert path_mbps([link, HostLink("x")]) is None


def test_the_path_is_the_slower_end() -> None:
    assert path_mbps([HostLink("a", 2000, source="bond"), HostLink("b", 1000, source="nic")]) == 1000
    assert path_mbps([HostLink("a", 2000, source="bond"), HostLink("b")]) == 2000


def test_the_explanation_follows_the_bond_mode() -> None:
    def why(mode: str | None, policy: str | None = "layer3+4", declared: str | None = None) -> str:
        end = HostLink("m5", 2000, "bond0", "bond" if mode else "nic", mode, policy, 2, declared)
        return explain([end, HostLink("irina", 1000, "eth0", "nic")])

    assert "only several streams reach the sum" in why("802.3ad")
    assert "adds nothing here" in why("802.3ad", "layer2")
    assert "spreads even one stream" in why("balance-rr")
    assert "one member at a time" in why("active-backup")
    assert "no bond at either end: one link" in why(None)
    assert "m5 declares bond0 (802.3ad) in the inventory but has no such bond up" in why(
        None, declared="bond0 (802.3ad)"
    )


def test_a_bond_at_one_end_only_is_capped_by_the_other_ends_link() -> None:
    bonded = HostLink("m5", 2000, "bond0", "bond", "802.3ad", "layer3+4", 2)
    why = explain([HostLink("irina", 1000, "eth0", "nic"), bonded])
    assert "irina has one 1000 Mbit/s link, which caps the path below m5's bond" in why
    assert "caps" not in explain([HostLink("irina", 2000, "bond0", "bond", "balance-rr", None, 2), bonded])


def test_seed_transfer_reuses_the_seeds_figures() -> None:
    # 48 GB at 1 Gbit/s is the seed's own 384 s; at 2 Gbit/s its bonded 192 s.
    assert seed_transfer(1e9)["seconds_at_best"] == pytest.approx(SEED_SECONDS["network_1g"])
    assert seed_transfer(2e9)["seconds_at_best"] == pytest.approx(SEED_SECONDS["network_bonded"])
    assert seed_transfer(None)["seconds_at_best"] is None


MEASURED = {
    "runs": [
        {
            "streams": 1,
            "bytes": 580_000_000,
            "seconds": 5.0,
            "bits_per_s": 928e6,
            "per_stream_bits_per_s": [928e6],
        },
        {
            "streams": 2,
            "bytes": 590_000_000,
            "seconds": 5.0,
            "bits_per_s": 944e6,
            "per_stream_bits_per_s": [472e6, 472e6],
        },
    ]
}


def test_the_report_gives_shares_of_the_slower_end_and_the_best_run() -> None:
    links = [HostLink("irina", 100, "eth0", "inventory"), HostLink("m5", 1000, "eth0", "inventory")]
    r = build_report(IRINA, M5, 5.0, MEASURED, links)
    assert (r["from"], r["to"], r["address"], r["link"]["mbps"]) == ("irina", "m5", "10.0.0.1", 100)
    assert [round(x["share"], 2) for x in r["runs"]] == [9.28, 9.44]
    assert r["best"]["streams"] == 2
    assert r["seed"]["seconds_at_best"] == pytest.approx(48e9 * 8 / 944e6)
    assert r["runs"][1]["per_stream_mbps"] == [472.0, 472.0]
    json.dumps(r)
    unknown = build_report(IRINA, M5, 5.0, MEASURED, [HostLink("irina"), HostLink("m5")])
    assert unknown["link"]["known"] is False and unknown["runs"][0]["share"] is None


def test_the_table_shows_each_stream_count_the_link_why_and_the_seed() -> None:
    from rich.console import Console

    from labctl.netbench.render import render_network

    def shown(links: list[HostLink]) -> str:
        console = Console(record=True, width=200)
        render_network(console, build_report(IRINA, M5, 5.0, MEASURED, links))
        return console.export_text()

    text = shown([HostLink("irina", 1000, "eth0", "inventory"), HostLink("m5", 1000, "eth0", "inventory")])
    assert "irina → m5 (10.0.0.1)" in text
    assert "944" in text and "94%" in text and "472 / 472" in text
    assert "link: 1000 Mbit/s" in text and "why: no bond at either end" in text
    assert "(the lab's plan: 384 s over 1 Gb, 192 s bonded)" in text
    assert "speed unknown, so no share" in shown([HostLink("irina"), HostLink("m5")])


@contextmanager
def sink(**args: Any) -> Iterator[tuple[dict[str, Any], subprocess.Popen[str]]]:
    """The real agent's netbench.sink in its own process on this machine's loopback."""
    with agent_server("netbench.sink", {"bind": "127.0.0.1", **args}) as served:
        yield served


def test_the_agent_ends_measure_streams_over_real_sockets(tmp_path: Path) -> None:
    with sink() as (info, proc):
        token_file = tmp_path / "token"
        token_file.write_text(info["token"])
        token_file.chmod(0o600)
        sent = send_command(
            {
                "address": "127.0.0.1",
                "port": info["port"],
                "token_file": str(token_file),
                "streams": [1, 3],
                "seconds": 0.3,
            }
        )
        out, _ = proc.communicate(timeout=30)
    assert not token_file.exists()  # read once, then removed
    assert [r["streams"] for r in sent["runs"]] == [1, 3]
    for r in sent["runs"]:
        assert r["bytes"] > 0 and r["bits_per_s"] > 0 and r["seconds"] > 0
        assert len(r["per_stream_bits_per_s"]) == r["streams"]
        assert r["bytes"] <= r["sent_bytes"]  # counted where it arrived, not where it was queued
    served = json.loads(out)
    assert proc.returncode == 0
    assert (served["reason"], served["streams"], served["refused"], served["peers"]) == (
        "shutdown",
        4,
        0,
        ["127.0.0.1"],
    )


def test_the_sink_refuses_a_stream_without_its_token() -> None:
    with sink() as (info, proc):
        with pytest.raises(AgentError) as e:
            send_command(
                {
                    "address": "127.0.0.1",
                    "port": info["port"],
                    "token": "wrong",
                    "streams": [1],
                    "seconds": 0.2,
                }
            )
        assert e.value.kind == "refused"
        send_command(
            {
                "address": "127.0.0.1",
                "port": info["port"],
                "token": info["token"],
                "streams": [1],
                "seconds": 0.1,
            }
        )
        out, _ = proc.communicate(timeout=30)
    # The stream and the failed sender's request to stop; the right token's stream was counted.
    served = json.loads(out)
    assert (served["refused"], served["streams"], served["reason"]) == (2, 1, "shutdown")


def test_the_sink_ends_by_itself_when_nobody_sends() -> None:
    with sink(idle_timeout=0.5) as (_info, proc):
        out, _ = proc.communicate(timeout=30)
    assert json.loads(out)["reason"] == "idle"


def test_a_host_name_that_resolves_to_loopback_listens_on_every_address() -> None:
    # "localhost" stands for a host whose own name resolves to 127.0.1.1 on itself (Debian's
    # /etc/hosts): a sink there would listen where no other host can connect.
    with sink(bind="localhost") as (info, proc):
        assert info["address"] == "0.0.0.0"
        send_command(
            {
                "address": "127.0.0.1",
                "port": info["port"],
                "token": info["token"],
                "streams": [1],
                "seconds": 0.1,
            }
        )
        proc.communicate(timeout=30)
    with sink(bind="127.0.0.1") as (info, proc):  # an address given as such is taken as it is
        assert info["address"] == "127.0.0.1"


def test_a_sender_that_cannot_connect_names_the_address() -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(AgentError) as e:
        send_command({"address": "127.0.0.1", "port": port, "token": "t", "streams": [1], "seconds": 0.1})
    assert e.value.kind == "connect_failed" and f"127.0.0.1:{port}" in e.value.message
