"""The host's live network state (links, addresses, IPv4 routes) and how to put it back.

A network transaction snapshots this before its change and, when the change is not
committed, brings the host back to it with `ip` commands. Restoring the live state is what
`netplan try` cannot do for bonds: re-applying the old files leaves the bond device and its
enslaved NICs behind, so the links a change created are deleted and every NIC gets its old
master, state, addresses and routes back. Standard library only, Python 3.8.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any, Dict, List, Optional, Tuple

from ..facts.nics import ip_binary

IP_TIMEOUT_S = 10.0
# Link kinds a change can create (and so a revert may delete); a physical NIC or a veth the
# host did not make is never deleted.
VIRTUAL_KINDS = ("bond", "bridge", "vlan", "dummy", "macvlan", "ipvlan", "team", "vxlan")
# Route protocols the kernel adds and removes with addresses: restoring the addresses
# restores them, so they are neither added nor deleted by hand.
KERNEL_PROTOS = ("kernel",)

Snapshot = Dict[str, Any]


def _ip() -> str:
    # With no `ip` found the call fails and says so (FileNotFoundError names "ip").
    return ip_binary() or "ip"


def _ip_json(*args: str) -> Any:
    proc = subprocess.run(
        [_ip(), "-j", *args],
        capture_output=True,
        text=True,
        timeout=IP_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        raise RuntimeError("ip {} failed: {}".format(" ".join(args), proc.stderr.strip()))
    return json.loads(proc.stdout or "[]")


def _addresses(entry: Dict[str, Any]) -> List[str]:
    """The addresses a revert owns: IPv4 and IPv6 ones that are not dynamic (router
    advertisements give those back by themselves). IPv6 link-local ones are kept: a flush
    removes them, and the kernel makes them again only when the link goes down and up."""
    out = []
    for a in entry.get("addr_info") or []:
        if a.get("family") not in ("inet", "inet6") or "local" not in a:
            continue
        if a.get("family") == "inet6" and a.get("dynamic"):
            continue
        out.append("{}/{}".format(a["local"], a.get("prefixlen", 32)))
    return sorted(out)


def _route_key(r: Dict[str, Any]) -> Tuple[str, str, str]:
    return (str(r.get("dst", "")), str(r.get("gateway", "")), str(r.get("dev", "")))


def parse_state(
    links: List[Dict[str, Any]], addrs: List[Dict[str, Any]], routes: List[Dict[str, Any]]
) -> Snapshot:
    """The parts of `ip -j -d link`, `ip -j addr` and `ip -j route` a revert compares."""
    by_name: Dict[str, Dict[str, Any]] = {}
    for link in links:
        name = link.get("ifname")
        if not name or name == "lo":
            continue
        by_name[name] = {
            "up": "UP" in (link.get("flags") or []),
            "master": link.get("master"),
            "kind": (link.get("linkinfo") or {}).get("info_kind"),
            "addresses": [],
        }
    for entry in addrs:
        name = entry.get("ifname")
        if name in by_name:
            by_name[name]["addresses"] = _addresses(entry)
    kept = []
    for r in routes:
        kept.append(
            {
                k: r[k]
                for k in ("dst", "gateway", "dev", "protocol", "scope", "prefsrc", "metric")
                if r.get(k) not in (None, "")
            }
        )
    kept.sort(key=_route_key)
    return {"links": by_name, "routes": kept}


def snapshot() -> Snapshot:
    return parse_state(
        _ip_json("-d", "link", "show"), _ip_json("addr", "show"), _ip_json("route", "show", "table", "main")
    )


def _route_args(r: Dict[str, Any]) -> List[str]:
    args = [str(r["dst"])]
    if r.get("gateway"):
        args += ["via", str(r["gateway"])]
    if r.get("dev"):
        args += ["dev", str(r["dev"])]
    for key in ("protocol", "scope", "metric"):
        if r.get(key) not in (None, ""):
            args += ["proto" if key == "protocol" else key, str(r[key])]
    if r.get("prefsrc"):
        args += ["src", str(r["prefsrc"])]
    return args


def new_links(old: Snapshot, now: Snapshot, owned: Optional[List[str]] = None) -> List[str]:
    """Virtual links made since `old` that the change owns: those it names (`owned`), so a
    bridge Docker made meanwhile is never deleted; every new one when `owned` is None."""
    return sorted(
        n
        for n, link in now["links"].items()
        if n not in old["links"] and link.get("kind") in VIRTUAL_KINDS and (owned is None or n in owned)
    )


def restore_commands(old: Snapshot, now: Snapshot, owned: Optional[List[str]] = None) -> List[List[str]]:
    """The `ip` argument lists that take the host from `now` back to `old`, in an order that
    works: new virtual links go first (a bond releases its members), then each NIC's master
    and state, then addresses, then the routes that are not the kernel's own."""
    cmds: List[List[str]] = []
    old_links, now_links = old["links"], now["links"]
    gone = set(new_links(old, now, owned))
    for name in sorted(gone):
        cmds.append(["link", "del", "dev", name])
    for name, was in sorted(old_links.items()):
        cur = now_links.get(name)
        if cur is None:
            continue  # a link that vanished cannot be made again from here; differences() names it
        master = None if cur.get("master") in gone else cur.get("master")
        if master != was.get("master"):
            # A NIC must be down to join a bond; leaving one works while up.
            if was.get("master"):
                cmds.append(["link", "set", "dev", name, "down"])
                cmds.append(["link", "set", "dev", name, "master", str(was["master"])])
            else:
                cmds.append(["link", "set", "dev", name, "nomaster"])
        if master != was.get("master") or was.get("up") != cur.get("up"):
            cmds.append(["link", "set", "dev", name, "up" if was.get("up") else "down"])
        now_addrs = set(cur.get("addresses") or []) if master == cur.get("master") else set()
        for cidr in sorted(now_addrs - set(was.get("addresses") or [])):
            cmds.append(["addr", "del", cidr, "dev", name])
        for cidr in sorted(set(was.get("addresses") or []) - set(cur.get("addresses") or [])):
            cmds.append(["addr", "add", cidr, "dev", name])
    old_routes = {_route_key(r): r for r in old["routes"] if r.get("protocol") not in KERNEL_PROTOS}
    now_routes = {_route_key(r): r for r in now["routes"] if r.get("protocol") not in KERNEL_PROTOS}
    for key in sorted(set(now_routes) - set(old_routes)):
        dev = now_routes[key].get("dev")
        if dev not in gone and (dev in old_links or owned is None):
            cmds.append(["route", "del", *_route_args(now_routes[key])])
    for key in sorted(set(old_routes) - set(now_routes)):
        cmds.append(["route", "add", *_route_args(old_routes[key])])
    return cmds


