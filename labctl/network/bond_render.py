"""The netplan file for an inventory `bond`: one file per bond, written only by labctl.

Pure: the text depends on the inventory alone, so `--check --diff` shows exactly what a run
would write, and a second run finds nothing to change.
"""

from __future__ import annotations

from typing import Any

from labctl.inventory.model import Bond

NETPLAN_DIR = "/etc/netplan"
# The kernel applies these only in some modes (Documentation/networking/bonding.rst); netplan
# accepts them in any mode and networkd then warns on the host, so they are left out elsewhere.
LACP_MODES = ("802.3ad",)
HASH_MODES = ("802.3ad", "balance-xor", "balance-tlb")


def bond_file(bond: Bond) -> str:
    """Where labctl keeps the bond's netplan file. The 90- prefix sorts it after the
    distribution's own files (50-cloud-init.yaml, 01-netcfg.yaml), so its member settings win."""
    return f"{NETPLAN_DIR}/90-labctl-{bond.name}.yaml"


def bond_parameters(bond: Bond) -> dict[str, Any]:
    params: dict[str, Any] = {"mode": bond.mode}
    if bond.mode in LACP_MODES:
        params["lacp-rate"] = bond.lacp_rate
    if bond.mode in HASH_MODES:
        params["transmit-hash-policy"] = bond.xmit_hash_policy
    params["mii-monitor-interval"] = bond.miimon
    return params


def bond_config(bond: Bond) -> dict[str, Any]:
    """The netplan document as data: members carry no address of their own, the bond does."""
    spec: dict[str, Any] = {"renderer": "networkd", "interfaces": list(bond.interfaces)}
    if bond.address is not None:
        spec["addresses"] = [str(bond.address)]
    if bond.gateway is not None:
        spec["routes"] = [{"to": "default", "via": str(bond.gateway)}]
    if bond.dns or bond.search:
        nameservers: dict[str, Any] = {}
        if bond.dns:
            nameservers["addresses"] = [str(a) for a in bond.dns]
        if bond.search:
            nameservers["search"] = list(bond.search)
        spec["nameservers"] = nameservers
    spec["parameters"] = bond_parameters(bond)
    # The renderer is set per device: a `network: renderer:` here would move every interface
    # of the host's other files (say NetworkManager's management NIC) to networkd too.
    member = {"renderer": "networkd", "dhcp4": False, "dhcp6": False}
    return {
        "network": {
            "version": 2,
            "ethernets": {nic: dict(member) for nic in bond.interfaces},
            "bonds": {bond.name: spec},
        }
    }


def render_bond(bond: Bond, host_name: str) -> str:
    """The file's text: a header that says who wrote it, then the netplan YAML."""
    import yaml

    header = (
        f"# Written by labctl from the inventory's bond for host {host_name}.\n"
        "# labctl provision replaces this file: change the inventory, not this file.\n"
    )
    body = yaml.safe_dump(bond_config(bond), sort_keys=False, default_flow_style=False, width=1000)
    return header + body


def switch_ports_phrase(bond: Bond) -> str:
    """The bond's switch ports as a sentence names them: the inventory's, else by their NICs."""
    if bond.switch_ports:
        return "switch ports " + ", ".join(str(p) for p in bond.switch_ports)
    return f"the switch ports that {', '.join(bond.interfaces)} plug into"


def lacp_reminder(bond: Bond, host_name: str) -> str | None:
    """For 802.3ad, what the switch must do for the bond to carry traffic on every member."""
    if bond.mode != "802.3ad":
        return None
    ports = switch_ports_phrase(bond)
    return (
        f"{host_name} {bond.name} is 802.3ad (LACP): {ports} must form one LACP group "
        "(an LACP port-channel; a static LAG is not enough), or the bond carries traffic on one member only"
        + ("" if bond.switch_ports else "; name them in the inventory with bond.switch_ports")
        + "."
    )


def switch_reminder(bond: Bond, host_name: str) -> str | None:
    """What the switch needs for any mode (Documentation/networking/bonding.rst, "Switch
    Configuration"): an LACP group for 802.3ad, a static group for balance-rr and balance-xor,
    which send one MAC address out of several ports; nothing for the others."""
    if bond.mode == "802.3ad":
        return lacp_reminder(bond, host_name)
    if bond.mode in ("balance-rr", "balance-xor"):
        return (
            f"{host_name} {bond.name} is {bond.mode}: {switch_ports_phrase(bond)} must form one static group "
            "(EtherChannel mode on / a static trunk, not LACP), or the switch sees the bond's MAC "
            "move between ports and drops traffic"
            + ("" if bond.switch_ports else "; name them in the inventory with bond.switch_ports")
            + "."
        )
    return None
