"""Pure planning for the simulated lab: host names, addresses, interface names, file contents.

Nothing here touches the system, so every decision `labctl sim up` makes about names,
addresses and the inventory it writes is unit-tested without root.
"""

from __future__ import annotations

import copy
import ipaddress
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from labctl.agent.core import paths
from labctl.output.errors import InputError

DEFAULT_HOSTS: tuple[str, ...] = ("m5", "irina", "pharaoh", "workstation")
DEFAULT_RATE = "1gbit"
DEFAULT_BRIDGE = "lcbr0"
DEFAULT_PREFIX = "lc-"
DEFAULT_SUBNET = "10.250.0.0/24"
# Hosts start at .10 so the first few addresses stay free for the controller side.
FIRST_HOST_OFFSET = 10
NICS: tuple[str, str] = ("eth0", "eth1")
IFNAMSIZ = 15  # the kernel's limit on interface names

# Keys the sim decides for every host (its sshd, its key); a seed host's own values would be wrong here.
CONNECTION_KEYS = ("user", "port", "connection", "python", "ssh_key", "known_hosts")

_HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*\Z")
_BRIDGE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*\Z")
_RATE_RE = re.compile(
    r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)\Z", re.IGNORECASE | re.ASCII
)
_RATE_FACTORS = {
    "bit": 1,
    "kbit": 1_000,
    "mbit": 1_000_000,
    "gbit": 1_000_000_000,
    "tbit": 1_000_000_000_000,
    "bps": 8,
    "kbps": 8_000,
    "mbps": 8_000_000,
    "gbps": 8_000_000_000,
    "tbps": 8_000_000_000_000,
}


@dataclass(frozen=True)
class ManagedPath:
    """A path labctl changes on a host; each sim host gets its own copy bind-mounted over it."""

    path: str
    is_file: bool = False
    initial: str = ""  # content a fresh file starts with


_OWN_RC = "# {file} of a labctl simulated host: its own, not the machine's that runs the sim.\n"

# Later features that manage more paths on a host add them here; the sim then isolates them too.
MANAGED_PATHS: tuple[ManagedPath, ...] = (
    ManagedPath("/etc/netplan"),
    ManagedPath(
        "/etc/fstab",
        is_file=True,
        initial="# /etc/fstab of a labctl simulated host: static file system information.\n",
    ),
    ManagedPath("/etc/cron.d"),
    ManagedPath("/var/spool/cron"),
    ManagedPath(paths.HOME),
    ManagedPath("/mnt"),
    ManagedPath("/srv"),
    ManagedPath(paths.LOG_DIR),
    # Root's own keys: what `cron install` authorises lands in this host's copy, never in this
    # machine's /root/.ssh (the sshd reads it beside the sim's shared authorized_keys).
    ManagedPath("/root/.ssh"),
    # Root's shell start-up files: bash sources ~/.bashrc for every command sshd runs. Sharing this
    # machine's would run its pyenv/conda setup on each SSH command of every host, and a session
    # killed mid-`pyenv rehash` leaves a lock that then stalls every later command for a minute.
    ManagedPath("/root/.bashrc", is_file=True, initial=_OWN_RC.format(file="~/.bashrc")),
    ManagedPath("/root/.profile", is_file=True, initial=_OWN_RC.format(file="~/.profile")),
)


@dataclass(frozen=True)
class HostPlan:
    """One simulated host: its namespace, its address and the bridge-side ends of its two NICs."""

    name: str
    namespace: str
    address: str
    veths: tuple[str, str]  # bridge-side peers of eth0 and eth1, in that order


