"""What `bench network` measures and how it reads the figures: arguments, the link rate, the
explanation, seed 000's transfer time. Pure functions, unit-tested without a host."""

from __future__ import annotations

import ipaddress
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from labctl.modelload.stages import SEED_BYTES, SEED_SECONDS
from labctl.output.errors import InputError

if TYPE_CHECKING:
    from labctl.inventory.model import Host, Inventory

DEFAULT_STREAMS = (1, 2, 4)
DEFAULT_SECONDS = 5.0
MAX_STREAMS = 64  # one thread per stream on a host that may be busy serving models
MAX_SECONDS = 300.0


def parse_streams(text: str) -> list[int]:
    """`--streams 1,2,4`: stream counts, each a whole number from 1 to MAX_STREAMS; sorted, once each."""
    parts = [p.strip() for p in text.split(",")]
    bad = [p for p in parts if not (p.isascii() and p.isdigit() and 1 <= int(p) <= MAX_STREAMS)]
    if not text.strip() or bad:
        shown = ", ".join(repr(p) for p in bad) if bad and text.strip() else repr(text)
        raise InputError(
            f"--streams {text!r}: {shown} {'is' if len(bad) <= 1 else 'are'} not a stream count.",
            f"Give whole numbers from 1 to {MAX_STREAMS}, comma-separated, e.g. --streams 1,2,4.",
        )
    return sorted({int(p) for p in parts})


def check_seconds(seconds: float) -> float:
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_SECONDS):
        raise InputError(
            f"--seconds {seconds:g} is out of range.",
            f"Give how long each stream count sends, above 0 and at most {MAX_SECONDS:g}, e.g. --seconds 5.",
        )
    return seconds


def pick_hosts(inv: Inventory, sender: str | None, receiver: str | None) -> tuple[Host, Host]:
    """The two ends: named, known, different, and hosts labctl's agent runs on."""
    from labctl.cache.targets import host_named

    if not sender or not receiver:
        raise InputError(
            "bench network needs both ends: --from HOST (it sends) and --to HOST (it receives).",
            f"Hosts: {', '.join(inv.hosts)}. e.g. labctl bench network --from irina --to m5",
        )
    a, b = host_named(inv, sender), host_named(inv, receiver)
    if a.name == b.name:
        raise InputError(
            f"--from and --to both name {a.name}: a host's traffic to itself never touches the network.",
            f"Name two different hosts, e.g. --from {a.name} --to {next((h for h in inv.hosts if h != a.name), 'OTHER')}.",
        )
    windows = [h.name for h in (a, b) if h.is_windows]
    if windows:
        raise InputError(
            f"{' and '.join(windows)} {'is a Windows host' if len(windows) == 1 else 'are Windows hosts'}: "
            "labctl's agent, which runs both ends, runs on Linux only.",
            "Measure between two Linux hosts.",
        )
    return a, b


@dataclass
class HostLink:
    """What one end's facts and inventory say about the link its address is on."""

    host: str
    mbps: int | None = None
    nic: str | None = None
    source: str = "unknown"  # "bond", "nic" (the NIC reported it), "inventory" (declared), "unknown"
    bond_mode: str | None = None  # of a bond that is up and carries the address
    hash_policy: str | None = None
    members: int = 0
    declared_bond: str | None = None  # the inventory's bond, when it is not up on the host
    virtual_mbps: int | None = None  # what a virtual NIC reports (a veth says 10000): no link's speed

    def describe(self) -> str:
        where = f"{self.host}: "
        if self.source == "bond":
            return where + f"bond {self.nic} ({self.bond_mode}, {self.members} members) {self.mbps} Mbit/s"
        if self.source == "nic":
            return where + f"{self.nic} reports {self.mbps} Mbit/s"
        if not self.nic:
            why = "the NIC with its address is unknown"
        elif self.virtual_mbps:
            why = f"{self.nic} is virtual (it reports {self.virtual_mbps} Mbit/s, no link's speed)"
        else:
            why = f"{self.nic} reports no speed"
        if self.source == "inventory":
            return where + f"{why}; the inventory declares {self.mbps} Mbit/s"
        return where + f"{why} and the inventory declares none"


def _carries(nic: dict[str, Any], address: str) -> bool:
    for cidr in nic.get("addresses") or []:
        try:
            if str(ipaddress.ip_interface(cidr).ip) == address:
                return True
        except ValueError:
            continue
    return False


def host_link(host: Host, facts: dict[str, Any] | None) -> HostLink:
    """The rate of the link `host`'s inventory address is on: an up bond's speed, else its NIC's
    reported speed, else that NIC's speed declared in the inventory. A virtual NIC's reported
    speed is a placeholder (a veth says 10000 whatever shapes it), never taken for the link's."""
    link = HostLink(host.name)
    nics = [n for n in (facts or {}).get("nics") or [] if isinstance(n, dict)]
    carrier = next((n for n in nics if _carries(n, host.address)), None)
    up_bonds = [n for n in nics if n.get("is_bond") and n.get("operstate") == "up"]
    if carrier is None and len(up_bonds) == 1:
        carrier = up_bonds[0]  # an address given as a name: the bond is the likely path
    declared = {n.name: n.speed_mbps for n in host.nics if n.speed_mbps}
    if carrier is not None:
        link.nic = str(carrier.get("name"))
        if carrier.get("is_bond") and carrier.get("operstate") == "up":
            bond = carrier.get("bond") or {}
            link.bond_mode = bond.get("mode")
            link.hash_policy = bond.get("xmit_hash_policy")
            link.members = len(bond.get("slaves") or [])
            if carrier.get("speed_mbps"):
                link.mbps, link.source = int(carrier["speed_mbps"]), "bond"
        elif carrier.get("speed_mbps") and not carrier.get("virtual"):
            link.mbps, link.source = int(carrier["speed_mbps"]), "nic"
        else:
            link.virtual_mbps = carrier.get("speed_mbps") or None
        if link.source == "unknown" and declared.get(link.nic):
            link.mbps, link.source = declared[link.nic], "inventory"
    elif len(declared) == 1:
        link.mbps, link.source = next(iter(declared.values())), "inventory"
    if host.bond is not None and link.bond_mode is None:
        link.declared_bond = f"{host.bond.name} ({host.bond.mode})"
    return link


