"""Pure parsers for the text files and command outputs facts are built from.

Each takes the text and returns plain data, so they are tested with sample text from real
hosts without needing those hosts.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any, Dict, List, Optional, Tuple

from .textedit import text_lines

# /proc/net/bonding prints the mode as prose; netplan and the inventory use the short names.
BOND_MODES = {
    "load balancing (round-robin)": "balance-rr",
    "fault-tolerance (active-backup)": "active-backup",
    "load balancing (xor)": "balance-xor",
    "fault-tolerance (broadcast)": "broadcast",
    "ieee 802.3ad dynamic link aggregation": "802.3ad",
    "transmit load balancing": "balance-tlb",
    "adaptive load balancing": "balance-alb",
}


def _int_or_none(text: Optional[str]) -> Optional[int]:
    if text is None:
        return None
    match = re.match(r"\s*(-?\d+)", text)
    return int(match.group(1)) if match else None


def parse_os_release(text: str) -> Dict[str, str]:
    """KEY=value lines; values follow shell quoting, as os-release(5) specifies."""
    out: Dict[str, str] = {}
    for line in text_lines(text):  # a value holding U+2028 is one line, as the shell reads it
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        try:
            value = " ".join(shlex.split(value))
        except ValueError:
            # Unbalanced quotes: keep the text rather than lose the field.
            value = value.strip().strip("\"'")
        out[key.strip()] = value
    return out


def parse_meminfo(text: str) -> Dict[str, int]:
    """/proc/meminfo as bytes per key ("MemTotal: 16318412 kB" -> 16710053888)."""
    out: Dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        parts = rest.split()
        if not parts:
            continue
        try:
            value = int(parts[0])
        except ValueError:
            continue
        if len(parts) > 1 and parts[1].lower() == "kb":
            value *= 1024
        out[key.strip()] = value
    return out


def memory_from_meminfo(info: Dict[str, int]) -> Dict[str, Any]:
    total = info["MemTotal"]
    available = info.get("MemAvailable")
    if available is None:
        # Kernels before 3.14 lack MemAvailable; this is the estimate free(1) used then.
        available = info.get("MemFree", 0) + info.get("Buffers", 0) + info.get("Cached", 0)
    return {
        "total_bytes": total,
        "available_bytes": available,
        "swap_total_bytes": info.get("SwapTotal", 0),
        "swap_free_bytes": info.get("SwapFree", 0),
        "shmem_bytes": info.get("Shmem"),
        "total_gib": round(total / 1024.0**3, 2),
        # The same GiB figure under its first, misleading name: scripts reading --json keep working.
        "total_gb": round(total / 1024.0**3, 2),
    }


def parse_cpuinfo(text: str) -> Dict[str, Any]:
    """Model, sockets, physical cores and logical CPUs from /proc/cpuinfo.

    Physical ids and core ids are absent on ARM and in some VMs; then sockets is 1 and cores
    is None, since the file does not say.
    """
    blocks: List[Dict[str, str]] = []
    current: Dict[str, str] = {}
    header: Dict[str, str] = {}
    for line in [*text.splitlines(), ""]:
        if not line.strip():
            if current:
                if "processor" in current:
                    blocks.append(current)
                else:
                    header.update(current)
                current = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            current[key.strip()] = value.strip()
    model = None
    for block in [*blocks, header]:
        for key in ("model name", "Model Name", "cpu model", "Processor", "Model", "Hardware"):
            if block.get(key):
                model = block[key]
                break
        if model:
            break
    sockets = {b["physical id"] for b in blocks if "physical id" in b}
    cores = {(b.get("physical id", "0"), b["core id"]) for b in blocks if "core id" in b}
    return {
        "model": model,
        "sockets": len(sockets) if sockets else (1 if blocks else None),
        "physical_cores": len(cores) if cores else None,
        "logical_cpus": len(blocks),
    }


def parse_bonding(text: str) -> Dict[str, Any]:
    """/proc/net/bonding/BOND: mode, MII status and per-slave state.

    Indented lines belong to the block above them ("Active Aggregator Info:", "details actor
    lacp pdu:"); only the active aggregator is kept, so per-slave keys are not overwritten by
    the LACP partner details that repeat the same names.
    """
    bond: Dict[str, Any] = {"slaves": []}
    slave: Optional[Dict[str, Any]] = None
    block: Optional[str] = None
    aggregator: Dict[str, str] = {}
    for raw in text.splitlines():
        if not raw.strip():
            block = None
            continue
        indented = raw[:1] in (" ", "\t")
        key, sep, value = raw.strip().partition(":")
        key, value = key.strip(), value.strip()
        if not sep:
            continue
        if indented:
            if block == "active aggregator info":
                aggregator[key.lower()] = value
            elif (
                block == "details partner lacp pdu"
                and slave is not None
                and key.lower() == "system mac address"
            ):
                # Per member: all zeros means no LACP partner answered on that port.
                slave["partner_mac"] = value
            continue
        if not value:
            block = key.lower()
            continue
        block = None
        lkey = key.lower()
        if lkey == "slave interface":
            slave = {"name": value}
            bond["slaves"].append(slave)
            continue
        target = slave if slave is not None else bond
        if lkey == "bonding mode":
            bond["mode"] = BOND_MODES.get(value.lower(), value)
            bond["mode_text"] = value
        elif lkey == "mii status":
            target["mii_status"] = value
        elif lkey == "speed":
            target["speed_mbps"] = _int_or_none(value)
        elif lkey == "duplex":
            target["duplex"] = value
        elif lkey == "link failure count":
            target["link_failure_count"] = _int_or_none(value)
        elif lkey == "permanent hw addr":
            target["permanent_hw_addr"] = value
        elif lkey == "aggregator id":
            target["aggregator_id"] = _int_or_none(value)
        elif lkey == "currently active slave":
            bond["active_slave"] = None if value == "None" else value
        elif lkey == "transmit hash policy":
            bond["xmit_hash_policy"] = value.split(" (")[0]
        elif lkey == "lacp rate":
            bond["lacp_rate"] = value
        elif lkey == "mii polling interval (ms)":
            bond["miimon_ms"] = _int_or_none(value)
        elif lkey == "ethernet channel bonding driver":
            bond["driver_version"] = value
    if aggregator:
        active_id = _int_or_none(aggregator.get("aggregator id"))
        bond["active_aggregator"] = {
            "id": active_id,
            "ports": _int_or_none(aggregator.get("number of ports")),
            "partner_mac": aggregator.get("partner mac address"),
        }
        # A slave outside the active aggregator carries no traffic: the usual sign that the
        # switch side of an 802.3ad bond is not configured for that port.
        for item in bond["slaves"]:
            if "aggregator_id" in item:
                item["in_active_aggregator"] = item["aggregator_id"] == active_id
    return bond


def _na(value: str) -> Optional[str]:
    value = value.strip()
    if not value or (value.startswith("[") and value.endswith("]")) or value in ("N/A", "Not Supported"):
        return None
    return value


def _float_or_none(text: Optional[str]) -> Optional[float]:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _mib_to_bytes(value: str) -> Optional[int]:
    number = _na(value)
    if number is None:
        return None
    try:
        return int(float(number) * 1024 * 1024)
    except ValueError:
        return None


NVIDIA_SMI_FIELDS = (
    "index",
    "name",
    "uuid",
    "memory.total",
    "memory.used",
    "compute_cap",
    "driver_version",
    "utilization.gpu",
    "temperature.gpu",
    "pci.bus_id",
    "power.draw",
)


def parse_nvidia_smi_csv(text: str, fields: Tuple[str, ...] = NVIDIA_SMI_FIELDS) -> List[Dict[str, Any]]:
    """`nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits` -> one dict per GPU.

    Unavailable values ("[N/A]", "[Not Supported]", "N/A") become None. Memory is in MiB.
    """
    gpus: List[Dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) > len(fields) and "name" in fields:
            # A name with a comma in it: keep the extra cells in the name.
            extra = len(cells) - len(fields)
            at = fields.index("name")
            cells[at : at + extra + 1] = [", ".join(cells[at : at + extra + 1])]
        # No zip(strict=...): that needs Python 3.10, and short rows are fine (cells are optional).
        row = {f: (cells[i] if i < len(cells) else "") for i, f in enumerate(fields)}
        index = _int_or_none(_na(row.get("index", "")))
        gpus.append(
            {
                "index": index if index is not None else len(gpus),
                "name": _na(row.get("name", "")),
                "uuid": _na(row.get("uuid", "")),
                "memory_total_bytes": _mib_to_bytes(row.get("memory.total", "")),
                "memory_used_bytes": _mib_to_bytes(row.get("memory.used", "")),
                "compute_capability": _na(row.get("compute_cap", "")),
                "driver_version": _na(row.get("driver_version", "")),
                "utilization_pct": _int_or_none(_na(row.get("utilization.gpu", ""))),
                "temperature_c": _int_or_none(_na(row.get("temperature.gpu", ""))),
                "pci_bus_id": _na(row.get("pci.bus_id", "")),
                "power_w": _float_or_none(_na(row.get("power.draw", ""))),
            }
        )
    return gpus


def cuda_version_string(code: Optional[int]) -> Optional[str]:
    """CUDA's integer version (12020) as "12.2"."""
    if not code or code <= 0:
        return None
    return f"{code // 1000}.{(code % 1000) // 10}"


def nccl_version_string(version: Any) -> Optional[str]:
    """torch.cuda.nccl.version(): a tuple (2, 18, 3) in recent torch, an int in old ones."""
    if version is None:
        return None
    if isinstance(version, (tuple, list)):
        return ".".join(str(part) for part in version)
    code = int(version)
    # NCCL changed its version code from major*1000+minor*100+patch at 2.9.
    if code >= 10000:
        return f"{code // 10000}.{(code % 10000) // 100}.{code % 100}"
    return f"{code // 1000}.{(code % 1000) // 100}.{code % 100}"


def parse_ip_addr_json(text: str) -> Dict[str, List[str]]:
    """`ip -j addr` -> {ifname: ["192.168.1.10/24", "fe80::1/64", ...]}."""
    out: Dict[str, List[str]] = {}
    data = json.loads(text) if text.strip() else []
    for link in data:
        name = link.get("ifname")
        if not name:
            continue
        addresses = out.setdefault(name, [])
        for info in link.get("addr_info") or []:
            local = info.get("local")
            if local is None:
                continue
            prefix = info.get("prefixlen")
            addresses.append(f"{local}/{prefix}" if prefix is not None else str(local))
    return out


def parse_if_inet6(text: str) -> Dict[str, List[str]]:
    """/proc/net/if_inet6 (hex address, index, prefix length, scope, flags, name) -> CIDRs."""
    import ipaddress

    out: Dict[str, List[str]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 6 or len(parts[0]) != 32:
            continue
        try:
            address = ipaddress.IPv6Address(int(parts[0], 16))
            prefix = int(parts[2], 16)
        except ValueError:
            continue
        out.setdefault(parts[5], []).append(f"{address}/{prefix}")
    return out


def unescape_mount_field(value: str) -> str:
    """/proc/self/mounts writes space, tab, newline and backslash as octal escapes (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), value)


def parse_mounts(text: str) -> List[Dict[str, str]]:
    mounts: List[Dict[str, str]] = []
    # The kernel escapes only blanks, newline and backslash in a field: U+2028 or U+00A0 in a
    # mount point is part of it, so cut at "\n" and " " alone.
    for line in text_lines(text):
        parts = [f for f in line.split(" ") if f]
        if len(parts) < 4:
            continue
        mounts.append(
            {
                "device": unescape_mount_field(parts[0]),
                "mountpoint": unescape_mount_field(parts[1]),
                "fstype": parts[2],
                "options": parts[3],
            }
        )
    return mounts