def host_names(hosts: Sequence[str] | None = None, count: int | None = None) -> list[str]:
    """The hosts to build: the given names (default the seed four), then node01, node02, ... up to count.

    >>> host_names(None, 6)
    ['m5', 'irina', 'pharaoh', 'workstation', 'node01', 'node02']
    """
    names = [h.strip() for h in (DEFAULT_HOSTS if hosts is None else hosts) if h.strip()]
    for n in names:
        if not _HOST_NAME_RE.match(n) or len(n) > 63:
            raise InputError(
                f"'{n}' is not a usable sim host name.",
                "Use letters, digits, '-' or '_' (at most 63), e.g. --hosts m5,irina.",
            )
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InputError(f"Host names given twice: {', '.join(dupes)}.", "Name each host once.")
    if count is None:
        if not names:
            raise InputError("No hosts to build.", "Give --hosts m5,irina or --count N.")
        return names
    if count < 1:
        raise InputError(f"--count must be at least 1, not {count}.", "For example --count 16.")
    names = names[:count]
    taken = set(names)
    i = 1
    while len(names) < count:
        candidate = f"node{i:02d}"
        if candidate not in taken:
            names.append(candidate)
            taken.add(candidate)
        i += 1
    return names


def parse_subnet(subnet: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.ip_network(subnet, strict=True)
    except ValueError as e:
        raise InputError(f"'{subnet}' is not a subnet: {e}.", "Give one like 10.250.0.0/24.") from None
    if not isinstance(net, ipaddress.IPv4Network):
        raise InputError(f"'{subnet}' is not an IPv4 subnet.", "Give one like 10.250.0.0/24.")
    if net.prefixlen > 28:
        raise InputError(f"The subnet {subnet} is too small for a lab.", "Use a /24, e.g. 10.250.0.0/24.")
    return net


def bridge_address(subnet: str) -> str:
    """The controller's address on the bridge (the subnet's first address), e.g. 10.250.0.1."""
    return str(parse_subnet(subnet).network_address + 1)


def host_capacity(subnet: str) -> int:
    net = parse_subnet(subnet)
    return net.num_addresses - FIRST_HOST_OFFSET - 1  # minus the broadcast address


def assign_addresses(
    names: Sequence[str], subnet: str, existing: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Address for each name: a host that already has one keeps it, new ones take the lowest free from .10.

    Keeping addresses stable means an existing host's known_hosts line and sessions stay valid when
    `sim up` adds hosts.
    """
    net = parse_subnet(subnet)
    existing = dict(existing or {})
    out: dict[str, str] = {}
    used = set()
    for n in names:
        if n in existing:
            addr = ipaddress.ip_address(existing[n])
            if addr not in net:
                raise InputError(
                    f"Host {n} has address {addr}, outside the sim subnet {subnet}.",
                    "Run `labctl sim down` and bring the lab up again.",
                )
            out[n] = str(addr)
            used.add(int(addr))
    # Addresses held by recorded hosts that are not wanted now are released, so they can be reused.
    candidate = int(net.network_address) + FIRST_HOST_OFFSET
    last = int(net.broadcast_address) - 1
    for n in names:
        if n in out:
            continue
        while candidate in used:
            candidate += 1
        if candidate > last:
            raise InputError(
                f"The subnet {subnet} has room for {host_capacity(subnet)} hosts, not {len(names)}.",
                "Use a bigger subnet, e.g. --subnet 10.250.0.0/22.",
            )
        out[n] = str(ipaddress.IPv4Address(candidate))
        used.add(candidate)
        candidate += 1
    return {n: out[n] for n in names}


def check_bridge_name(bridge: str) -> str:
    if not _BRIDGE_RE.match(bridge) or len(bridge) > 9:
        raise InputError(
            f"'{bridge}' is not a usable bridge name.",
            "Use at most 9 letters, digits, '-' or '_', starting with a letter (e.g. lcbr0); "
            "its veths are named after it and the kernel allows 15 characters.",
        )
    return bridge


def check_prefix(prefix: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,15}", prefix):
        raise InputError(
            f"'{prefix}' is not a usable namespace prefix.",
            "Use up to 16 letters, digits, '-', '_' or '.', e.g. lc-.",
        )
    return prefix


def veth_names(bridge: str, address: str, subnet: str) -> tuple[str, str]:
    """Bridge-side names of a host's eth0/eth1 peers: BRIDGE-OFFSET-N, e.g. lcbr0-10-0.

    Derived from the address, not the host name, so they are unique, stable and fit IFNAMSIZ
    whatever the host is called.
    """
    net = parse_subnet(subnet)
    offset = int(ipaddress.IPv4Address(address)) - int(net.network_address)
    names = (f"{bridge}-{offset}-0", f"{bridge}-{offset}-1")
    for n in names:
        if len(n) > IFNAMSIZ:
            raise InputError(
                f"The interface name {n} is longer than the kernel's {IFNAMSIZ} characters.",
                "Use a shorter --bridge name or a smaller subnet.",
            )
    return names


def plan_hosts(
    names: Sequence[str],
    subnet: str = DEFAULT_SUBNET,
    bridge: str = DEFAULT_BRIDGE,
    prefix: str = DEFAULT_PREFIX,
    existing: Mapping[str, str] | None = None,
) -> list[HostPlan]:
    """Everything about each host that follows from its name and the lab's network settings."""
    check_bridge_name(bridge)
    check_prefix(prefix)
    addresses = assign_addresses(names, subnet, existing)
    return [
        HostPlan(
            name=n,
            namespace=f"{prefix}{n}",
            address=addresses[n],
            veths=veth_names(bridge, addresses[n], subnet),
        )
        for n in names
    ]


def parse_rate(rate: str) -> int:
    """A tc rate such as 1gbit or 100mbit, in bits per second."""
    m = _RATE_RE.match(rate.strip())
    if not m:
        raise InputError(f"'{rate}' is not a link rate.", "Write it as tc does, e.g. 1gbit, 100mbit, 10gbit.")
    bits = int(float(m.group(1)) * _RATE_FACTORS[m.group(2).lower()])
    if bits < 8_000:
        raise InputError(f"The rate {rate} is too slow to carry SSH.", "Use at least 1mbit.")
    return bits


def tbf_args(rate: str) -> list[str]:
    """`tc qdisc replace ... root` arguments that shape one direction of a link to `rate`.

    The bucket holds ~4 ms of traffic (and at least 64 KiB, a full GSO segment from a veth)
    so TCP reaches the rate instead of stalling on a bucket smaller than one segment.
    """
    bits = parse_rate(rate)
    burst = max(bits // 8 // 250, 64 * 1024)
    return ["tbf", "rate", str(bits), "burst", str(burst), "latency", "20ms"]


def sshd_config(address: str, host_key: str, pid_file: str, authorized_keys: str, sftp: bool = True) -> str:
    """The sshd_config of one sim host; every path absolute, since sshd starts from anywhere.

    `sftp=False` leaves out the sftp Subsystem, as on minimal installs and some appliances.
    """

    def q(p: str) -> str:
        return f'"{p}"' if re.search(r"\s", p) else p

    return "\n".join(
        [
            "# Written by labctl sim up: one simulated host's sshd.",
            "Port 22",
            f"ListenAddress {address}",
            f"HostKey {q(host_key)}",
            f"PidFile {q(pid_file)}",
            f"AuthorizedKeysFile {q(authorized_keys)} .ssh/authorized_keys",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "UseDNS no",
            "PrintMotd no",
            # labctl opens one connection per host at once, and a test may fan out to 32 hosts.
            "MaxStartups 200",
            "MaxSessions 64",
            *(["Subsystem sftp internal-sftp"] if sftp else []),
            "AcceptEnv LANG LC_*",
            "",
        ]
    )


def start_script(hostname: str, host_root: str, sshd: str, config: str, log: str) -> str:
    """The `sh -c` script run in a host's fresh mount and UTS namespace before it becomes sshd.

    Each managed path gets the host's own copy bind-mounted over it; sshd and every session it forks
    inherit those mounts, so a write to /etc/fstab over SSH lands in DIR/hosts/NAME/root/etc/fstab.
    """
    lines = ["set -e", f"printf %s {shlex.quote(hostname)} > /proc/sys/kernel/hostname"]
    for mp in MANAGED_PATHS:
        src = host_root.rstrip("/") + mp.path
        lines.append(f"mount --bind {shlex.quote(src)} {shlex.quote(mp.path)}")
    # -D: sshd is its PID namespace's init and must not fork away from it.
    lines.append(f"exec {shlex.quote(sshd)} -D -f {shlex.quote(config)} -E {shlex.quote(log)}")
    return "; ".join(lines)


def _rename_nics(nics: Any) -> Any:
    """Point a seed host's NIC list at the sim's eth0/eth1, keeping each entry's other keys."""
    if isinstance(nics, list):
        out: list[Any] = []
        for i, nic in enumerate(nics[: len(NICS)]):
            if isinstance(nic, Mapping):
                out.append({**nic, "name": NICS[i]})
            else:
                out.append(NICS[i])
        return out
    if isinstance(nics, Mapping):
        return {NICS[i]: v for i, v in enumerate(list(nics.values())[: len(NICS)])}
    return nics


SIM_CACHE_GB = 2


def host_entry(address: str, seed: Mapping[str, Any] | None, gateway: str, prefixlen: int) -> dict[str, Any]:
    """The inventory mapping of one sim host: the seed host's declaration on sim addresses and NICs.

    A host not in the seed lab is a plain compute node.
    """
    if seed is None:
        return {"address": address, "roles": ["node"]}
    entry: dict[str, Any] = {"address": address}
    for k, v in seed.items():
        if k == "address" or k in CONNECTION_KEYS:
            continue
        entry[k] = copy.deepcopy(v)
    if isinstance(entry.get("bond"), Mapping):
        entry["bond"] = {
            **entry["bond"],
            "interfaces": list(NICS),
            "address": f"{address}/{prefixlen}",
            "gateway": gateway,
        }
    if "nics" in entry:
        entry["nics"] = _rename_nics(entry["nics"])
    mc = entry.get("model_cache")
    if isinstance(mc, Mapping) and isinstance(mc.get("size_gb"), (int, float)):
        # Every sim host shares this machine's RAM: a 200 GB cap would fail provision's RAM check.
        entry["model_cache"] = {**mc, "size_gb": min(mc["size_gb"], SIM_CACHE_GB)}
    return entry


def seed_hosts(seed_doc: Any) -> dict[str, Mapping[str, Any]]:
    """The `hosts:` mapping of a loaded seed lab file; empty when it has none."""
    if not isinstance(seed_doc, Mapping):
        return {}
    hosts = seed_doc.get("hosts")
    if not isinstance(hosts, Mapping):
        return {}
    return {str(k): v for k, v in hosts.items() if isinstance(v, Mapping)}


def lab_name(bridge: str) -> str:
    """The lab's name in its inventory: "sim" on the default bridge, else named after its own.
    Labs side by side share this machine's Docker, and what labctl keeps there (sandbox pools)
    is told apart by the lab's name."""
    return "sim" if bridge == DEFAULT_BRIDGE else f"sim-{bridge}"


def inventory_doc(
    plans: Sequence[HostPlan],
    subnet: str,
    python: str,
    seed: Mapping[str, Mapping[str, Any]] | None = None,
    lab: str = "sim",
) -> dict[str, Any]:
    """The inventory `sim up` writes, in the inventory contract (docs/inventory.md); key paths relative to the file."""
    net = parse_subnet(subnet)
    gateway = bridge_address(subnet)
    seed = seed or {}
    return {
        "lab": lab,
        "defaults": {
            "user": "root",
            "port": 22,
            "connection": "ssh",
            "python": python,
            "ssh_key": "keys/id_ed25519",
            "known_hosts": "keys/known_hosts",
        },
        "hosts": {p.name: host_entry(p.address, seed.get(p.name), gateway, net.prefixlen) for p in plans},
    }


def known_hosts_text(entries: Sequence[tuple[str, str]]) -> str:
    """OpenSSH known_hosts lines from (address, "ssh-ed25519 AAAA...") pairs; port 22 needs no brackets."""
    out = []
    for address, key in entries:
        parts = key.split()
        out.append(f"{address} {parts[0]} {parts[1]}")
    return "\n".join(out) + ("\n" if out else "")