def path_mbps(links: list[HostLink]) -> int | None:
    """The slower end's rate: what the path between the two can carry (None when neither is known)."""
    known = [x.mbps for x in links if x.mbps]
    return min(known) if known else None


def explain(links: list[HostLink]) -> str:
    """Why one stream and several streams give what they give on this path."""
    bonds = [x for x in links if x.bond_mode]
    parts: list[str] = []
    for x in bonds:
        mode, policy = x.bond_mode, x.hash_policy or "layer2"
        if mode in ("802.3ad", "balance-xor"):
            if policy in ("layer3+4", "encap3+4"):
                parts.append(
                    f"{x.host}'s {x.nic} is {mode} with {policy} hashing: each TCP stream stays on one member "
                    "link, so one stream tops out at one link's speed and only several streams reach the sum "
                    "(two may still hash onto the same member)"
                )
            else:
                parts.append(
                    f"{x.host}'s {x.nic} is {mode} hashing {policy}: every stream between the same two hosts "
                    "takes the same member, so the bond adds nothing here (transmit-hash-policy layer3+4 "
                    "spreads streams)"
                )
        elif mode == "balance-rr":
            parts.append(
                f"{x.host}'s {x.nic} is balance-rr: it spreads even one stream's packets over every member "
                "(at the cost of reordering)"
            )
        else:
            parts.append(
                f"{x.host}'s {x.nic} is {mode}: traffic to one peer uses one member at a time, one link's speed"
            )
    slow = [x for x in links if not x.bond_mode and x.mbps]
    for x in bonds:
        capped = [y for y in slow if x.mbps and y.mbps is not None and y.mbps < x.mbps]
        if capped:
            y = capped[0]
            parts.append(f"{y.host} has one {y.mbps} Mbit/s link, which caps the path below {x.host}'s bond")
            break
    if not bonds:
        parts.append(
            "no bond at either end: one link carries every stream, so more streams cannot add bandwidth"
        )
    declared = [
        f"{x.host} declares {x.declared_bond} in the inventory but has no such bond up"
        for x in links
        if x.declared_bond
    ]
    return "; ".join(parts + declared) + "."


def seed_transfer(best_bits_per_s: float | None) -> dict[str, Any]:
    """Seed 000's 48 GB model at the measured rate, beside the seed's own 1 Gb and bonded figures."""
    return {
        "bytes": SEED_BYTES,
        "seconds_at_best": SEED_BYTES * 8 / best_bits_per_s if best_bits_per_s else None,
        "seed_seconds_1g": SEED_SECONDS["network_1g"],
        "seed_seconds_bonded": SEED_SECONDS["network_bonded"],
    }


@dataclass
class Run:
    streams: int
    mbps: float
    bytes: int
    seconds: float
    share: float | None
    per_stream_mbps: list[float] = field(default_factory=list)
    seconds_48gb: float | None = None
    connect_ms: float | None = None  # the fastest stream's TCP connect and hello: latency, roughly


def build_report(
    sender: Host,
    receiver: Host,
    seconds: float,
    measured: dict[str, Any],
    links: list[HostLink],
    sink: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON `bench network --json` prints, from netbench.send's answer and both ends' links."""
    link = path_mbps(links)
    runs: list[Run] = []
    for r in measured.get("runs") or []:
        bps = float(r["bits_per_s"])
        runs.append(
            Run(
                streams=int(r["streams"]),
                mbps=bps / 1e6,
                bytes=int(r["bytes"]),
                seconds=float(r["seconds"]),
                share=bps / 1e6 / link if link else None,
                per_stream_mbps=[float(x) / 1e6 for x in r.get("per_stream_bits_per_s") or []],
                seconds_48gb=SEED_BYTES * 8 / bps if bps > 0 else None,
                connect_ms=float(r["connect_ms"]) if r.get("connect_ms") is not None else None,
            )
        )
    best = max(runs, key=lambda x: x.mbps, default=None)
    return {
        "from": sender.name,
        "to": receiver.name,
        "address": receiver.address,
        "seconds": seconds,
        "link": {
            "mbps": link,
            "known": link is not None,
            "ends": [asdict(x) | {"text": x.describe()} for x in links],
        },
        "runs": [asdict(x) for x in runs],
        "best": {"streams": best.streams, "mbps": best.mbps, "share": best.share} if best else None,
        "explanation": explain(links),
        "seed": seed_transfer(best.mbps * 1e6 if best else None),
        "sink": sink,
    }
