"""`torch_env`: a virtualenv with a pinned torch whose CUDA build runs on every GPU of the host.

Recent CUDA builds of torch dropped old GPUs (the seed lab mixes Pascal P40/P4/P1000, a
Volta V100 and an Ampere RTX 3050), so the build is chosen from the GPUs' compute
capabilities, declared in the inventory and found by nvidia-smi. A build that lacks a
GPU's architecture is refused with the reason and the build to use. The host builds the env
under a temporary name, away from its own pip configuration, and names it only once torch
imports there as the chosen version and CUDA build (labctl/agent/provision/torch_env.py).
"""

from __future__ import annotations

import json
import re
import shlex
from typing import TYPE_CHECKING, Any, Optional

from pydantic import Field

from labctl.agent.core import paths
from labctl.agent.provision.torch_env import wrong_build
from labctl.facts.gpus import Cap, build_archs, builds_for, parse_cap, supports, variants_for
from labctl.facts.gpus import declared_caps as inventory_caps
from labctl.inventory.model import Host, HostPath
from labctl.output.errors import HostError
from labctl.output.fmt import fmt_duration
from labctl.provision.resource import Change, Params, PlanError, Probes, Resource, State

if TYPE_CHECKING:
    from labctl.hosts.fanout import HostRun

PIP_TIMEOUT_S = 3600  # torch with its CUDA libraries is a few GB


def declared_caps(host: Host) -> list[tuple[str, Cap]]:
    """The inventory's GPUs on `host` with their capabilities; an unknown one is a PlanError."""
    out: list[tuple[str, Cap]] = []
    for model, cap in inventory_caps(host):
        if cap is None:
            raise PlanError(
                f"the inventory does not give the compute capability of {model} on {host.name}.",
                f'Add compute_capability to that GPU, e.g. {{model: {model}, compute_capability: "8.6"}}.',
            )
        out.append((model, cap))
    return out


def choose_build(version: str, variant: str, gpus: list[tuple[str, Cap]]) -> str:
    """The variant to install: `variant` checked against every GPU, or the newest that fits (auto)."""
    if variant == "cpu":
        if gpus:
            raise PlanError(
                f"cuda: cpu would leave the host's GPUs ({', '.join(sorted({n for n, _ in gpus}))}) unused.",
                "Use cuda: auto to pick a CUDA build that runs on all of them.",
            )
        return "cpu"
    if variant == "auto":
        if not gpus:
            return "cpu"
        fitting = builds_for(version, [cap for _, cap in gpus])
        if fitting:
            return fitting[0]
        caps = ", ".join(f"{n} ({c[0]}.{c[1]})" for n, c in sorted(set(gpus)))
        raise PlanError(
            f"no CUDA build of torch {version} runs on all of {caps}.",
            "Pin an older torch version (cu126 builds keep Pascal and Volta), or exclude the oldest GPU's host.",
        )
    spec = build_archs(version, variant)
    if spec is None:
        raise PlanError(
            f"torch {version} has no {variant} build.",
            f"Builds of {version}: {', '.join(variants_for(version)) or 'none known'}, or cpu.",
        )
    archs, ptx = spec
    missing = [(n, c) for n, c in gpus if not supports(archs, ptx, c)]
    if missing:
        fit = builds_for(version, [c for _, c in gpus])
        names = ", ".join(sorted({f"{n} (sm_{c[0]}{c[1]})" for n, c in missing}))
        built = " ".join(f"sm_{a}{b}" for a, b in archs)
        raise PlanError(
            f"torch {version}+{variant} has no kernels for {names}: that build targets {built}.",
            f"Use cuda: {fit[0]} (or cuda: auto)."
            if fit
            else "No CUDA build of this torch fits; pin an older torch.",
        )
    return variant


class TorchEnvParams(Params):
    version: str = Field(
        "2.13.0", pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$", description="torch version, e.g. version: 2.13.0"
    )
    cuda: str = Field(
        "auto", pattern=r"^(auto|cpu|cu[0-9]{3})$", description="auto, cpu, or a build such as cu126"
    )
    path: Optional[HostPath] = Field(
        None, description=f"virtualenv path (default {paths.ENVS_DIR}/torch-VERSION-BUILD)"
    )
    python: Optional[str] = Field(
        None, description="interpreter to build the venv with (default: the host's python)"
    )
    index_url: Optional[str] = Field(
        None,
        description='pip index; default download.pytorch.org/whl/BUILD; "" uses the host\'s pip configuration',
    )
    packages: list[str] = Field(
        default_factory=list, description="more pip requirements, e.g. packages: [safetensors]"
    )


