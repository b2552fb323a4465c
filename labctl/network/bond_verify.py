"""After a bond is applied: does the kernel run the bond the inventory asks for?

Pure: it reads parse_bonding's view of /proc/net/bonding/NAME (labctl/agent/core/parsers.py), so the
transaction decides commit or revert from data, and every verdict is unit-tested.
"""

from __future__ import annotations

from typing import Any

from labctl.inventory.model import Bond
from labctl.network.bond_render import HASH_MODES, LACP_MODES, switch_ports_phrase

NO_PARTNER = "00:00:00:00:00:00"


def _ports(bond: Bond) -> str:
    hint = "" if bond.switch_ports else " (name them in bond.switch_ports)"
    return switch_ports_phrase(bond) + hint


def verify_bond(parsed: dict[str, Any] | None, bond: Bond) -> list[str]:
    """Problems, each one sentence: bond missing; mode, hash policy, LACP rate or MII interval
    not the inventory's; a member missing, extra or not up; for 802.3ad members in different
    aggregators or no LACP partner (a partner MAC of all zeros)."""
    name = bond.name
    if parsed is None:
        return [f"the kernel has no bond {name} (/proc/net/bonding/{name} is missing) after the change."]
    problems: list[str] = []
    mode = parsed.get("mode")
    if mode != bond.mode:
        problems.append(f"{name} runs in mode {mode or 'unknown'}, the inventory asks for {bond.mode}.")
    if bond.mode in HASH_MODES and parsed.get("xmit_hash_policy") not in (None, bond.xmit_hash_policy):
        problems.append(
            f"{name} hashes with {parsed['xmit_hash_policy']}, the inventory asks for {bond.xmit_hash_policy}."
        )
    if bond.mode in LACP_MODES and parsed.get("lacp_rate") not in (None, bond.lacp_rate):
        problems.append(
            f"{name} has LACP rate {parsed['lacp_rate']}, the inventory asks for {bond.lacp_rate}."
        )
    if parsed.get("miimon_ms") not in (None, bond.miimon):
        problems.append(
            f"{name} checks links every {parsed['miimon_ms']} ms, the inventory asks for {bond.miimon}."
        )
    if parsed.get("mii_status") not in (None, "up"):
        problems.append(f"{name}'s MII status is {parsed['mii_status']}: no member carries traffic.")
    slaves = {s.get("name"): s for s in parsed.get("slaves") or []}
    present = [m for m in bond.interfaces if m in slaves]
    for member in bond.interfaces:
        slave = slaves.get(member)
        if slave is None:
            problems.append(f"{member} is not a member of {name}: the kernel did not enslave it.")
        elif slave.get("mii_status") != "up":
            problems.append(
                f"{name} member {member}'s MII status is {slave.get('mii_status') or 'unknown'}: "
                "check its cable and its switch port."
            )
    extra = [s for s in slaves if s not in bond.interfaces]
    if extra:
        problems.append(
            f"{name} also has member {', '.join(map(str, extra))}, which the inventory does not list."
        )
    if bond.mode == "802.3ad":
        problems += _lacp(parsed, bond, [slaves[m] for m in present])
    return problems


def _lacp(parsed: dict[str, Any], bond: Bond, members: list[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    active = parsed.get("active_aggregator") or {}
    partners = {s["name"]: s["partner_mac"] for s in members if s.get("partner_mac")}
    no_partner = active.get("partner_mac") == NO_PARTNER or (
        partners and all(mac == NO_PARTNER for mac in partners.values())
    )
    if no_partner:
        problems.append(
            f"{bond.name} has no LACP partner (partner MAC {NO_PARTNER}): the switch is not doing LACP "
            f"on {_ports(bond)}; make them one LACP group (a static LAG is not enough)."
        )
    ids = {s["name"]: s.get("aggregator_id") for s in members}
    if len(members) > 1 and (len(set(ids.values())) > 1 or None in ids.values()):
        shown = ", ".join(f"{n}: {i if i is not None else 'none'}" for n, i in ids.items())
        problems.append(
            f"{bond.name}'s members are in different aggregators ({shown}), so only one carries traffic: "
            f"{_ports(bond)} must form one LACP group on the switch."
        )
    elif not no_partner:
        silent = [n for n, mac in partners.items() if mac == NO_PARTNER]
        if silent:
            problems.append(
                f"{bond.name} member {', '.join(silent)} has no LACP partner (partner MAC {NO_PARTNER}): "
                f"check that its port is in the LACP group with the others on {_ports(bond)}."
            )
    return problems
