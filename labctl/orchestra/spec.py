"""The orchestra file (playbooks/orchestra.yaml), validated like the phases file.

    hosts: role:inference          # who serves (the --limit syntax)
    warm: 5                        # models kept loaded
    rotate: 2                      # swapped each time
    every: 4h                      # the cadence (also what `labctl cron install rotate` uses)
    pinned: [Llama-3.1-8B-Instruct]
    models:
      - {name: Llama-3.1-8B-Instruct, size_gb: 16.1}
      - {name: Qwen2.5-Coder-7B-Instruct-Q8_0, size_gb: 8.1, params_b: 7.6, bits: 8}

A model's GPU memory need is its explicit `gpu_gb`, else its weights (params_b * bits / 8 when
both are given, else size_gb) plus `overhead.fraction` of them for the KV cache and activations,
plus `overhead.context_gb` for the CUDA context (seed 000 §2.7). Every error names the file,
the line and the field, and exits 2.
"""

from __future__ import annotations

import re
import shlex
import string
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from pydantic import Field, field_validator, model_validator

from labctl.documents.loader import open_document
from labctl.documents.suggest import did_you_mean
from labctl.documents.validation import DocumentError, Problem, dotted, fix_the_lines
from labctl.documents.yamlpos import PositionedYaml
from labctl.inventory.model import HostPath, Strict

if TYPE_CHECKING:
    from labctl.inventory.model import Host, Inventory

DEFAULT_ORCHESTRA = Path("playbooks/orchestra.yaml")
TEMPLATE_FIELDS = ("path", "port", "gpu", "name")
# Model names become file names (logs/NAME.log), environment values and --in/--out arguments.
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\Z")
_EVERY_RE = re.compile(r"(\d+)([dhm])", re.ASCII)
_UNIT_S = {"d": 86400, "h": 3600, "m": 60}


def parse_every(text: str) -> int:
    """A cadence ("4h", "90m", "1h30m", "1d") in seconds; ValueError saying what to write."""
    compact = str(text).strip().lower().replace(" ", "")
    parts = _EVERY_RE.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ValueError(f"{text!r} is not a cadence; write a number and a unit (d, h, m): 4h, 90m, 1h30m")
    seconds = sum(int(n) * _UNIT_S[u] for n, u in parts)
    if seconds < 60:
        raise ValueError(f"{text!r} is shorter than a minute, the finest cron can run")
    return seconds


def template_fields(command: str) -> list[str]:
    """The {placeholders} a server command template names; ValueError for a malformed one."""
    try:
        return [f for _, f, _, _ in string.Formatter().parse(command) if f is not None]
    except ValueError as e:
        raise ValueError(
            f"the template does not parse ({e}); write literal braces as {{{{ and }}}}"
        ) from None


class Overhead(Strict):
    fraction: float = Field(
        default=0.2,
        ge=0,
        le=10,
        description="fraction: 0.2 (KV cache + activations, as a share of the weights)",
    )
    context_gb: float = Field(
        default=0.5, ge=0, description="context_gb: 0.5 (the CUDA context of each model)"
    )


