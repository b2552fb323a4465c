"""The bond probe and preflight on a simulated host over real SSH: this kernel has no bonding
driver, so the preflight refuses with "no bonding driver", and reading the host changes
nothing there (not /etc/netplan, not an address)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from labctl.inventory.model import Bond
from labctl.network.bond_preflight import preflight
from labctl.network.bond_render import bond_file, render_bond
from tests.conftest import sh

pytestmark = pytest.mark.integration

STATE = (
    "ip -j addr show; echo; ls -la --time-style=+%s /etc/netplan 2>&1; "
    "cat /etc/netplan/*.yaml 2>/dev/null | sha256sum"
)


def test_bond_probe_on_a_sim_host_refuses_without_a_driver_and_changes_nothing(lab: Any) -> None:
    if os.path.isdir("/sys/module/bonding"):
        pytest.skip("this kernel has the bonding driver: the sim hosts share it")
    from labctl.hosts.agent_ship import ask_agent
    from labctl.hosts.context import Context

    inv = lab.inventory_path
    before = sh(inv, "m5", STATE)
    ctx = Context.create(inventory_path=inv)
    try:
        host = ctx.inventory.host("m5")
        bond = host.bond
        assert bond is not None and bond.interfaces == ["eth0", "eth1"]  # the sim's m5 declares one
        args = {
            "name": bond.name,
            "path": bond_file(bond),
            "text": render_bond(bond, host.name),
            "members": bond.interfaces,
        }
        # read_only: as `provision --check` probes, the agent runs from memory and writes nothing.
        out = ask_agent(
            ctx, host, "provision.probe", {"probes": {"b": {"kind": "bond", **args}}}, read_only=True
        )
    finally:
        ctx.close()
    probe = out["results"]["b"]
    assert "error" not in probe, probe
    assert probe["driver"]["present"] is False
    assert {"eth0", "eth1"} <= set(probe["nics"])
    assert any(a.startswith(host.address + "/") for a in probe["addresses"]["eth0"])
    # sshd's view of the connection: the controller came in on eth0's address.
    assert probe["controller"]["server"] == host.address and probe["controller"]["dev"] == "eth0"
    assert probe["netplan"] is not None and probe["netplan_problems"] == [], probe["netplan_problems"]
    assert probe["file"] == {"exists": False, "text": None} and probe["bond"] is None

    problems = preflight(host, bond, probe, None)
    assert len(problems) == 1 and "no bonding driver" in problems[0] and "modprobe bonding" in problems[0]
    moved = Bond(**{**bond.model_dump(), "address": "10.99.0.5/24", "gateway": None})
    assert any("cut the controller off" in p for p in preflight(host, moved, probe, None))

    after = sh(inv, "m5", STATE)
    assert addresses(after) == addresses(before)
    assert after.split("\n\n", 1)[1] == before.split("\n\n", 1)[1]  # /etc/netplan: names, times, bytes


def addresses(state: str) -> dict[str, Any]:
    """Each link's state and addresses from `ip -j addr` (lifetimes and counters left out)."""
    return {
        link["ifname"]: (
            link.get("operstate"),
            sorted((a["family"], a["local"], a["prefixlen"]) for a in link.get("addr_info", [])),
        )
        for link in json.loads(state.split("\n\n")[0])
    }
