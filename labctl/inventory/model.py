"""The inventory contract (docs/inventory.md) as pydantic models.

Every model forbids unknown keys: a typo such as `ram_gbb` must stop the run, not be
ignored. Each field's description doubles as the "write this instead" part of an error.
Later features extend these models with new optional keys; never rename one.
"""

from __future__ import annotations

import ipaddress
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from labctl.agent.core import paths

HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}\Z)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\Z"
)
HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
ROLE_RE = re.compile(r"^[a-z][a-z0-9_-]*\Z")
# What reaches command lines, a cron launcher's #! line and SSH: an absolute path (POSIX, or a
# Windows drive path) or a command name on the host's PATH, with no blank, quote or control character.
PYTHON_RE = re.compile(
    r"/[A-Za-z0-9._+@=,~/-]*|[A-Za-z]:[\\/][A-Za-z0-9._+@=,~\\/-]*|[A-Za-z0-9_][A-Za-z0-9._+-]*", re.ASCII
)
# A POSIX user name (the portable file name characters, not starting with '-' or '.').
USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}", re.ASCII)


def _is_number(annotation: Any) -> bool:
    if annotation in (int, float):
        return True
    return any(_is_number(a) for a in typing.get_args(annotation) if a is not bool)


class Strict(BaseModel):
    """The base of every model a document or the command line fills (inventory, playbook
    parameters, training settings): unknown keys, `.inf`/`.nan` and yes/no for a number are
    errors (YAML reads `true` as a bool, and pydantic would take it as 1)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_yes_no(cls, v: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(v, bool) and field is not None and _is_number(field.annotation):
            raise ValueError(f"{str(v).lower()} is a yes/no value, not a number")
        return v


# Folders a mount would hide or break the system under: "/", the top-level folders
# themselves, anything under these, and the working folders of /var.
SYSTEM_TREES = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    paths.HOME,
)
SYSTEM_FOLDERS = (
    "/home",
    "/media",
    "/mnt",
    "/opt",
    "/root",
    "/srv",
    "/tmp",
    "/var",
    "/var/lib",
    "/var/log",
    "/var/cache",
    "/var/spool",
    "/var/tmp",
    "/var/backups",
    "/var/mail",
)


def host_path(v: str) -> str:
    """A path on a host as labctl writes it into fstab, cron, units or a command line:
    absolute, without control, separator or invisible characters (paths.char_problem) or `..`,
    normalised (`/mnt/x/` → `/mnt/x`)."""
    odd = paths.char_problem(v)
    if odd:
        # é stays welcome; what a line-splitting reader would cut at, or no one can see, does not.
        raise ValueError(f"{v!r} contains {odd}; write the path on one line, in visible characters")
    if not v.startswith("/"):
        raise ValueError(f"'{v}' is not an absolute path; write it from /, e.g. /mnt/model-cache")
    if ".." in v.split("/"):
        raise ValueError(f"'{v}' goes up with '..'; write the folder it means")
    return "/" + "/".join(p for p in v.split("/") if p not in ("", "."))


def mount_path(v: str) -> str:
    """A `host_path` that labctl mounts something on: never a system folder, which it would hide."""
    v = host_path(v)
    if v == "/" or v in SYSTEM_FOLDERS or any(v == t or v.startswith(t + "/") for t in SYSTEM_TREES):
        raise ValueError(
            f"'{v}' is a system folder; mounting there would hide what the host keeps in it. "
            "Use a folder of its own, e.g. /mnt/model-cache"
        )
    return v


HostPath = Annotated[str, AfterValidator(host_path)]
MountPath = Annotated[str, AfterValidator(mount_path)]


class GPU(Strict):
    model: str = Field(description="the GPU's name, e.g. model: Tesla V100")
    memory_gb: float = Field(gt=0, description="memory per GPU in GB, e.g. memory_gb: 32")
    count: int = Field(1, ge=1, description="how many of this GPU the host has, e.g. count: 4")
    compute_capability: Optional[str] = Field(
        None,
        pattern=r"^[0-9]+\.[0-9]+$",
        description='CUDA compute capability, e.g. compute_capability: "7.0"',
    )


class CPU(Strict):
    model: Optional[str] = Field(None, description="e.g. model: 2x Intel Xeon E5-2680 v4")
    sockets: Optional[int] = Field(None, ge=1, description="e.g. sockets: 2")
    cores: Optional[int] = Field(None, ge=1, description="physical cores in total, e.g. cores: 28")
    threads: Optional[int] = Field(None, ge=1, description="logical CPUs in total, e.g. threads: 56")


def iface_name(v: str) -> str:
    """A Linux interface name as netplan and `ip` take it: 1-15 characters, no blank or '/'."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,15}", v) or v in (".", ".."):
        raise ValueError(f"{v!r} is not an interface name (1-15 letters, digits, '_', '-' or '.')")
    return v