class Server(Strict):
    command: Optional[str] = Field(
        default=None,
        description="command: 'vllm serve {path} --port {port}' (null: labctl's own server)",
    )
    health: str = Field(default="/health", description="health: /health (the path answering 200 once ready)")
    python: Optional[HostPath] = Field(
        default=None, description="python: /opt/venv/bin/python (default: the torch_env)"
    )
    start_timeout: int = Field(default=300, ge=1, description="start_timeout: 300 (seconds until healthy)")
    stop_grace: int = Field(
        default=30, ge=1, description="stop_grace: 30 (seconds between SIGTERM and SIGKILL)"
    )

    @field_validator("command")
    @classmethod
    def _template(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        if not v.strip() or any(ord(c) < 32 for c in v):
            raise ValueError("the command is empty or spans lines; write it on one line")
        fields = template_fields(v)
        unknown = [f for f in fields if f not in TEMPLATE_FIELDS]
        if unknown:
            raise ValueError(
                f"unknown placeholder {{{unknown[0]}}}; a template may name {', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)}"
            )
        if "port" not in fields:
            raise ValueError("the template must name {port}: labctl picks the port and checks health on it")
        # The host fills the template with every value as quoted text (agent/orchestra/host.py
        # _format); filled here the same way, a format spec the host would refuse ({port:d},
        # {path!x}) fails now, before any server starts.
        sample = {"path": "/mnt/model-cache/model", "port": "8000", "gpu": "0", "name": "model"}
        try:
            v.format(**{k: shlex.quote(x) for k, x in sample.items()})
        except (KeyError, IndexError, ValueError, TypeError, AttributeError) as e:
            raise ValueError(
                f"the template cannot be filled ({e}); each placeholder is filled with quoted text, so "
                "write {port}, {path}, {gpu} or {name} without a format spec or conversion"
            ) from None
        return v

    @field_validator("health")
    @classmethod
    def _health_path(cls, v: str) -> str:
        if not v.startswith("/") or any(c.isspace() for c in v):
            raise ValueError(f"{v!r} is not a URL path; write one from /, e.g. /health")
        return v


class ModelEntry(Strict):
    name: str = Field(description="name: Llama-3.1-8B-Instruct")
    path: Optional[str] = Field(
        default=None,
        description="path: Meta-Llama-3.1-8B-Instruct (its folder in the storage host's library; default the name)",
    )
    size_gb: float = Field(gt=0, description="size_gb: 16.1 (the weights on disk)")
    params_b: Optional[float] = Field(
        default=None, gt=0, description="params_b: 8.0 (billions of parameters)"
    )
    bits: Optional[float] = Field(
        default=None, gt=0, le=32, description="bits: 16 (or 8, 4: bits per weight)"
    )
    gpu_gb: Optional[float] = Field(default=None, gt=0, description="gpu_gb: 20 (GPU memory it needs; wins)")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not MODEL_NAME_RE.match(v):
            raise ValueError(
                f"{v!r} is not a model name labctl can use in file names; "
                "use letters, digits and . _ + - (e.g. Llama-3.1-8B-Instruct)"
            )
        return v

    @field_validator("path")
    @classmethod
    def _relative(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        # The RAM cache holds what sits directly in the storage folder: the cache's own rule.
        from labctl.agent.cache.manifest import check_name
        from labctl.agent.errors import AgentError

        if not v.strip():
            raise ValueError("the path is empty")
        try:
            return check_name(v)
        except AgentError as e:
            raise ValueError(e.message) from None

    @model_validator(mode="after")
    def _params_with_bits(self) -> ModelEntry:
        if (self.params_b is None) != (self.bits is None):
            raise ValueError(
                "params_b and bits go together (weights = params_b * bits / 8 GB); give both or neither"
            )
        return self

    @property
    def folder(self) -> str:
        """Where the model lives, relative to the storage host's library (and the RAM cache)."""
        return self.path or self.name

    @property
    def weights_gb(self) -> float:
        if self.params_b is not None and self.bits is not None:
            return self.params_b * self.bits / 8
        return self.size_gb


class Orchestra(Strict):
    hosts: str = Field(default="role:inference", description="hosts: role:inference (the --limit syntax)")
    gpus: list[str] = Field(
        default_factory=list,
        description="gpus: [Tesla P40] (GPU models the orchestra may use; empty = all but training's)",
    )
    warm: int = Field(default=5, ge=1, description="warm: 5 (models kept loaded)")
    rotate: int = Field(default=2, ge=1, description="rotate: 2 (models swapped each time, fewer than warm)")
    every: str = Field(default="4h", description="every: 4h (the cadence: 4h, 90m, 6h)")
    pinned: list[str] = Field(default_factory=list, description="pinned: [Llama-3.1-8B-Instruct]")
    overhead: Overhead = Field(default_factory=lambda: Overhead())
    server: Server = Field(default_factory=lambda: Server())
    models: list[ModelEntry] = Field(
        min_length=1, description="models: [{name: Llama-3.1-8B-Instruct, size_gb: 16.1}, ...]"
    )

    @field_validator("every")
    @classmethod
    def _every(cls, v: Any) -> str:
        parse_every(str(v))
        return str(v)

    @property
    def every_s(self) -> int:
        return parse_every(self.every)

    @property
    def names(self) -> list[str]:
        """The library's names, in the file's order (the order models join in)."""
        return [m.name for m in self.models]

    def model(self, name: str) -> ModelEntry:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)

    def need_gb(self, name: str) -> float:
        return gpu_need_gb(self.model(name), self.overhead)

    def needs(self, names: list[str] | None = None) -> dict[str, float]:
        """{name: GPU memory need in GB} for `names` (default the whole library), in that order."""
        return {n: self.need_gb(n) for n in (self.names if names is None else names)}


def gpu_need_gb(model: ModelEntry, overhead: Overhead) -> float:
    """GB of GPU memory `model` needs: its gpu_gb, else weights * (1 + fraction) + context_gb."""
    if model.gpu_gb is not None:
        return model.gpu_gb
    return model.weights_gb * (1 + overhead.fraction) + overhead.context_gb


def default_path(inventory_path: Path | None = None) -> Path:
    """playbooks/orchestra.yaml beside the inventory, then its parent, then here (like train.yaml)."""
    from labctl.documents.defaults import find_default
    from labctl.hosts.context import resolve_inventory_path

    return find_default(DEFAULT_ORCHESTRA, resolve_inventory_path(inventory_path), "orchestra file", "-f")


def serving_hosts(orch: Orchestra, inventory: Inventory, path: Path | None = None) -> list[Host]:
    """The hosts `orch.hosts` names; a term that matches nothing is an InputError naming the
    file, and a lab with no host of its role (no inference host) one naming that."""
    from labctl.inventory.select import require_role_hosts

    return require_role_hosts(
        inventory,
        orch.hosts,
        "The orchestra serves",
        label=f"{path or 'the orchestra file'} hosts:",
        hint="Give the hosts that serve models `roles: [inference]` and a model_cache in the "
        "inventory, or name them in the orchestra file's `hosts:`.",
    )


def load_orchestra(path: Path) -> Orchestra:
    """The orchestra file at `path`, validated; every problem at once as a DocumentError (exit 2)."""
    doc = open_document(
        path,
        "orchestra file",
        f"Pass one with -f, or get the default {DEFAULT_ORCHESTRA} with `labctl init`.",
        orchestra_error,
    )
    doc.mapping("an orchestra file is a mapping with 'models', 'warm', 'rotate', ...")
    orch = doc.parse(Orchestra)
    doc.problems += cross_checks(orch, doc.pos)
    doc.finish()
    return orch


def cross_checks(orch: Orchestra, pos: PositionedYaml) -> list[Problem]:
    """What spans fields: unique names, pinned models in the library, rotate < warm <= library."""
    out: list[Problem] = []

    def problem(loc: tuple[str | int, ...], message: str) -> None:
        out.append((pos.line_of(loc), dotted(loc), message))

    first: dict[str, int] = {}
    for i, m in enumerate(orch.models):
        if m.name in first:
            problem(
                ("models", i, "name"),
                f"'{m.name}' is already models[{first[m.name]}]; give each model its own name.",
            )
        first.setdefault(m.name, i)
    n = len(first)
    if orch.warm > n:
        problem(("warm",), f"warm is {orch.warm} but the library has {n} models; lower warm or add models.")
    if orch.rotate >= orch.warm:
        problem(
            ("rotate",),
            f"rotate ({orch.rotate}) must be below warm ({orch.warm}): some models stay warm while others swap.",
        )
    seen: set[str] = set()
    for i, name in enumerate(orch.pinned):
        if name not in first:
            hint = did_you_mean(name, first)
            problem(("pinned", i), f"'{name}' is not in models.{hint} Pin a model of the library.")
        elif name in seen:
            problem(("pinned", i), f"'{name}' is pinned twice; keep one.")
        seen.add(name)
    if len(seen) > orch.warm:
        problem(
            ("pinned",), f"{len(seen)} models are pinned but only {orch.warm} stay warm; pin at most warm."
        )
    elif orch.rotate > orch.warm - len(seen):
        problem(
            ("rotate",),
            f"rotate ({orch.rotate}) is more than the {orch.warm - len(seen)} warm models that are not pinned; "
            "lower rotate, raise warm or pin fewer.",
        )
    return out


def orchestra_error(path: Path, problems: list[Problem]) -> DocumentError:
    from labctl.documents.defaults import shown_path

    return DocumentError(
        "orchestra file",
        path,
        problems,
        fix_the_lines(
            len(problems),
            f"`labctl orchestra plan -f {shlex.quote(shown_path(path))}` checks it without touching a host",
        ),
    )
