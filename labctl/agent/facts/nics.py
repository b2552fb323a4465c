"""Network interfaces from /sys/class/net, with bond state from /proc/net/bonding."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
from typing import Any, Dict, List, Optional

from ..core.parsers import parse_bonding, parse_if_inet6, parse_ip_addr_json

SYS_NET = "/sys/class/net"
IP_TIMEOUT_S = 3.0


def read_sysfs(path: str) -> Optional[str]:
    """A sysfs attribute, or None: reading speed or duplex of a link that is down or virtual
    fails with EINVAL, which means "unknown", not an error."""
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _int(text: Optional[str]) -> Optional[int]:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def link_name(path: str) -> Optional[str]:
    """Where a sysfs link points, by name (a NIC's master, its driver), or None when it has none."""
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def ip_binary() -> Optional[str]:
    """iproute2's `ip`: on PATH, else where Debian and others put it (an SSH session's PATH may
    lack /usr/sbin); None when the host has none."""
    return shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip", "/bin/ip") if os.path.exists(p)), None
    )


def addresses_from_ip() -> Optional[Dict[str, List[str]]]:
    exe = ip_binary()
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, "-j", "addr", "show"],
            capture_output=True,
            text=True,
            timeout=IP_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
        if proc.returncode != 0:
            return None
        return parse_ip_addr_json(proc.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        # iproute2 older than 4.14 has no -j; the fallback below covers it.
        return None


def _ipv4_by_ioctl(name: str) -> Optional[str]:
    """The primary IPv4 address with prefix, via SIOCGIFADDR and SIOCGIFNETMASK."""
    import fcntl

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        request = struct.pack("256s", name.encode()[:15])
        address = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), 0x8915, request)[20:24])
        netmask = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), 0x891B, request)[20:24])
    except OSError:
        return None
    finally:
        sock.close()
    prefix = bin(struct.unpack("!I", socket.inet_aton(netmask))[0]).count("1")
    return f"{address}/{prefix}"


def addresses_fallback(names: List[str]) -> Dict[str, List[str]]:
    ipv6: Dict[str, List[str]] = {}
    try:
        with open("/proc/net/if_inet6") as fh:
            ipv6 = parse_if_inet6(fh.read())
    except OSError:
        pass
    out: Dict[str, List[str]] = {}
    for name in names:
        ipv4 = _ipv4_by_ioctl(name)
        out[name] = ([ipv4] if ipv4 else []) + ipv6.get(name, [])
    return out


def bond_info(name: str) -> Dict[str, Any]:
    try:
        with open("/proc/net/bonding/" + name) as fh:
            return parse_bonding(fh.read())
    except OSError:
        # /proc/net/bonding can be hidden in a container; sysfs still has the basics.
        base = os.path.join(SYS_NET, name, "bonding")
        mode = read_sysfs(os.path.join(base, "mode"))
        slaves = read_sysfs(os.path.join(base, "slaves"))
        return {
            "mode": mode.split()[0] if mode else None,
            "mii_status": read_sysfs(os.path.join(base, "mii_status")),
            "slaves": [{"name": s} for s in (slaves or "").split()],
        }


def nic_facts(name: str, addresses: Dict[str, List[str]]) -> Dict[str, Any]:
    base = os.path.join(SYS_NET, name)
    speed = _int(read_sysfs(os.path.join(base, "speed")))
    is_bond = os.path.isdir(os.path.join(base, "bonding"))
    nic: Dict[str, Any] = {
        "name": name,
        "mac": read_sysfs(os.path.join(base, "address")),
        "operstate": read_sysfs(os.path.join(base, "operstate")),
        # Drivers report -1 (or 0) when the speed is unknown.
        "speed_mbps": speed if speed is not None and speed > 0 else None,
        "duplex": read_sysfs(os.path.join(base, "duplex")),
        "mtu": _int(read_sysfs(os.path.join(base, "mtu"))),
        "addresses": addresses.get(name, []),
        "is_bond": is_bond,
        "master": link_name(os.path.join(base, "master")),
        "driver": link_name(os.path.join(base, "device", "driver")),
        "virtual": not os.path.exists(os.path.join(base, "device")),
    }
    if is_bond:
        nic["bond"] = bond_info(name)
    return nic


def gather_nics() -> List[Dict[str, Any]]:
    # Skip files such as bonding_masters, which the bonding driver puts beside the links.
    names = sorted(n for n in os.listdir(SYS_NET) if n != "lo" and os.path.isdir(os.path.join(SYS_NET, n)))
    addresses = addresses_from_ip()
    if addresses is None:
        addresses = addresses_fallback(names)
    return [nic_facts(name, addresses) for name in names]
