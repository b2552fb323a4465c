"""How a revert brings a host's live network back: pure planning over `ip -j` output."""

from __future__ import annotations

from typing import Any

from labctl.agent.network.live import differences, owned_links, parse_state, restore_commands


def link(name: str, up: bool = True, master: str | None = None, kind: str | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {"ifname": name, "flags": ["BROADCAST", "UP"] if up else ["BROADCAST"]}
    if master:
        d["master"] = master
    if kind:
        d["linkinfo"] = {"info_kind": kind}
    return d


def addr(name: str, *cidrs: str) -> dict[str, Any]:
    info = []
    for c in cidrs:
        ip, plen = c.split("/")
        info.append(
            {
                "family": "inet6" if ":" in ip else "inet",
                "local": ip,
                "prefixlen": int(plen),
                "scope": "global",
            }
        )
    return {"ifname": name, "addr_info": info}


def route(dst: str, dev: str, gateway: str | None = None, kernel: bool = False) -> dict[str, Any]:
    r: dict[str, Any] = {"dst": dst, "dev": dev}
    if gateway:
        r["gateway"] = gateway
    if kernel:
        r.update(protocol="kernel", scope="link")
    return r


BEFORE = parse_state(
    [link("lo"), link("eno1"), link("eno2"), link("docker0", kind="bridge")],
    [addr("eno1", "192.168.1.10/24"), addr("eno2"), addr("docker0", "172.17.0.1/16")],
    [route("default", "eno1", "192.168.1.1"), route("192.168.1.0/24", "eno1", kernel=True)],
)

# What netplan leaves after applying a bond: eno1/eno2 enslaved, the address on bond0.
BONDED = parse_state(
    [
        link("eno1", master="bond0"),
        link("eno2", master="bond0"),
        link("bond0", kind="bond"),
        link("docker0", kind="bridge"),
        link("br-1234", kind="bridge"),  # Docker made a network meanwhile: not the change's
    ],
    [addr("bond0", "192.168.1.10/24"), addr("docker0", "172.17.0.1/16"), addr("br-1234", "172.18.0.1/16")],
    [
        route("default", "bond0", "192.168.1.1"),
        route("192.168.1.0/24", "bond0", kernel=True),
        route("172.18.0.0/16", "br-1234", kernel=True),
    ],
)


def test_a_bond_is_undone_by_deleting_it_and_giving_the_address_and_route_back() -> None:
    owned = owned_links(BEFORE, BONDED, "bonds: {bond0: {interfaces: [eno1, eno2]}}")
    assert owned == ["bond0"]
    cmds = restore_commands(BEFORE, BONDED, owned)
    assert cmds[0] == ["link", "del", "dev", "bond0"]
    assert ["addr", "add", "192.168.1.10/24", "dev", "eno1"] in cmds
    assert ["route", "add", "default", "via", "192.168.1.1", "dev", "eno1"] in cmds
    # The route over the deleted bond goes with it; Docker's bridge and its route are left alone.
    assert not any("br-1234" in c for c in cmds)
    assert not any(c[:2] == ["route", "del"] for c in cmds)


def test_links_the_change_does_not_name_are_not_its_to_delete_or_report() -> None:
    assert owned_links(BEFORE, BONDED, "ip addr add 10.0.0.1/24 dev eno2") == []
    assert owned_links(BEFORE, BONDED, "ip link add bond00 type bond") == []  # a word, not a prefix
    diff = differences(BEFORE, BONDED, ["bond0"])
    assert "link bond0 (bond) was not there before" in diff
    assert not any("br-1234" in d for d in diff)
    assert "eno1: master bond0 (was none)" in diff


def test_a_moved_address_is_swapped_back_and_the_lost_default_route_added() -> None:
    moved = parse_state(
        [link("eno1"), link("eno2"), link("docker0", kind="bridge")],
        [addr("eno1", "10.99.0.5/24"), addr("docker0", "172.17.0.1/16")],
        [route("10.99.0.0/24", "eno1", kernel=True)],
    )
    cmds = restore_commands(BEFORE, moved, [])
    assert cmds == [
        ["addr", "del", "10.99.0.5/24", "dev", "eno1"],
        ["addr", "add", "192.168.1.10/24", "dev", "eno1"],
        ["route", "add", "default", "via", "192.168.1.1", "dev", "eno1"],
    ]
    diff = differences(BEFORE, moved, [])
    assert "eno1: addresses 10.99.0.5/24 (was 192.168.1.10/24)" in diff
    assert "route default via 192.168.1.1 dev eno1 missing" in diff


def test_a_link_taken_down_comes_up_and_an_added_route_goes() -> None:
    now = parse_state(
        [link("eno1"), link("eno2", up=False), link("docker0", kind="bridge")],
        [addr("eno1", "192.168.1.10/24"), addr("docker0", "172.17.0.1/16")],
        [
            route("default", "eno1", "192.168.1.1"),
            route("192.168.1.0/24", "eno1", kernel=True),
            route("10.5.0.0/16", "eno1", "192.168.1.254"),
        ],
    )
    cmds = restore_commands(BEFORE, now, [])
    assert ["link", "set", "dev", "eno2", "up"] in cmds
    assert ["route", "del", "10.5.0.0/16", "via", "192.168.1.254", "dev", "eno1"] in cmds


def test_the_same_state_needs_nothing_and_differs_in_nothing() -> None:
    assert restore_commands(BEFORE, BEFORE) == []
    assert differences(BEFORE, BEFORE) == []


def test_dynamic_ipv6_addresses_are_left_to_the_router_but_link_local_ones_are_kept() -> None:
    entry = {
        "ifname": "eno1",
        "addr_info": [
            {"family": "inet6", "local": "fe80::1", "prefixlen": 64, "scope": "link"},
            {"family": "inet6", "local": "2001:db8::5", "prefixlen": 64, "scope": "global", "dynamic": True},
        ],
    }
    state = parse_state([link("eno1")], [entry], [])
    assert state["links"]["eno1"]["addresses"] == ["fe80::1/64"]
