"""Before a bond is applied: can this host take it, and will labctl still reach it after?

Pure: it judges the `bond` probe's answer (labctl/agent/network/bondcheck.py) against the
inventory, so every refusal is unit-tested without a host. Each problem is one sentence that
names what to fix; an empty list means go ahead.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from labctl.inventory.model import Bond, Host


def preflight(host: Host, bond: Bond, probe: dict[str, Any], controller_reach: str | None) -> list[str]:
    """Problems in this order: no bonding driver; a member NIC missing, enslaved elsewhere, or
    the bond's name taken by a NIC; the change would cut the controller off; no netplan;
    netplan's own objections; ifupdown configuring a member. `controller_reach` is the address
    the controller's connection reaches the host at (None: the probe's SSH server end, else
    host.address)."""
    problems: list[str] = []
    driver = probe.get("driver") or {}
    if not driver.get("present"):
        how = driver.get("how") or "not found"
        problems.append(
            f"{host.name} has no bonding driver ({how}): load it with `modprobe bonding`, or boot a "
            "kernel built with CONFIG_BONDING (on Ubuntu, install linux-modules-extra-$(uname -r) or "
            "the generic kernel)."
        )
    nics = [n for n in probe.get("nics") or [] if n != "lo"]
    missing = [m for m in bond.interfaces if m not in nics]
    if missing:
        problems.append(
            f"{host.name} has no NIC {', '.join(missing)} for {bond.name}; its NICs are "
            f"{', '.join(nics) or 'none'}: fix bond.interfaces in the inventory."
        )
    taken = {
        m: master for m, master in (probe.get("masters") or {}).items() if master and master != bond.name
    }
    if taken:
        shown = "; ".join(f"{m} is already enslaved to {master}" for m, master in taken.items())
        problems.append(
            f"on {host.name}, {shown}: a NIC belongs to one bond or bridge only, so release it there first."
        )
    if (
        bond.name in nics
        and probe.get("bond") is None
        and bond.name not in (probe.get("masters") or {}).values()
    ):
        problems.append(
            f"{host.name} already has an interface {bond.name} that is not a bond: give the bond "
            "another name (bond.name)."
        )
    cut = _cuts_controller_off(host, bond, probe, controller_reach)
    if cut:
        problems.append(cut)
    if not probe.get("netplan"):
        problems.append(
            f"{host.name} has no netplan, and labctl writes bonds as netplan files: "
            "install it (apt-get install netplan.io)."
        )
    for message in probe.get("netplan_problems") or []:
        problems.append(f"netplan on {host.name} refuses the bond: {message}")
    for message in probe.get("other_managers") or []:
        problems.append(f"on {host.name}, {message}.")
    return problems


def _cuts_controller_off(
    host: Host, bond: Bond, probe: dict[str, Any], controller_reach: str | None
) -> str | None:
    """Whether the controller's way in runs over a member and the bond would not keep it: the
    address it reaches moves or goes, or its replies lose their route."""
    ssh = probe.get("controller") or {}
    reach_text = controller_reach or ssh.get("server") or host.address
    try:
        reach = ipaddress.ip_address(reach_text)
    except ValueError:
        # A DNS name and no SSH session to tell which address it resolved to: which NIC carries
        # it is unknown here, and the transaction's revert still covers a change that cuts it off.
        return None
    addresses: dict[str, list[str]] = probe.get("addresses") or {}
    on = [nic for nic in bond.interfaces for cidr in addresses.get(nic) or [] if _ip_of(cidr) == reach]
    if on:
        where = f"the controller reaches {host.name} at {reach} on {on[0]}, a member of {bond.name}"
        if bond.address is None:
            return (
                f"{where}, and the bond has no address, so the change would cut the controller off: give "
                f"the bond that address (bond.address: {reach}/PREFIX) or reach the host over a NIC "
                "outside the bond."
            )
        if reach.version != 4:
            return (
                f"{where}, and the bond carries IPv4 only ({bond.address}), so the change would cut the "
                f"controller off: set the host's address to {bond.address.ip}."
            )
        if bond.address.ip != reach:
            return (
                f"{where}, and the bond takes {bond.address}, so the change would cut the controller off: "
                f"give the bond {reach} (bond.address: {reach}/{bond.address.network.prefixlen}) or set the "
                f"host's address to {bond.address.ip} first."
            )
    return _loses_the_way_back(host, bond, ssh)


def _loses_the_way_back(host: Host, bond: Bond, ssh: dict[str, Any]) -> str | None:
    """The host answers the controller over a member; after the change only the bond's subnet
    and its gateway are reachable through those NICs."""
    if ssh.get("dev") not in bond.interfaces or bond.address is None or not ssh.get("client"):
        return None
    client = ipaddress.ip_address(ssh["client"])
    if client.version == 4 and client in bond.address.network:
        return None
    if client.version == 4 and bond.gateway is not None:
        return None
    via = f" via {ssh['via']}" if ssh.get("via") else ""
    fix = (
        f"set bond.gateway{': ' + ssh['via'] if ssh.get('via') else ''} (a router in {bond.address.network})"
        if client.version == 4
        else "reach the host over IPv4 (the bond carries IPv4 only)"
    )
    return (
        f"{host.name} answers the controller ({client}) over {ssh['dev']}{via}, a member of {bond.name}; "
        f"the bond reaches only {bond.address.network} and has no route to {client}, so the change would cut "
        f"the controller off: {fix}."
    )


def _ip_of(cidr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_interface(cidr.split("%")[0]).ip
    except ValueError:
        return None
