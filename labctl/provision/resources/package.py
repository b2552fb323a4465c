"""`package`: distro packages through apt, where the host has it."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from labctl.provision.resource import Change, Params, PlanError, Probes, Resource, State, probe_error
from labctl.transport.shell import command_line

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+\Z")


class PackageParams(Params):
    names: list[str] = Field(min_length=1, description="Debian package names, e.g. names: [rsync, iperf3]")
    state: Literal["present", "absent"] = "present"
    update_cache: bool = Field(True, description="run apt-get update before installing")

    @field_validator("names")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        for n in v:
            if not NAME_RE.match(n):
                raise ValueError(f"'{n}' is not a Debian package name")
        return v


def installed_from_dpkg(text: str) -> set[str]:
    """Names dpkg-query reports as installed (`${Package} ${Status}` lines)."""
    out = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[-1] == "installed" and parts[-3] == "install":
            out.add(parts[0].split(":")[0])
    return out


class Package(Resource):
    type_name = "package"
    params_model = PackageParams
    description = "distro packages installed or removed (apt)"
    params: PackageParams

    def label(self) -> str:
        return f"package {','.join(self.params.names)}"

    def probes(self) -> Probes:
        names = command_line(self.params.names)
        return {
            "system": {"kind": "system"},
            "dpkg": {
                "kind": "command",
                "cmd": f"dpkg-query -W -f='${{Package}} ${{Status}}\\n' {names} 2>/dev/null; true",
            },
        }

    def plan(self, state: State) -> Change:
        if not state["system"].get("apt"):
            raise PlanError(
                f"{self.host.name} has no apt-get.",
                "Install these packages with the host's own package manager.",
            )
        if probe_error(state, "dpkg"):
            raise PlanError(f"dpkg-query failed: {probe_error(state, 'dpkg')}.")
        have = installed_from_dpkg(state["dpkg"].get("stdout", ""))
        change = Change()
        env = ["env", "DEBIAN_FRONTEND=noninteractive"]
        if self.params.state == "present":
            missing = [n for n in self.params.names if n not in have]
            if missing:
                ops = []
                if self.params.update_cache:
                    ops.append({"op": "run", "argv": [*env, "apt-get", "update", "-q"], "timeout": 600})
                ops.append(
                    {
                        "op": "run",
                        "argv": [*env, "apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
                        "timeout": 1800,
                    }
                )
                change.add(f"install {' '.join(missing)}", *ops)
        else:
            present = [n for n in self.params.names if n in have]
            if present:
                change.add(
                    f"remove {' '.join(present)}",
                    {"op": "run", "argv": [*env, "apt-get", "remove", "-y", "-q", *present]},
                )
        return change