def owned_links(old: Snapshot, now: Snapshot, change_text: str) -> List[str]:
    """The links made since `old` that the change names (in its commands or files), word for
    word: a revert deletes those and no others."""
    import re

    return sorted(
        n
        for n in now["links"]
        if n not in old["links"] and re.search(r"(?<![\w.-])" + re.escape(n) + r"(?![\w.-])", change_text)
    )


def differences(old: Snapshot, now: Snapshot, owned: Optional[List[str]] = None) -> List[str]:
    """What still differs from `old`, one phrase each; empty when the host is back. Links
    the change does not own (see new_links) and their routes are not its business."""
    out: List[str] = []
    old_links, now_links = old["links"], now["links"]
    ours = new_links(old, now, owned)
    for name in ours:
        out.append("link {} ({}) was not there before".format(name, now_links[name].get("kind")))
    for name, was in sorted(old_links.items()):
        cur = now_links.get(name)
        if cur is None:
            out.append(f"link {name} is gone")
            continue
        if cur.get("master") != was.get("master"):
            out.append(
                "{}: master {} (was {})".format(
                    name, cur.get("master") or "none", was.get("master") or "none"
                )
            )
        if cur.get("up") != was.get("up"):
            out.append(
                "{}: {} (was {})".format(
                    name, "up" if cur.get("up") else "down", "up" if was.get("up") else "down"
                )
            )
        if sorted(cur.get("addresses") or []) != sorted(was.get("addresses") or []):
            out.append(
                "{}: addresses {} (was {})".format(
                    name,
                    ", ".join(cur.get("addresses") or []) or "none",
                    ", ".join(was.get("addresses") or []) or "none",
                )
            )
    old_routes = {_route_key(r) for r in old["routes"]}
    theirs = {n for n in now_links if n not in old_links and n not in ours}
    now_routes = {_route_key(r) for r in now["routes"] if r.get("dev") not in theirs}
    for key in sorted(old_routes - now_routes):
        out.append(f"route {_describe_route(key)} missing")
    for key in sorted(now_routes - old_routes):
        out.append(f"route {_describe_route(key)} was not there before")
    return out


def _describe_route(key: Tuple[str, str, str]) -> str:
    dst, gw, dev = key
    return dst + (" via " + gw if gw else "") + (" dev " + dev if dev else "")


def run_ip(args: List[str]) -> Optional[str]:
    """Run one `ip` command; None when it worked, else its error."""
    try:
        proc = subprocess.run(
            [_ip(), *args],
            capture_output=True,
            text=True,
            timeout=IP_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return "ip {}: {}".format(" ".join(args), e)
    if proc.returncode != 0:
        return "ip {}: {}".format(" ".join(args), (proc.stderr or proc.stdout).strip())
    return None


def restore(old: Snapshot, owned: Optional[List[str]] = None, rounds: int = 3) -> Dict[str, Any]:
    """Bring the live state back to `old`; what ran, what failed, and what still differs.

    A few rounds, because one step can undo another's premise (deleting a bond drops the
    routes over it; an address comes back only once its NIC is up).
    """
    ran: List[str] = []
    errors: List[str] = []
    for _ in range(rounds):
        cmds = restore_commands(old, snapshot(), owned)
        if not cmds:
            break
        for args in cmds:
            ran.append("ip " + " ".join(args))
            err = run_ip(args)
            if err:
                errors.append(err)
    left = differences(old, snapshot(), owned)
    return {"ran": ran, "errors": errors if left else [], "differences": left}
