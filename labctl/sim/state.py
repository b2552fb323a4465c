"""What a sim created, recorded in DIR/state.json so `sim down` removes exactly that.

Each thing is recorded before it is created and the file is rewritten atomically (temp file +
rename) at every step, so after a failure or a kill part-way through `up` the state still names
everything that may exist.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from labctl.agent.core.fsutil import write_atomic
from labctl.output.errors import InputError

STATE_FILE = "state.json"
STATE_VERSION = 1


@dataclass
class HostState:
    name: str
    namespace: str
    address: str
    veths: list[str]
    rate: str | None = None  # the rate its links are shaped to; None until shaped
    sshd_pid: int | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HostState:
        return cls(
            name=d["name"],
            namespace=d["namespace"],
            address=d["address"],
            veths=list(d["veths"]),
            rate=d.get("rate"),
            sshd_pid=d.get("sshd_pid"),
        )


@dataclass
class SimState:
    dir: str
    bridge: str
    prefix: str
    subnet: str
    rate: str
    bridge_created: bool = False  # False: the bridge was there before and is not ours to delete
    iptables_rule: list[str] | None = None  # the FORWARD rule we inserted, if any
    hosts: dict[str, HostState] = field(default_factory=dict)
    # Mount points created on this machine. They are left in place by `down`: another sim may be
    # using them, and removing a directory that is a mount point elsewhere unmounts it there.
    mount_points_created: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # paths under dir that `up` wrote, relative to dir

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["version"] = STATE_VERSION
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SimState:
        return cls(
            dir=d["dir"],
            bridge=d["bridge"],
            prefix=d["prefix"],
            subnet=d["subnet"],
            rate=d["rate"],
            bridge_created=bool(d.get("bridge_created", False)),
            iptables_rule=d.get("iptables_rule"),
            hosts={k: HostState.from_json(v) for k, v in d.get("hosts", {}).items()},
            mount_points_created=list(d.get("mount_points_created", [])),
            files=list(d.get("files", [])),
        )


def state_path(sim_dir: Path) -> Path:
    return sim_dir / STATE_FILE


def load(sim_dir: Path) -> SimState | None:
    p = state_path(sim_dir)
    try:
        raw = p.read_text()
    except FileNotFoundError:
        return None
    try:
        return SimState.from_json(json.loads(raw))
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(
            f"The sim state {p} is unreadable ({e}).",
            "Remove what it created by hand (ip netns list; ip link) and delete the file.",
        ) from None


class Recorder:
    """The state of one run, saved after every change; safe to update from worker threads."""

    def __init__(self, sim_dir: Path, state: SimState) -> None:
        self.sim_dir = sim_dir
        self.state = state
        self.lock = threading.Lock()

    def save(self) -> None:
        with self.lock:
            path = state_path(self.sim_dir)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(str(path), (json.dumps(self.state.to_json(), indent=2) + "\n").encode())

    def update_host(self, host: HostState) -> None:
        with self.lock:
            self.state.hosts[host.name] = host
        self.save()

    def remove_host(self, name: str) -> None:
        with self.lock:
            self.state.hosts.pop(name, None)
        self.save()

    def add_file(self, rel: str) -> None:
        with self.lock:
            if rel not in self.state.files:
                self.state.files.append(rel)
        self.save()


@contextlib.contextmanager
def locked(sim_dir: Path) -> Iterator[None]:
    """Serialize sim commands on one DIR, so two `up`s cannot record over each other."""
    sim_dir.mkdir(parents=True, exist_ok=True)
    with open(sim_dir / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
