"""verify_bond on /proc/net/bonding text read through parse_bonding.

This machine's kernel has no bonding driver, so no real /proc/net/bonding/NAME exists here:
these tests feed text written in the kernel's format (drivers/net/bonding/bond_procfs.c), and
say so in their names (test_fake_proc_net_bonding_*).
"""

from __future__ import annotations

from typing import Any

from labctl.agent.core.parsers import parse_bonding
from labctl.inventory.model import Bond
from labctl.network.bond_verify import verify_bond

HEAD_8023AD = """\
Ethernet Channel Bonding Driver: v6.1.0-18-amd64

Bonding Mode: IEEE 802.3ad Dynamic link aggregation
Transmit Hash Policy: layer3+4 (1)
MII Status: up
MII Polling Interval (ms): 100
Up Delay (ms): 0
Down Delay (ms): 0
Peer Notification Delay (ms): 0

802.3ad info
LACP active: on
LACP rate: fast
Min links: 0
Aggregator selection policy (ad_select): stable
System priority: 65535
System MAC address: 3c:ec:ef:4a:10:02
Active Aggregator Info:
\tAggregator ID: {active}
\tNumber of ports: {ports}
\tActor Key: 9
\tPartner Key: {pkey}
\tPartner Mac Address: {partner}
"""

SLAVE_8023AD = """
Slave Interface: {name}
MII Status: {mii}
Speed: {speed}
Duplex: {duplex}
Link Failure Count: 0
Permanent HW addr: 3c:ec:ef:4a:10:0{n}
Slave queue ID: 0
Aggregator ID: {agg}
Actor Churn State: {churn}
Partner Churn State: {churn}
Actor Churned Count: 0
Partner Churned Count: 0
details actor lacp pdu:
    system priority: 65535
    system mac address: 3c:ec:ef:4a:10:02
    port key: 9
    port priority: 255
    port number: {n}
    port state: 61
details partner lacp pdu:
    system priority: {ppri}
    system mac address: {partner}
    oper key: {pkey}
    port priority: 255
    port number: {pport}
    port state: {pstate}
"""

SWITCH = "70:4c:a5:21:9e:80"
ZERO = "00:00:00:00:00:00"


def lacp_text(
    partner: str = SWITCH, aggs: tuple[int, int] = (1, 1), mii: tuple[str, str] = ("up", "up")
) -> str:
    lacp = partner != ZERO
    text = HEAD_8023AD.format(
        active=aggs[0], ports=2 if aggs[0] == aggs[1] else 1, pkey=1001 if lacp else 1, partner=partner
    )
    for i, name in enumerate(("eno1", "eno2")):
        up = mii[i] == "up"
        text += SLAVE_8023AD.format(
            name=name,
            n=i + 1,
            mii=mii[i],
            speed="1000 Mbps" if up else "Unknown",
            duplex="full" if up else "Unknown",
            agg=aggs[i],
            churn="none" if lacp else "churned",
            ppri=32768 if lacp else 65535,
            partner=partner,
            pkey=1001 if lacp else 1,
            pport=7 + i if lacp else 1,
            pstate=63 if lacp else 1,
        )
    return text


BALANCE_RR = """\
Ethernet Channel Bonding Driver: v6.1.0-18-amd64

Bonding Mode: load balancing (round-robin)
MII Status: up
MII Polling Interval (ms): 100
Up Delay (ms): 0
Down Delay (ms): 0
Peer Notification Delay (ms): 0

Slave Interface: eno1
MII Status: up
Speed: 1000 Mbps
Duplex: full
Link Failure Count: 0
Permanent HW addr: 3c:ec:ef:4a:10:02
Slave queue ID: 0

Slave Interface: eno2
MII Status: up
Speed: 1000 Mbps
Duplex: full
Link Failure Count: 0
Permanent HW addr: 3c:ec:ef:4a:10:03
Slave queue ID: 0
"""


def bond(mode: str = "802.3ad", **kw: Any) -> Bond:
    return Bond(name="bond0", mode=mode, interfaces=["eno1", "eno2"], **kw)  # type: ignore[arg-type]


def test_fake_proc_net_bonding_8023ad_up_passes() -> None:
    parsed = parse_bonding(lacp_text())
    assert [s["partner_mac"] for s in parsed["slaves"]] == [SWITCH, SWITCH]
    assert verify_bond(parsed, bond(switch_ports=[1, 2])) == []


def test_fake_proc_net_bonding_8023ad_partner_all_zeros_names_the_switch_ports() -> None:
    # The switch ports are not an LACP group: no partner, and each port in its own aggregator.
    problems = verify_bond(parse_bonding(lacp_text(partner=ZERO, aggs=(1, 2))), bond(switch_ports=[3, 4]))
    text = "\n".join(problems)
    assert "no LACP partner" in text and ZERO in text and "switch ports 3, 4" in text
    assert "different aggregators (eno1: 1, eno2: 2)" in text
    assert len(problems) == 2


def test_fake_proc_net_bonding_8023ad_partner_zeros_in_one_aggregator() -> None:
    problems = verify_bond(parse_bonding(lacp_text(partner=ZERO)), bond())
    assert len(problems) == 1
    assert "no LACP partner" in problems[0] and "bond.switch_ports" in problems[0]


def test_fake_proc_net_bonding_8023ad_split_aggregators_with_a_partner() -> None:
    problems = verify_bond(parse_bonding(lacp_text(aggs=(1, 2))), bond(switch_ports=["gi1/0/1", "gi1/0/2"]))
    assert len(problems) == 1
    assert "different aggregators" in problems[0] and "gi1/0/1, gi1/0/2" in problems[0]


def test_fake_proc_net_bonding_one_member_down() -> None:
    problems = verify_bond(parse_bonding(lacp_text(mii=("up", "down"))), bond())
    assert problems == ["bond0 member eno2's MII status is down: check its cable and its switch port."]


def test_fake_proc_net_bonding_balance_rr_passes_and_mode_mismatch_is_named() -> None:
    parsed = parse_bonding(BALANCE_RR)
    assert verify_bond(parsed, bond("balance-rr")) == []
    problems = verify_bond(parsed, bond("802.3ad"))
    assert problems[0] == "bond0 runs in mode balance-rr, the inventory asks for 802.3ad."


def test_fake_proc_net_bonding_missing_and_extra_members() -> None:
    head, _, _ = BALANCE_RR.partition("\nSlave Interface: eno2")
    text = (
        head + "\n" + BALANCE_RR.partition("\nSlave Interface: eno2")[2].join(["\nSlave Interface: eth9", ""])
    )
    problems = verify_bond(parse_bonding(text), bond("balance-rr"))
    assert "eno2 is not a member of bond0: the kernel did not enslave it." in problems
    assert "bond0 also has member eth9, which the inventory does not list." in problems


def test_fake_proc_net_bonding_settings_that_differ_from_the_inventory() -> None:
    text = lacp_text().replace("LACP rate: fast", "LACP rate: slow").replace("layer3+4 (1)", "layer2 (0)")
    text = text.replace("MII Polling Interval (ms): 100", "MII Polling Interval (ms): 0")
    problems = verify_bond(parse_bonding(text), bond())
    assert problems == [
        "bond0 hashes with layer2, the inventory asks for layer3+4.",
        "bond0 has LACP rate slow, the inventory asks for fast.",
        "bond0 checks links every 0 ms, the inventory asks for 100.",
    ]


def test_no_bond_at_all() -> None:
    assert verify_bond(None, bond()) == [
        "the kernel has no bond bond0 (/proc/net/bonding/bond0 is missing) after the change."
    ]
