"""What a host offers for a bond, read before labctl changes anything: the bonding driver, the
NICs and their addresses, netplan, the bond's current state and file, and netplan's verdict on
the file labctl would write (the `bond` probe of `labctl provision`).

Standard library only, Python 3.8.
"""

from __future__ import annotations

import glob
import ipaddress
import json
import os
import subprocess
from typing import Any, Dict, List, Optional

from ..core.parsers import parse_bonding
from ..core.textedit import text_lines
from ..facts.nics import (
    IP_TIMEOUT_S,
    SYS_NET,
    addresses_fallback,
    addresses_from_ip,
    ip_binary,
    link_name,
    read_sysfs,
)
from .netplan import netplan_binary, netplan_problems

PROC_BONDING = "/proc/net/bonding"
SYS_MODULE = "/sys/module"
MODULES_DIRS = ("/lib/modules", "/usr/lib/modules")
MODULES_DISABLED = "/proc/sys/kernel/modules_disabled"


def bonding_driver(
    sys_module: str = SYS_MODULE,
    proc_dir: str = PROC_BONDING,
    modules_dirs: Any = MODULES_DIRS,
    release: Optional[str] = None,
    modules_disabled: str = MODULES_DISABLED,
) -> Dict[str, Any]:
    """{"present": bool, "how": str}: loaded now, built into the kernel, or loadable with
    modprobe (and module loading not switched off); else how says where labctl looked."""
    if os.path.isdir(os.path.join(sys_module, "bonding")) or os.path.isdir(proc_dir):
        return {"present": True, "how": "loaded"}
    release = release or os.uname().release
    module = None
    for base in modules_dirs:
        root = os.path.join(base, release)
        try:
            with open(os.path.join(root, "modules.builtin")) as f:
                if any(line.strip().endswith("/bonding.ko") for line in f):
                    return {"present": True, "how": "built into kernel " + release}
        except OSError:
            pass
        module = module or _module_file(root)
    if module is None:
        return {
            "present": False,
            "how": "kernel {}: not loaded ({}), not built in, no bonding.ko under {}".format(
                release,
                os.path.join(sys_module, "bonding"),
                " or ".join(os.path.join(b, release) for b in modules_dirs),
            ),
        }
    if read_sysfs(modules_disabled) == "1":
        return {
            "present": False,
            "how": f"kernel {release} has {module} but refuses to load modules (kernel.modules_disabled=1)",
        }
    return {"present": True, "how": f"loadable ({module})"}


def _module_file(root: str) -> Optional[str]:
    """bonding.ko(.xz/.zst) of the kernel whose modules live in root: where Debian puts it,
    else where modules.dep (modprobe's own index) says."""
    found = sorted(glob.glob(os.path.join(root, "kernel", "drivers", "net", "bonding", "bonding.ko*")))
    if found:
        return found[0]
    try:
        with open(os.path.join(root, "modules.dep")) as f:
            for line in f:
                path = line.partition(":")[0].strip()
                if os.path.basename(path).split(".ko")[0] == "bonding" and ".ko" in path:
                    full = os.path.join(root, path)
                    if os.path.exists(full):
                        return full
    except OSError:
        pass
    return None


def read_bond(name: str, proc_dir: str = PROC_BONDING) -> Optional[Dict[str, Any]]:
    """The bond's state as parse_bonding reads it, or None when the kernel has no such bond."""
    try:
        with open(os.path.join(proc_dir, name)) as f:
            return parse_bonding(f.read())
    except OSError:
        return None


def _nic_names() -> List[str]:
    try:
        return sorted(n for n in os.listdir(SYS_NET) if os.path.isdir(os.path.join(SYS_NET, n)))
    except OSError:
        return []


def _networkd_running() -> bool:
    if os.path.isdir("/run/systemd/netif"):
        return True
    for comm in glob.glob("/proc/[0-9]*/comm"):
        try:
            with open(comm) as f:
                if f.read().strip() == "systemd-network":  # comm is cut at 15 characters
                    return True
        except OSError:
            continue
    return False