IfaceName = Annotated[str, AfterValidator(iface_name)]


def domain_name(v: str) -> str:
    """A DNS search domain as resolv.conf takes it: labels of letters, digits and '-'."""
    if not HOSTNAME_RE.match(v):
        raise ValueError(f"{v!r} is not a domain name (labels of letters, digits and '-', e.g. lab.example)")
    return v


def switch_port(v: Any) -> str | int:
    """A switch port as the switch's console names it: a number, or a name such as gi1/0/1."""
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        what = "a yes/no value" if isinstance(v, bool) else repr(v)
        raise ValueError(f"{what} is not a switch port; write a number or a name, e.g. 1 or gi1/0/1")
    if isinstance(v, int) and v < 0:
        raise ValueError(f"switch port {v} is negative")
    if isinstance(v, str) and not re.fullmatch(r"[A-Za-z0-9_./:-]{1,64}", v):
        raise ValueError(f"{v!r} is not a switch port name (letters, digits, '/', '.', ':', '-', '_')")
    return v


DomainName = Annotated[str, AfterValidator(domain_name)]
SwitchPort = Annotated[int | str, BeforeValidator(switch_port)]


class NIC(Strict):
    name: IfaceName = Field(description="interface name, e.g. name: eno1")
    speed_mbps: Optional[int] = Field(None, gt=0, description="link speed in Mbit/s, e.g. speed_mbps: 1000")


class Disk(Strict):
    name: str = Field(description="a label, e.g. name: fast-tier")
    size_tb: float = Field(gt=0, description="capacity in TB, e.g. size_tb: 48")
    kind: Optional[str] = Field(None, description="e.g. kind: raid5, nvme, ssd, hdd")
    path: Optional[HostPath] = Field(None, description="where it is mounted, e.g. path: /srv/models")
    read_mbps: Optional[float] = Field(None, gt=0, description="sequential read in MB/s, e.g. read_mbps: 300")


