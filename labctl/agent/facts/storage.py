"""Mounted filesystems with their usage, and the block devices behind them."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from ..core.parsers import parse_mounts
from .nics import read_sysfs

# Kernel and container plumbing: never where models, caches or datasets live.
PSEUDO_FSTYPES = frozenset(
    [
        "proc",
        "sysfs",
        "cgroup",
        "cgroup2",
        "devpts",
        "devtmpfs",
        "mqueue",
        "debugfs",
        "tracefs",
        "securityfs",
        "pstore",
        "bpf",
        "configfs",
        "fusectl",
        "hugetlbfs",
        "autofs",
        "binfmt_misc",
        "rpc_pipefs",
        "nsfs",
        "efivarfs",
        "selinuxfs",
        "ramfs",
        "squashfs",
        "fuse.lxcfs",
        "fuse.portal",
        "fuse.gvfsd-fuse",
    ]
)
# statvfs on a network filesystem whose server is gone blocks forever, and would hang facts.
NETWORK_FSTYPES = frozenset(
    [
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "ceph",
        "glusterfs",
        "fuse.sshfs",
        "fuse.glusterfs",
        "fuse.s3fs",
        "lustre",
    ]
)
SKIP_MOUNT_PREFIXES = ("/proc/", "/sys/", "/var/lib/docker/", "/run/docker/", "/snap/")
SKIP_BLOCK_PREFIXES = ("loop", "ram", "zram")


def _usage(mountpoint: str) -> Dict[str, Optional[int]]:
    try:
        st = os.statvfs(mountpoint)
    except OSError:
        return {"size_bytes": None, "used_bytes": None, "free_bytes": None}
    return {
        "size_bytes": st.f_blocks * st.f_frsize,
        "used_bytes": (st.f_blocks - st.f_bfree) * st.f_frsize,
        # What an unprivileged writer can still use; root-reserved blocks excluded.
        "free_bytes": st.f_bavail * st.f_frsize,
    }


def select_mounts(mounts: List[Dict[str, str]]) -> List[Dict[str, str]]:
    """Drop pseudo filesystems, container layers and repeated entries; keep tmpfs."""
    seen = set()
    kept = []
    for mount in mounts:
        point = mount["mountpoint"]
        if mount["fstype"] in PSEUDO_FSTYPES or point.startswith(SKIP_MOUNT_PREFIXES):
            continue
        key = (mount["device"], point)
        if key in seen:
            continue
        seen.add(key)
        kept.append(mount)
    return kept


def gather_mounts() -> List[Dict[str, Any]]:
    with open("/proc/self/mounts") as fh:
        mounts = select_mounts(parse_mounts(fh.read()))
    out: List[Dict[str, Any]] = []
    for mount in mounts:
        entry: Dict[str, Any] = dict(mount)
        entry["network"] = mount["fstype"] in NETWORK_FSTYPES
        if entry["network"]:
            entry.update({"size_bytes": None, "used_bytes": None, "free_bytes": None})
        else:
            entry.update(_usage(mount["mountpoint"]))
        out.append(entry)
    return out


def gather_disks() -> List[Dict[str, Any]]:
    disks = []
    for name in sorted(os.listdir("/sys/block")):
        if name.startswith(SKIP_BLOCK_PREFIXES):
            continue
        base = os.path.join("/sys/block", name)
        sectors = read_sysfs(os.path.join(base, "size"))
        rotational = read_sysfs(os.path.join(base, "queue", "rotational"))
        removable = read_sysfs(os.path.join(base, "removable"))
        disks.append(
            {
                "name": name,
                # /sys/block/*/size counts 512-byte sectors whatever the device's sector size.
                "size_bytes": int(sectors) * 512
                if sectors and sectors.isascii() and sectors.isdigit()
                else None,
                "rotational": rotational == "1" if rotational is not None else None,
                "removable": removable == "1" if removable is not None else None,
                "model": read_sysfs(os.path.join(base, "device", "model")) or None,
            }
        )
    return disks