def controller_path(environ: Optional[Dict[str, str]] = None) -> Optional[Dict[str, Any]]:
    """How the controller's SSH connection reaches this host: {"client", "server": the two ends
    (sshd's SSH_CONNECTION), "dev", "via": the route back to the client}, or None outside SSH.
    The server end is the address the controller reached, even when the inventory names a DNS name."""
    env = os.environ if environ is None else environ
    parts = (env.get("SSH_CONNECTION") or "").split()
    if len(parts) != 4:
        return None
    try:
        client = str(ipaddress.ip_address(parts[0].split("%")[0]))
        server = str(ipaddress.ip_address(parts[2].split("%")[0]))
    except ValueError:
        return None
    out: Dict[str, Any] = {"client": client, "server": server, "dev": None, "via": None}
    exe = ip_binary()
    if exe is None:
        return out
    route = _route_get(exe, ["-j", "route", "get", client])
    try:
        first = (json.loads(route) or [{}])[0] if route else None
    except (ValueError, IndexError):
        first = None
    if isinstance(first, dict):
        out["dev"], out["via"] = first.get("dev"), first.get("gateway")
    else:
        # iproute2 before 4.14 has no -j: "10.8.0.5 via 192.168.1.1 dev eno1 src ..."
        words = (_route_get(exe, ["route", "get", client]) or "").split()
        for key, name in (("dev", "dev"), ("via", "via")):
            if key in words[:-1]:
                out[name] = words[words.index(key) + 1]
    return out


def _route_get(exe: str, args: List[str]) -> Optional[str]:
    try:
        proc = subprocess.run(
            [exe, *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


IFUPDOWN = "/etc/network/interfaces"
IFUP_PATHS = ("/sbin/ifup", "/usr/sbin/ifup")


def ifupdown_conflicts(
    members: List[str], interfaces: str = IFUPDOWN, ifup: Optional[str] = None
) -> List[str]:
    """Each member that ifupdown also configures (an `iface`, `auto` or `allow-*` stanza in
    /etc/network/interfaces or a file it sources): networkd and ifupdown would fight over it.
    Nothing when ifupdown is not installed (`ifup` absent)."""
    ifup = ifup if ifup is not None else next((p for p in IFUP_PATHS if os.path.exists(p)), "")
    if not ifup or not os.path.exists(ifup):
        return []
    found: Dict[str, List[str]] = {}
    todo, seen = [interfaces], set()
    while todo:
        path = todo.pop(0)
        if path in seen:
            continue
        seen.add(path)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = text_lines(f.read())  # a comment holding U+2028 stays one comment
        except OSError:
            continue
        for line in lines:
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if words[0] in ("source", "source-directory") and len(words) > 1:
                pattern = (
                    words[1] if os.path.isabs(words[1]) else os.path.join(os.path.dirname(path), words[1])
                )
                if words[0] == "source-directory":
                    pattern = os.path.join(pattern, "*")
                todo += sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
                continue
            if words[0] == "iface" and len(words) > 1:
                names = [words[1]]
            elif words[0] == "auto" or words[0].startswith("allow-"):
                names = words[1:]
            else:
                continue
            for member in members:
                if member in names:
                    found.setdefault(member, []).append(f"{path}: {' '.join(words)}")
    return [
        f"{member} is also configured by ifupdown ({'; '.join(where)}); networkd and ifupdown would "
        "fight over it: remove its stanzas there"
        for member, where in found.items()
    ]


def _file_state(path: Optional[str]) -> Dict[str, Any]:
    if not path:
        return {"exists": False, "text": None}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return {"exists": True, "text": f.read()}
    except FileNotFoundError:
        return {"exists": False, "text": None}
    except OSError as e:
        # A folder or an unreadable file in the bond file's place: the plan must not treat it as absent.
        return {"exists": True, "text": None, "error": f"{path}: {e.strerror or e}"}


def bond_probe(args: Dict[str, Any]) -> Dict[str, Any]:
    """args: {"name": bond, "path": its netplan file, "text": the file labctl would write,
    "members": [nic, ...]} -> everything the preflight and the plan need, in one round trip."""
    name = args.get("name") or "bond0"
    members = list(args.get("members") or [])
    nics = _nic_names()
    addresses = addresses_from_ip()
    if addresses is None:
        addresses = addresses_fallback([n for n in nics if n != "lo"])
    netplan = netplan_binary()
    problems: List[str] = []
    if netplan is not None and args.get("path") and args.get("text") is not None:
        nic_ids = {
            m: {
                "mac": read_sysfs(os.path.join(SYS_NET, m, "address")),
                "driver": link_name(os.path.join(SYS_NET, m, "device", "driver")),
            }
            for m in members
        }
        problems = netplan_problems({args["path"]: args["text"]}, members, nic_ids=nic_ids)
    return {
        "driver": bonding_driver(),
        "nics": nics,
        "addresses": addresses,
        "netplan": netplan,
        "bond": read_bond(name),
        "file": _file_state(args.get("path")),
        "netplan_problems": problems,
        "systemd_networkd": _networkd_running(),
        "controller": controller_path(),
        "other_managers": ifupdown_conflicts(members),
        # A NIC enslaved to a bridge or another bond cannot join this bond.
        "masters": {m: link_name(os.path.join(SYS_NET, m, "master")) for m in members},
    }