class Bond(Strict):
    name: IfaceName = Field("bond0", description="bond interface name, e.g. name: bond0")
    mode: Literal["802.3ad", "balance-rr", "active-backup", "balance-xor", "balance-alb", "balance-tlb"] = (
        Field("802.3ad", description="a Linux bonding mode: 802.3ad (LACP), balance-rr, active-backup, ...")
    )
    interfaces: list[IfaceName] = Field(
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
    dns: list[ipaddress.IPv4Address] = Field(
        default_factory=list, description="nameservers, e.g. dns: [192.168.1.1, 1.1.1.1]"
    )
    search: list[DomainName] = Field(
        default_factory=list, description="DNS search domains, e.g. search: [lab]"
    )
    switch_ports: list[SwitchPort] = Field(
        default_factory=list,
        description='the switch ports the members plug into, e.g. switch_ports: [1, 2] or ["gi1/0/1", "gi1/0/2"]',
    )

    @model_validator(mode="after")
    def _routable(self) -> Bond:
        # A gateway outside the bond's own subnet gives a default route the kernel cannot
        # reach: the host would answer its LAN only, which over SSH looks like a lockout.
        if self.gateway is not None:
            if self.address is None:
                raise ValueError("gateway needs an address on the bond, e.g. address: 192.168.1.10/24")
            if self.gateway not in self.address.network:
                raise ValueError(
                    f"gateway {self.gateway} is outside the bond's subnet {self.address.network}; "
                    "give a gateway inside it or widen the prefix of address"
                )
        if len(set(self.interfaces)) != len(self.interfaces):
            raise ValueError(f"interfaces lists a NIC twice: {self.interfaces}")
        if self.name in self.interfaces:
            raise ValueError(f"the bond {self.name} cannot be one of its own interfaces")
        return self


class ModelCache(Strict):
    path: MountPath = Field(description="absolute path of the RAM cache, e.g. path: /mnt/model-cache")
    size_gb: float = Field(gt=0, description="tmpfs size in GiB, e.g. size_gb: 200")
    source: Optional[str] = Field(None, description="the storage host to fill it from, e.g. source: irina")

    @field_validator("size_gb")
    @classmethod
    def _mountable_size(cls, v: float) -> float:
        return cache_size_gb(v)


def cache_size_gb(v: float) -> float:
    """A tmpfs size labctl can mount: it is written in whole MiB (`cache_mib`), and one that
    rounds to 0 would mount without any limit (`size=0`)."""
    if cache_mib(v) < 1:
        raise ValueError(f"{v:g} GiB is less than 1 MiB; a RAM cache needs at least size_gb: 0.001")
    return v


def cache_mib(size_gb: float) -> int:
    """The size of a cache in MiB, rounded once: what the tmpfs is mounted with and reports."""
    return round(size_gb * 1024)


class Storage(Strict):
    models: HostPath = Field(description="folder holding the model library, e.g. models: /srv/models")
    tiers: list[Disk] = Field(default_factory=list, description="storage tiers, each a disk entry")
    checkpoints: Optional[HostPath] = Field(
        None,
        description="folder of the checkpoint library (labctl ckpt), default: beside models, "
        "e.g. checkpoints: /srv/checkpoints",
    )

    @property
    def checkpoint_library(self) -> str:
        """Where `labctl ckpt backup` keeps checkpoints: `checkpoints`, else a sibling of `models`."""
        import posixpath

        if self.checkpoints is not None:
            return str(self.checkpoints)
        return posixpath.join(posixpath.dirname(str(self.models).rstrip("/")) or "/", "checkpoints")


# The sandbox languages an inventory may declare. The inventory contract names them itself rather
# than asking the sandbox feature (a contract depends on no feature); labctl.agent.sandbox.languages
# has one recipe for each, and refuses to import if the two lists differ.
SANDBOX_LANGUAGES = (
    "python",
    "javascript",
    "typescript",
    "bash",
    "c",
    "cpp",
    "go",
    "rust",
    "java",
    "ruby",
    "perl",
    "php",
    "lua",
    "r",
    "fortran",
)


class Sandbox(Strict):
    languages: list[str] = Field(
        default_factory=lambda: ["python"], description="e.g. languages: [python, go]"
    )
    pool: int = Field(4, ge=1, le=256, description="warm containers kept ready, e.g. pool: 8")

    @field_validator("languages")
    @classmethod
    def _languages(cls, v: list[str]) -> list[str]:
        unknown = [lang for lang in v if lang not in SANDBOX_LANGUAGES]
        if unknown:
            raise ValueError(
                f"no sandbox language {', '.join(unknown)}; known: {', '.join(sorted(SANDBOX_LANGUAGES))}"
            )
        return v


Port = Annotated[int, Field(ge=1, le=65535, description="SSH port, 1-65535, e.g. port: 22")]


def python_command(v: str) -> str:
    """The interpreter labctl runs on a host, as `PYTHON_RE` allows it."""
    if not PYTHON_RE.fullmatch(v):
        raise ValueError(
            "not an interpreter labctl can run: write an absolute path (/usr/bin/python3) or a "
            "command on the host's PATH (python3), in ASCII, with no blank, quote or control character"
        )
    return v


def user_name(v: str) -> str:
    """A login name as SSH, cron and `sudo -u` take it (`USER_RE`)."""
    if not USER_RE.fullmatch(v):
        raise ValueError(
            "not a user name: ASCII letters, digits, '_', '.' or '-', starting with a letter "
            "or '_', at most 32 characters"
        )
    return v


PythonCommand = Annotated[str, AfterValidator(python_command)]
UserName = Annotated[str, AfterValidator(user_name)]


class ConnectionSettings(Strict):
    """Keys that may stand in `defaults` and in each host (the host's own win)."""

    user: Optional[UserName] = Field(None, description="SSH user, e.g. user: root")
    port: Optional[Port] = None
    connection: Optional[Literal["ssh", "local"]] = Field(
        None, description="connection: ssh (default) or local (this machine, no SSH)"
    )
    python: Optional[PythonCommand] = Field(
        None, description="interpreter on the host, e.g. python: /usr/bin/python3"
    )
    ssh_key: Optional[Path] = Field(None, description="private key file, e.g. ssh_key: keys/id_ed25519")
    known_hosts: Optional[Path] = Field(
        None, description="pinned host keys, e.g. known_hosts: keys/known_hosts"
    )
    os: Optional[Literal["linux", "windows"]] = Field(None, description="os: linux (default) or windows")
    connect_timeout: Optional[float] = Field(None, gt=0, description="seconds, e.g. connect_timeout: 10")
    command_timeout: Optional[float] = Field(None, gt=0, description="seconds, e.g. command_timeout: 600")


def persist_seconds(v: Any) -> float:
    """How long connections are kept after the last command: seconds as a number, or text
    with a unit (`90s`, `10m`, `1h`); 0 keeps none."""
    if isinstance(v, bool):
        raise ValueError(f"{str(v).lower()} is a yes/no value; write a duration, e.g. persist: 10m (0: off)")
    if isinstance(v, (int, float)):
        seconds = float(v)
    elif isinstance(v, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(s|m|h)?\s*", v)
        if m is None:
            raise ValueError(f"{v!r} is not a duration; write e.g. persist: 10m, 90s, 1h or 0 (off)")
        seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    else:
        raise ValueError(f"{v!r} is not a duration; write e.g. persist: 10m (0: off)")
    if seconds < 0 or seconds != seconds:
        raise ValueError("a duration cannot be negative; write e.g. persist: 10m (0: off)")
    if seconds > 24 * 3600:
        raise ValueError(f"{seconds:g} s is more than a day; keep connections at most persist: 24h")
    return seconds


PERSIST_DEFAULT = 600.0


class Connections(Strict):
    """How labctl's keeper holds SSH connections between commands (defaults.connections)."""

    persist: float = Field(
        default=PERSIST_DEFAULT,
        description="how long a connection is kept after the last command, e.g. persist: 10m (0: off)",
    )

    @field_validator("persist", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> float:
        return persist_seconds(v)


class Defaults(ConnectionSettings):
    connections: Optional[Connections] = Field(
        None, description="connection keeping, e.g. connections: {persist: 10m} (persist: 0 turns it off)"
    )


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
        # ipaddress takes any text as an IPv6 scope (fe80::1%SCOPE), blanks and newlines included.
        _, percent, scope = v.partition("%")
        if percent and not re.fullmatch(r"[A-Za-z0-9_.-]{1,15}", scope, re.ASCII):
            raise ValueError("the scope after '%' must be an interface name, e.g. fe80::1%eno1")
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
    lab: str = Field(
        description="a name for the lab, e.g. lab: homelab (what labctl starts is tagged with it: two labs "
        "sharing a machine need two names)"
    )
    path: Path
    hosts: dict[str, Host]
    connections: Connections = Field(default_factory=Connections)

    def host(self, name: str) -> Host:
        return self.hosts[name]

    def roles(self) -> list[str]:
        seen: dict[str, None] = {}
        for h in self.hosts.values():
            for r in h.roles:
                seen.setdefault(r, None)
        return list(seen)
