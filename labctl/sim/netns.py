"""Network plumbing for the sim: a bridge, one namespace per host, veth NICs, tc shaping, iptables.

Each function does one change and is safe to call again; the `delete_*` ones accept things that
are already gone, so `sim down` can finish after a partial `up`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

from labctl.sim.commands import command_error, run
from labctl.sim.plan import NICS, tbf_args

NETNS_DIR = "/run/netns"


def link_exists(name: str, namespace: str | None = None) -> bool:
    cmd = ["ip"] + (["-n", namespace] if namespace else []) + ["link", "show", "dev", name]
    return run(cmd, check=False).returncode == 0


def namespaces() -> set[str]:
    out = run(["ip", "netns", "list"]).stdout
    # Lines look like "lc-m5 (id: 3)" or just "lc-m5".
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def namespace_exists(namespace: str) -> bool:
    return os.path.exists(os.path.join(NETNS_DIR, namespace))


# The bridge's alias names the sim folder that owns it, so a later `sim up` that meets the bridge
# can say which `sim down --dir` frees it (a run killed before its teardown leaves it behind).
OWNER_ALIAS = "labctl-sim:"


def create_bridge(name: str, address: str, prefixlen: int, owner: str) -> None:
    if not link_exists(name):
        run(["ip", "link", "add", name, "type", "bridge"])
    run(["ip", "link", "set", "dev", name, "alias", f"{OWNER_ALIAS}{owner}"])
    addr = f"{address}/{prefixlen}"
    if f" {addr} " not in run(["ip", "-4", "-o", "addr", "show", "dev", name]).stdout:
        run(["ip", "addr", "add", addr, "dev", name])
    run(["ip", "link", "set", name, "up"])


def bridge_owner(name: str) -> str | None:
    """The sim folder a labctl sim bridge was created for; None for a link labctl did not make."""
    proc = run(["ip", "-j", "link", "show", "dev", name], check=False)
    try:
        alias = str(json.loads(proc.stdout)[0].get("ifalias", ""))
    except (ValueError, IndexError, AttributeError):
        return None
    return alias[len(OWNER_ALIAS) :] if alias.startswith(OWNER_ALIAS) else None


def delete_link(name: str) -> bool:
    """Delete a link on this machine; False when it was not there."""
    if not link_exists(name):
        return False
    cmd = ["ip", "link", "del", name]
    proc = run(cmd, check=False)
    # A veth vanishes by itself once its peer's namespace is gone, possibly just after we looked.
    if proc.returncode != 0 and link_exists(name):
        raise command_error(cmd, proc)
    return proc.returncode == 0


def create_namespace(namespace: str) -> None:
    if not namespace_exists(namespace):
        run(["ip", "netns", "add", namespace])
    run(["ip", "-n", namespace, "link", "set", "lo", "up"])


def create_nic(bridge: str, namespace: str, veth: str, nic: str) -> None:
    """A veth pair: `nic` inside the namespace, `veth` on this machine enslaved to the bridge."""
    if not link_exists(nic, namespace):
        if link_exists(veth):  # a half left by an interrupted run
            run(["ip", "link", "del", veth])
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", nic, "netns", namespace])
    run(["ip", "link", "set", veth, "master", bridge, "up"])
    run(["ip", "-n", namespace, "link", "set", nic, "up"])


def set_address(namespace: str, nic: str, address: str, prefixlen: int) -> bool:
    """Give `nic` its address unless it has it; True when it changed."""
    cidr = f"{address}/{prefixlen}"
    current = run(["ip", "-n", namespace, "-4", "-o", "addr", "show", "dev", nic]).stdout
    if f" {cidr} " in current:
        return False
    run(["ip", "-n", namespace, "addr", "add", cidr, "dev", nic])
    return True


def shape(device: str, rate: str, namespace: str | None = None) -> None:
    """Limit what `device` sends to `rate` (a tbf root qdisc); replaces any earlier shaping."""
    ns = ["-n", namespace] if namespace else []
    run(["tc", *ns, "qdisc", "replace", "dev", device, "root", *tbf_args(rate)])


def shaped_rate(device: str, namespace: str | None = None) -> str | None:
    """The rate tc reports for `device`'s tbf root, e.g. '1Gbit'; None when it is not shaped."""
    ns = ["-n", namespace] if namespace else []
    out = run(["tc", *ns, "qdisc", "show", "dev", device, "root"], check=False).stdout.split()
    if "tbf" in out and "rate" in out:
        return out[out.index("rate") + 1]
    return None