class TorchEnv(Resource):
    type_name = "torch_env"
    params_model = TorchEnvParams
    description = "a virtualenv with a pinned torch built for every GPU on the host"
    params: TorchEnvParams

    def label(self) -> str:
        return f"torch_env {self.params.version} ({self.params.cuda})"

    def probes(self) -> Probes:
        return {
            "gpus": {
                "kind": "command",
                "cmd": "nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null; true",
            },
            "record": {"kind": "file", "path": paths.TORCH_ENV_RECORD},
        }

    def found_caps(self, state: State) -> list[tuple[str, Cap]]:
        out = []
        for line in (state.get("gpus") or {}).get("stdout", "").splitlines():
            name, _, cap = line.rpartition(",")
            if re.fullmatch(r"\s*[0-9]+\.[0-9]+\s*", cap, re.ASCII):
                out.append((name.strip(), parse_cap(cap)))
        return out

    def plan(self, state: State) -> Change:
        p = self.params
        found = self.found_caps(state)
        gpus = found or declared_caps(self.host)  # what the host reports wins over what is declared
        build = choose_build(p.version, p.cuda, gpus)
        path = p.path or f"{paths.ENVS_DIR}/torch-{p.version}-{build}"
        record = state.get("record") or {}
        current: dict[str, Any] = {}
        if record.get("exists") and record.get("text"):
            try:
                current = json.loads(record["text"])
            except ValueError:
                current = {}
        # A record of another build at this path (a CPU wheel in a cu126 env) is rebuilt.
        if current.get("python") == f"{path}/bin/python" and not wrong_build(current, p.version, build):
            return Change()
        python = p.python or self.host.python
        index = p.index_url if p.index_url is not None else f"https://download.pytorch.org/whl/{build}"
        # Isolated from the host's pip configuration unless index_url: "" asks for it: a
        # find-links folder or an extra index there must not supply another build's wheel.
        isolated = bool(index)
        pip = ["install", "--disable-pip-version-check", "--no-input", "--progress-bar", "off"]
        pip += ["--isolated"] if isolated else []
        pip += [f"torch=={p.version}", *p.packages]
        pip += ["--index-url", index] if index else []
        change = Change()
        change.add(
            f"create {path} with torch {p.version}+{build} ({len(gpus)} GPU{'s' if len(gpus) != 1 else ''})",
            {
                "op": "torch_env",
                "python": python,
                "path": path,
                "version": p.version,
                "build": build,
                "gpus": len(gpus),
                "pip": pip,
                "isolated": isolated,
                "index_url": index,
                "record": paths.TORCH_ENV_RECORD,
                "timeout": PIP_TIMEOUT_S,
            },
        )
        shown = [f"{path}/bin/python", "-m", "pip", *pip]
        prefix = "PIP_CONFIG_FILE=/dev/null " if isolated else ""
        change.diffs.append(f"+ {prefix}{shlex.join(shown)}\n")
        return change

    def apply(self, run: HostRun, change: Change) -> None:
        """The agent builds the env (labctl/agent/provision/torch_env.py); its progress is shown as it
        comes and kept in `events`, and a failure is reported by its cause."""
        from rich.markup import escape

        from labctl.hosts.agent_ship import AgentFailed, agent_event, call_agent

        failure: dict[str, Any] = {}
        ctx = run.ctx

        def on_line(stream: str, line: str) -> None:
            event = agent_event(stream, line, "progress", "failed")
            if event is None:
                return
            self.events.append({k: v for k, v in event.items() if k != "hint"})
            if event["event"] == "failed":
                failure.update(event)
            elif not ctx.json_mode:
                ctx.console.print(
                    f"[dim]{escape(progress_line(run.host.name, self.label(), event))}[/]", soft_wrap=True
                )

        try:
            call_agent(
                run, "provision.apply", {"ops": change.ops}, timeout=PIP_TIMEOUT_S + 900, on_line=on_line
            )
        except AgentFailed:
            if not failure:
                raise
            log = f" Full log: {run.host.name}:{failure['log']}." if failure.get("log") else ""
            raise HostError(f"{failure['error']}.{log}", str(failure.get("hint") or "")) from None


def progress_line(host: str, label: str, event: dict[str, Any]) -> str:
    """One line for a progress event: the step, how long the build has run, what the tool said."""
    detail = f": {event['detail']}" if event.get("detail") else ""
    return f"{host}: {label}: {event.get('what') or event.get('step')} [{fmt_duration(float(event.get('elapsed') or 0))}]{detail}"
