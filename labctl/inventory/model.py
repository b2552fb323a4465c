"""The inventory contract (DESIGN.md) as pydantic models.

Every model forbids unknown keys: a typo such as `ram_gbb` must stop the run, not be
ignored. Each field's description doubles as the "write this instead" part of an error.
Later features extend these models with new optional keys; never rename one.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}\Z)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\Z"
)
HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
ROLE_RE = re.compile(r"^[a-z][a-z0-9_-]*\Z")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class GPU(Strict):
    model: str = Field(description="the GPU's name, e.g. model: Tesla V100")
    memory_gb: float = Field(gt=0, description="memory per GPU in GB, e.g. memory_gb: 32")
    count: int = Field(1, ge=1, description="how many of this GPU the host has, e.g. count: 4")
    compute_capability: Optional[str] = Field(
        None, pattern=r"^\d+\.\d+$", description='CUDA compute capability, e.g. compute_capability: "7.0"'
    )


class CPU(Strict):
    model: Optional[str] = Field(None, description="e.g. model: 2x Intel Xeon E5-2680 v4")
    sockets: Optional[int] = Field(None, ge=1, description="e.g. sockets: 2")
    cores: Optional[int] = Field(None, ge=1, description="physical cores in total, e.g. cores: 28")
    threads: Optional[int] = Field(None, ge=1, description="logical CPUs in total, e.g. threads: 56")


class NIC(Strict):
    name: str = Field(description="interface name, e.g. name: eno1")
    speed_mbps: Optional[int] = Field(None, gt=0, description="link speed in Mbit/s, e.g. speed_mbps: 1000")


class Disk(Strict):
    name: str = Field(description="a label, e.g. name: fast-tier")
    size_tb: float = Field(gt=0, description="capacity in TB, e.g. size_tb: 48")
    kind: Optional[str] = Field(None, description="e.g. kind: raid5, nvme, ssd, hdd")
    path: Optional[str] = Field(None, description="where it is mounted, e.g. path: /srv/models")
    read_mbps: Optional[float] = Field(None, gt=0, description="sequential read in MB/s, e.g. read_mbps: 300")


class Bond(Strict):
    name: str = Field("bond0", description="bond interface name, e.g. name: bond0")
    mode: Literal["802.3ad", "balance-rr", "active-backup", "balance-xor", "balance-alb", "balance-tlb"] = (
        Field("802.3ad", description="a Linux bonding mode: 802.3ad (LACP), balance-rr, active-backup, ...")
    )
    interfaces: list[str] = Field(
        min_length=2, description="at least two NICs, e.g. interfaces: [eno1, eno2]"
    )
    address: Optional[ipaddress.IPv4Interface] = Field(
        None, description="address with prefix, e.g. address: 192.168.1.10/24"
    )
    gateway: Optional[ipaddress.IPv4Address] = Field(None, description="e.g. gateway: 192.168.1.1")
    xmit_hash_policy: Literal["layer2", "layer2+3", "layer3+4", "encap2+3", "encap3+4"] = Field(
        "layer3+4", description="how flows spread over members; layer3+4 lets parallel TCP streams use both"
    )
    miimon: int = Field(100, ge=0, description="link check interval in ms, e.g. miimon: 100")
    lacp_rate: Literal["slow", "fast"] = Field("fast", description="lacp_rate: fast or slow")


class ModelCache(Strict):
    path: str = Field(description="absolute path of the RAM cache, e.g. path: /mnt/model-cache")
    size_gb: float = Field(gt=0, description="tmpfs size in GB, e.g. size_gb: 200")
    source: Optional[str] = Field(None, description="the storage host to fill it from, e.g. source: irina")

    @field_validator("path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"'{v}' is not an absolute path")
        return v


class Storage(Strict):
    models: str = Field(description="folder holding the model library, e.g. models: /srv/models")
    tiers: list[Disk] = Field(default_factory=list, description="storage tiers, each a disk entry")


class Sandbox(Strict):
    languages: list[str] = Field(
        default_factory=lambda: ["python"], description="e.g. languages: [python, go]"
    )
    pool: int = Field(4, ge=1, le=256, description="warm containers kept ready, e.g. pool: 8")


Port = Annotated[int, Field(ge=1, le=65535, description="SSH port, 1-65535, e.g. port: 22")]


class ConnectionSettings(Strict):
    """Keys that may stand in `defaults` and in each host (the host's own win)."""

    user: Optional[str] = Field(None, description="SSH user, e.g. user: root")
    port: Optional[Port] = None
    connection: Optional[Literal["ssh", "local"]] = Field(
        None, description="connection: ssh (default) or local (this machine, no SSH)"
    )
    python: Optional[str] = Field(None, description="interpreter on the host, e.g. python: /usr/bin/python3")
    ssh_key: Optional[Path] = Field(None, description="private key file, e.g. ssh_key: keys/id_ed25519")
    known_hosts: Optional[Path] = Field(
        None, description="pinned host keys, e.g. known_hosts: keys/known_hosts"
    )
    os: Optional[Literal["linux", "windows"]] = Field(None, description="os: linux (default) or windows")
    connect_timeout: Optional[float] = Field(None, gt=0, description="seconds, e.g. connect_timeout: 10")
    command_timeout: Optional[float] = Field(None, gt=0, description="seconds, e.g. command_timeout: 600")


class Defaults(ConnectionSettings):
    pass


class HostSpec(ConnectionSettings):
    address: str = Field(description="IP address or DNS name, e.g. address: 192.168.1.10")
    roles: list[str] = Field(default_factory=list, description="e.g. roles: [train, inference, cache]")
    gpus: list[GPU] = Field(
        default_factory=list, description="e.g. gpus: [{model: Tesla P40, memory_gb: 24, count: 4}]"
    )
    ram_gb: Optional[float] = Field(None, gt=0, description="installed RAM in GB, e.g. ram_gb: 256")
    cpu: Optional[CPU] = None
    nics: list[NIC] = Field(default_factory=list, description="e.g. nics: [{name: eno1, speed_mbps: 1000}]")
    disks: list[Disk] = Field(default_factory=list, description="e.g. disks: [{name: os, size_tb: 3.7}]")
    bond: Optional[Bond] = None
    model_cache: Optional[ModelCache] = None
    storage: Optional[Storage] = None
    sandbox: Optional[Sandbox] = None
    notes: Optional[str] = Field(None, description="free text")

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        try:
            ipaddress.ip_address(v)
            return v
        except ValueError:
            pass
        if re.fullmatch(r"[0-9.]+", v) or not HOSTNAME_RE.match(v):
            raise ValueError(f"'{v}' is not an IP address or a host name")
        return v

    @field_validator("roles")
    @classmethod
    def _roles(cls, v: list[str]) -> list[str]:
        for r in v:
            if not ROLE_RE.match(r):
                raise ValueError(f"role '{r}' must be lower case letters, digits, '-' or '_'")
        return v


class Host(HostSpec):
    """A host with defaults merged in and every connection setting resolved."""

    name: str
    user: str = "root"
    port: Port = 22
    connection: Literal["ssh", "local"] = "ssh"
    python: str = "/usr/bin/python3"
    os: Literal["linux", "windows"] = "linux"
    connect_timeout: float = 10.0

    @property
    def is_windows(self) -> bool:
        return self.os == "windows"

    @property
    def gpu_count(self) -> int:
        return sum(g.count for g in self.gpus)

    def has_role(self, role: str) -> bool:
        return role in self.roles


class Inventory(Strict):
    lab: str = Field(description="a name for the lab, e.g. lab: homelab")
    path: Path
    hosts: dict[str, Host]

    def host(self, name: str) -> Host:
        return self.hosts[name]

    def roles(self) -> list[str]:
        seen: dict[str, None] = {}
        for h in self.hosts.values():
            for r in h.roles:
                seen.setdefault(r, None)
        return list(seen)