def build_host(bridge: str, namespace: str, veths: tuple[str, str], address: str, prefixlen: int) -> None:
    """Namespace, both NICs and eth0's address; shaping and sshd are separate steps."""
    create_namespace(namespace)
    for veth, nic in zip(veths, NICS, strict=True):
        create_nic(bridge, namespace, veth, nic)
    set_address(namespace, NICS[0], address, prefixlen)


def host_is_wired(namespace: str, veths: tuple[str, str], address: str, prefixlen: int) -> bool:
    if not namespace_exists(namespace):
        return False
    if not all(link_exists(v) for v in veths) or not all(link_exists(n, namespace) for n in NICS):
        return False
    current = run(["ip", "-n", namespace, "-4", "-o", "addr", "show", "dev", NICS[0]]).stdout
    return f" {address}/{prefixlen} " in current


def shape_host(namespace: str, veths: tuple[str, str], rate: str) -> None:
    """Shape both NICs in both directions: egress inside the namespace and egress of each bridge-side peer."""
    for veth, nic in zip(veths, NICS, strict=True):
        shape(nic, rate, namespace)
        shape(veth, rate)


def namespace_pids(namespace: str) -> list[int]:
    if not namespace_exists(namespace):
        return []
    out = run(["ip", "netns", "pids", namespace], check=False).stdout
    return [int(p) for p in out.split() if p.isascii() and p.isdigit()]


def kill_namespace(namespace: str, grace: float = 2.0) -> int:
    """Stop every process in the namespace (TERM, then KILL after `grace` s); returns how many there were."""
    pids = namespace_pids(namespace)
    for pid in pids:
        send_signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = [p for p in pids if _running(p)]
    for pid in namespace_pids(namespace):
        send_signal(pid, signal.SIGKILL)
    return len(pids)


def delete_namespace(namespace: str) -> bool:
    if not namespace_exists(namespace):
        return False
    kill_namespace(namespace, grace=0.5)
    cmd = ["ip", "netns", "del", namespace]
    proc = run(cmd, check=False)
    if proc.returncode != 0 and namespace_exists(namespace):
        raise command_error(cmd, proc)
    return True


def send_signal(pid: int, sig: int) -> None:
    if pid <= 1:  # 0 and -1 would signal whole process groups, 1 is init
        return
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie waiting for a parent that never reaps it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _iptables() -> list[str] | None:
    path = shutil.which("iptables")
    return [path, "-w", "5"] if path else None


def forward_rule(bridge: str) -> list[str]:
    return ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]


def forward_rule_present(bridge: str) -> bool | None:
    """Whether the FORWARD ACCEPT rule for the bridge is in place; None when iptables is not installed.

    dockerd sets the FORWARD policy to DROP, and with br_netfilter that also drops frames between
    two ports of our bridge, i.e. between two sim hosts; the rule lets them through.
    """
    ipt = _iptables()
    if ipt is None:
        return None
    return run([*ipt, "-C", *forward_rule(bridge)], check=False).returncode == 0


def insert_forward_rule(bridge: str) -> None:
    ipt = _iptables()
    if ipt is not None:
        run([*ipt, "-I", *forward_rule(bridge)])


def remove_bridge_forwarding(bridge: str) -> bool:
    ipt = _iptables()
    if ipt is None:
        return False
    rule = forward_rule(bridge)
    if run([*ipt, "-C", *rule], check=False).returncode != 0:
        return False
    run([*ipt, "-D", *rule])
    return True
