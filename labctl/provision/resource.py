"""What a resource is, the change it plans, and the registry later features add to.

A resource never opens a connection: it names the probes it needs (read by the agent in
one round trip for all resources on a host), plans a `Change` from what they found (pure,
unit-tested without a host), and the engine hands the change's ops to the agent.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from labctl.errors import LabctlError
from labctl.inventory.model import Host

Probes = dict[str, dict[str, Any]]
State = dict[str, dict[str, Any]]


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass
class Change:
    """What applying would do: agent ops, one line per action, and file diffs."""

    ops: list[dict[str, Any]] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    diffs: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.ops)

    def add(self, summary: str, *ops: dict[str, Any], diff: str = "") -> None:
        self.summary.append(summary)
        self.ops.extend(ops)
        if diff:
            self.diffs.append(diff)


class PlanError(LabctlError):
    """The resource refuses: applying would be unsafe or cannot work. Nothing is changed."""


class NotApplicable(Exception):
    """This resource has nothing to do on this host (reported as skipped, with the reason)."""


class Resource:
    type_name: ClassVar[str]
    params_model: ClassVar[type[Params]]
    linux_only: ClassVar[bool] = True
    description: ClassVar[str] = ""

    def __init__(self, host: Host, params: Params) -> None:
        self.host = host
        self.params = params

    @classmethod
    def from_playbook(cls, host: Host, raw: dict[str, Any]) -> Resource:
        """Build for `host` from the playbook's params, filling defaults from the inventory."""
        return cls(host, cls.params_model.model_validate(raw))

    def label(self) -> str:
        return self.type_name

    def probes(self) -> Probes:
        return {}

    def plan(self, state: State) -> Change:
        raise NotImplementedError


REGISTRY: dict[str, type[Resource]] = {}


def register(cls: type[Resource]) -> type[Resource]:
    REGISTRY[cls.type_name] = cls
    return cls


def load_registry() -> dict[str, type[Resource]]:
    import labctl.provision.resources  # noqa: F401  (each module registers its resources)

    return REGISTRY


def unified_diff(path: str, old: str | None, new: str | None) -> str:
    lines = difflib.unified_diff(
        (old or "").splitlines(keepends=True),
        (new or "").splitlines(keepends=True),
        fromfile=f"{path} (now)" if old is not None else "/dev/null",
        tofile=f"{path} (planned)" if new is not None else "/dev/null",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def probe_error(state: State, key: str) -> str | None:
    entry = state.get(key) or {}
    err = entry.get("error")
    return str(err) if err else None


def parse_mode(value: int | str | None) -> int | None:
    """Modes are written as in chmod: "0644" or "644" (octal); an int is taken as is."""
    if value is None or isinstance(value, int):
        return value
    return int(value, 8)
