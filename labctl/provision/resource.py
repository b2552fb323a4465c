"""What a resource is, the change it plans, and the table of every resource type (RESOURCES).

A resource never opens a connection: it names the probes it needs (read by the agent in
one round trip for all resources on a host), plans a `Change` from what they found (pure,
unit-tested without a host), and the engine hands the change's ops to the agent.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import BeforeValidator

from labctl.inventory.model import Host, Strict
from labctl.output.errors import LabctlError

if TYPE_CHECKING:
    from labctl.hosts.fanout import HostRun

Probes = dict[str, dict[str, Any]]
State = dict[str, dict[str, Any]]


class Params(Strict):
    """A resource's parameters, as a playbook writes them (unknown keys are errors)."""


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
        # Progress a long apply reported as it ran (the agent's events), kept for --json.
        self.events: list[dict[str, Any]] = []

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

    def apply(self, run: HostRun, change: Change) -> None:
        """Carry `change` out: the agent runs its ops. A resource whose change may cut the
        connection (the network) applies through a transaction instead."""
        from labctl.hosts.agent_ship import call_agent

        call_agent(run, "provision.apply", {"ops": change.ops}, timeout=3600)


# type name -> "module:class" (the one registry shape, see labctl.agent.core.registry). A resource
# module is imported only when a playbook uses its type; a new resource is one module in
# resources/ and one line here.
RESOURCES: dict[str, str] = {
    "authorized_key": "labctl.provision.resources.controller:AuthorizedKey",
    "bond": "labctl.provision.resources.network:BondResource",
    "controller_install": "labctl.provision.resources.controller:ControllerInstall",
    "cron": "labctl.provision.resources.cron:Cron",
    "file": "labctl.provision.resources.files:File",
    "line": "labctl.provision.resources.files:Line",
    "llama_cpp": "labctl.provision.resources.llama_cpp:LlamaCpp",
    "model_cache": "labctl.provision.resources.model_cache:ModelCache",
    "package": "labctl.provision.resources.package:Package",
    "sandbox": "labctl.provision.resources.sandbox:Sandbox",
    "ssh_keypair": "labctl.provision.resources.controller:SshKeypair",
    "torch_env": "labctl.provision.resources.torch_env:TorchEnv",
}


def resource_types() -> list[str]:
    """Every resource type a playbook may name, sorted, without importing any of them."""
    return sorted(RESOURCES)


def resource_class(type_name: str) -> type[Resource]:
    """The class of `type_name` (one of `resource_types()`), importing its module now."""
    from labctl.agent.core.registry import load

    cls: type[Resource] = load(RESOURCES[type_name])
    return cls


def load_registry() -> dict[str, type[Resource]]:
    """Every resource type and its class (imports every resource module)."""
    return {name: resource_class(name) for name in RESOURCES}


def unified_diff(path: str, old: str | None, new: str | None) -> str:
    # Cut at "\n" only, as the file's readers do: splitlines() would show a line holding U+2028
    # or a form feed as two.
    lines = difflib.unified_diff(
        re.findall(r"[^\n]*\n|[^\n]+", old or ""),
        re.findall(r"[^\n]*\n|[^\n]+", new or ""),
        fromfile=f"{path} (now)" if old is not None else "/dev/null",
        tofile=f"{path} (planned)" if new is not None else "/dev/null",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def probe_error(state: State, key: str) -> str | None:
    entry = state.get(key) or {}
    err = entry.get("error")
    return str(err) if err else None


def parse_mode(value: Any) -> int:
    """A file mode as chmod writes it: "0644", "644", "0o644" or, unquoted in YAML, 644 (read
    as the octal it looks like, never as decimal 644 = 0o1204). Symbolic modes and numbers
    that are not 3-4 octal digits are refused, so no mode outside 0-07777 reaches a host."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f'{value!r} is not a file mode; write it quoted, e.g. mode: "0644"')
    text = str(value).strip()
    if isinstance(value, str) and text.lower().startswith("0o"):
        text = text[2:]
    if not re.fullmatch(r"[0-7]{3,4}", text):
        raise ValueError(
            f"{value!r} is not a file mode: write 3 or 4 octal digits as chmod takes them, "
            'quoted, e.g. mode: "0644" (rw-r--r--) or mode: "0600" (rw-------)'
        )
    return int(text, 8)


FileMode = Annotated[int, BeforeValidator(parse_mode)]
"""A mode field: the playbook's text or number, as the int the host's chmod gets."""
