"""The orchestra file (playbooks/orchestra.yaml), validated like the phases file.

    hosts: role:inference          # who serves (the --limit syntax)
    warm: 5                        # models kept loaded
    rotate: 2                      # swapped each time
    every: 4h                      # the cadence (also what `labctl cron install rotate` uses)
    pinned: [Llama-3.1-8B-Instruct]
    models:
      - {name: Llama-3.1-8B-Instruct, size_gb: 16.1, api: chat, timeout_s: 90}
      - {name: Qwen2.5-Coder-7B-Instruct-Q8_0, size_gb: 8.1, params_b: 7.6, bits: 8}
    remote:                        # tiers outside the lab that speak the same API (chat by default)
      - {name: gpt-4o-mini, base_url: https://api.openai.com/v1, model: gpt-4o-mini,
         api_key_env: OPENAI_API_KEY, concurrency: 4, price_per_mtok: {input: 0.15, output: 0.6},
         share: 0.05, budget_per_month: 75}   # 5% of phase 3's tries, at most $75 a month

A model's GPU memory need is its explicit `gpu_gb`, else its weights (params_b * bits / 8 when
both are given, else size_gb) plus `overhead.fraction` of them for the KV cache and activations,
plus `overhead.context_gb` for the CUDA context (seed 000 §2.7). Every error names the file,
the line and the field, and exits 2. A remote tier names the environment variable that holds its
key, never the key: the file is shared and shown, the key is not. No check contacts a remote tier.
"""

from __future__ import annotations

import re
import shlex
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from labctl.documents.loader import open_document
from labctl.documents.suggest import did_you_mean
from labctl.documents.validation import DocumentError, Problem, dotted, fix_the_lines
from labctl.documents.yamlpos import PositionedYaml
from labctl.inventory.model import HostPath, Strict
from labctl.orchestra.sizes import kv_cache_gb, served_context

if TYPE_CHECKING:
    from labctl.inventory.model import Host, Inventory

DEFAULT_ORCHESTRA = Path("playbooks/orchestra.yaml")
TEMPLATE_FIELDS = ("path", "port", "gpu", "name", "file")
FORMATS = ("hf", "gguf", "tinylm")
DEFAULT_CONTEXT = 4096
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
    activations: float = Field(
        default=0.05,
        ge=0,
        le=10,
        description="activations: 0.05 (share of the weights for activations, where the KV cache is "
        "computed from the files)",
    )


def _engine_name(v: Optional[str]) -> Optional[str]:
    from labctl.orchestra.engines import ENGINES

    if v is not None and v not in ENGINES:
        hint = did_you_mean(v, list(ENGINES))
        raise ValueError(f"unknown engine {v!r};{hint} labctl knows {', '.join(ENGINES)}")
    return v


class Server(Strict):
    engine: Optional[str] = Field(
        default=None,
        description="engine: labctl (the default for models that name none: labctl, llama.cpp, vllm; "
        "command when server.command is set)",
    )
    command: Optional[str] = Field(
        default=None,
        description="command: 'my-server --model {path} --port {port}' (the `command` engine's template)",
    )
    binaries: dict[str, HostPath] = Field(
        default_factory=dict,
        description="binaries: {llama.cpp: /opt/labctl/llama.cpp/b1/bin/llama-server} (default: found on the host)",
    )
    health: str = Field(default="/health", description="health: /health (the path answering 200 once ready)")
    python: Optional[HostPath] = Field(
        default=None, description="python: /opt/venv/bin/python (default: the torch_env)"
    )
    start_timeout: int = Field(default=300, ge=1, description="start_timeout: 300 (seconds until healthy)")
    stop_grace: int = Field(
        default=30, ge=1, description="stop_grace: 30 (seconds between SIGTERM and SIGKILL)"
    )
    drain_s: float = Field(
        default=2.0,
        ge=0,
        le=600,
        description="drain_s: 2 (seconds between taking a leaving model out of the trainers' endpoints and stopping it)",
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
        sample = {
            "path": "/mnt/model-cache/model",
            "port": "8000",
            "gpu": "0",
            "name": "model",
            "file": "/mnt/model-cache/model/model.gguf",
        }
        try:
            v.format(**{k: shlex.quote(x) for k, x in sample.items()})
        except (KeyError, IndexError, ValueError, TypeError, AttributeError) as e:
            raise ValueError(
                f"the template cannot be filled ({e}); each placeholder is filled with quoted text, so "
                "write {port}, {path}, {file}, {gpu} or {name} without a format spec or conversion"
            ) from None
        return v

    @field_validator("engine")
    @classmethod
    def _engine(cls, v: Optional[str]) -> Optional[str]:
        return _engine_name(v)

    @field_validator("binaries")
    @classmethod
    def _binaries(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            _engine_name(name)
        return v

    @property
    def default_engine(self) -> str:
        return self.engine or ("command" if self.command else "labctl")

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
    size_gb: Optional[float] = Field(
        default=None,
        gt=0,
        description="size_gb: 16.1 (the weights on disk; default: read from the files on the storage host)",
    )
    format: Optional[str] = Field(
        default=None, description="format: hf (hf, gguf or tinylm; default: read from the files)"
    )
    engine: Optional[str] = Field(
        default=None,
        description="engine: llama.cpp (labctl, llama.cpp, vllm, command; default server.engine)",
    )
    context: Optional[int] = Field(
        default=None,
        ge=16,
        le=1 << 21,
        description="context: 8192 (tokens it serves; default the file's context)",
    )
    params_b: Optional[float] = Field(
        default=None, gt=0, description="params_b: 8.0 (billions of parameters)"
    )
    bits: Optional[float] = Field(
        default=None, gt=0, le=32, description="bits: 16 (or 8, 4: bits per weight)"
    )
    gpu_gb: Optional[float] = Field(default=None, gt=0, description="gpu_gb: 20 (GPU memory it needs; wins)")
    api: Literal["completions", "chat"] = Field(
        default="completions",
        description="api: completions (how the trainers ask it: completions continue the prompt; "
        "chat, for an instruct model, sends it as the user's message through its chat template)",
    )
    timeout_s: float = Field(
        default=60.0, gt=0, le=3600, description="timeout_s: 60 (seconds the trainers wait for one answer)"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not MODEL_NAME_RE.match(v):
            raise ValueError(
                f"{v!r} is not a model name labctl can use in file names; "
                "use letters, digits and . _ + - (e.g. Llama-3.1-8B-Instruct)"
            )
        return v

    @field_validator("format")
    @classmethod
    def _format(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and v not in FORMATS:
            raise ValueError(f"unknown format {v!r}; write one of {', '.join(FORMATS)}")
        return v

    @field_validator("engine")
    @classmethod
    def _engine(cls, v: Optional[str]) -> Optional[str]:
        return _engine_name(v)

    @field_validator("path")
    @classmethod
    def _relative(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        # The RAM cache holds what sits directly in the storage folder: the cache's own rule.
        from labctl.agent.cache.manifest import check_name
        from labctl.agent.core.errors import AgentError

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
        if self.format == "tinylm" and self.api == "chat":
            # labctl's server refuses every chat of a tinylm model: it has no chat template.
            raise ValueError("a tinylm model has no chat template; give it api: completions")
        return self

    @property
    def folder(self) -> str:
        """Where the model lives, relative to the storage host's library (and the RAM cache)."""
        return self.path or self.name

    @property
    def weights_gb(self) -> float | None:
        """GB of weights as the file says (params_b * bits / 8, else size_gb); None: not typed."""
        if self.params_b is not None and self.bits is not None:
            return self.params_b * self.bits / 8
        return self.size_gb


# The name of an environment variable, as a shell can export it.
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


class Price(Strict):
    input: float = Field(default=0.0, ge=0, description="input: 0.15 (per million prompt tokens)")
    output: float = Field(default=0.0, ge=0, description="output: 0.6 (per million completion tokens)")


class RemoteTier(Strict):
    """A model outside the lab behind the OpenAI-compatible API (a hosted API, a vLLM
    elsewhere), asked through /chat/completions unless `api: completions`. Asked beside the
    warm set; never started, stopped or rotated."""

    name: str = Field(description="name: gpt-4o-mini (its name in the orchestra and in metrics)")
    base_url: str = Field(
        description="base_url: https://api.openai.com/v1 (the API's root, before /completions)",
        json_schema_extra={"hide_input": True},
    )
    model: str = Field(description="model: gpt-4o-mini (the provider's model id)")
    api_key_env: Optional[str] = Field(
        default=None,
        description="api_key_env: OPENAI_API_KEY (the environment variable holding the key; null: no key)",
        json_schema_extra={"hide_input": True},
    )
    concurrency: int = Field(
        default=4, ge=1, le=256, description="concurrency: 4 (requests in flight at once)"
    )
    timeout_s: float = Field(default=60.0, gt=0, le=3600, description="timeout_s: 60 (seconds per request)")
    price_per_mtok: Price = Field(
        default_factory=lambda: Price(),
        description="price_per_mtok: {input: 0.15, output: 0.6} (per million tokens)",
    )
    api: Literal["completions", "chat"] = Field(
        default="chat",
        description="api: chat (or completions, where the provider serves them for this model)",
    )
    max_tokens: Optional[int] = Field(
        default=None,
        ge=1,
        description="max_tokens: 16384 (the most one answer may ask, as the provider says; default not checked)",
    )
    context: Optional[int] = Field(
        default=None,
        ge=16,
        description="context: 128000 (the model's context in tokens, as the provider says; default not checked)",
    )
    share: float = Field(
        default=1.0,
        description="share: 0.05 (the part of phase 3's tries it is asked for; default 1, every try)",
    )
    budget_per_month: Optional[float] = Field(
        default=None,
        description="budget_per_month: 75 (dollars each host that trains may spend on it in a calendar "
        "month, UTC; reached, it is not asked until the next month; default no limit)",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return ModelEntry._name(v)

    @field_validator("share")
    @classmethod
    def _share(cls, v: float) -> float:
        if not 0 < v <= 1:
            raise ValueError(
                "a share is the part of phase 3's tries this tier is asked for: above 0 and at most 1 "
                "(0.05: about one try in twenty; 1: every try); to ask it never, take it out of remote"
            )
        return v

    @field_validator("budget_per_month")
    @classmethod
    def _budget(cls, v: Optional[float]) -> Optional[float]:
        if v is not None and v <= 0:
            raise ValueError(
                "a budget is dollars a month above 0 (75); leave it out for no limit, or take the tier out "
                "of remote to ask it never"
            )
        return v

    @model_validator(mode="after")
    def _budget_needs_a_price(self) -> RemoteTier:
        if self.budget_per_month is not None and not (
            self.price_per_mtok.input or self.price_per_mtok.output
        ):
            # Spend is the usage each answer reports times the price: without one it stays 0.
            raise ValueError(
                "budget_per_month needs price_per_mtok: spend is counted as the tokens each answer "
                "reports times the price, so without a price it stays 0 and the budget never holds"
            )
        return self

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if not v.strip() or any(c.isspace() or ord(c) < 32 for c in v):
            raise ValueError("the provider's model id is empty or holds spaces; write it as the API lists it")
        return v

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, v: str) -> str:
        from urllib.parse import urlsplit

        try:
            url = urlsplit(v)
            url.port  # noqa: B018 - a port that is not a number raises here
        except ValueError:
            url = None
        if url is None or url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError("not an http(s) URL; write the API's root, e.g. https://api.openai.com/v1")
        if url.username or url.password:
            # The file is shown and shared: a password in it would be printed by every plan.
            raise ValueError(
                "the URL holds a user or password; put the key in the environment variable api_key_env names"
            )
        if url.query or url.fragment:
            raise ValueError("the URL has a ?query or #fragment; give the API's root, e.g. https://host/v1")
        return v.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _key_env(cls, v: Optional[str]) -> Optional[str]:
        # Never repeat the value in the message: a key pasted here must not reach a log.
        if v is not None and not ENV_NAME_RE.match(v):
            raise ValueError(
                "api_key_env is the name of the environment variable that holds the key (OPENAI_API_KEY), "
                "not the key itself; export the key in that variable where the trainer runs"
            )
        if v is not None and len(v) > 64:
            raise ValueError(
                "api_key_env is longer than a variable name: write the variable's name, not the key"
            )
        return v

    def key_present(self, environ: Mapping[str, str]) -> bool:
        return self.api_key_env is None or bool(environ.get(self.api_key_env))

    def as_dict(self, environ: Mapping[str, str]) -> dict[str, Any]:
        """What plan shows: never the key, only whether its variable is set in `environ`."""
        return {
            "name": self.name,
            "base_url": self.base_url,
            "model": self.model,
            "api_key_env": self.api_key_env,
            "key_set": self.key_present(environ),
            "concurrency": self.concurrency,
            "timeout_s": self.timeout_s,
            "price_per_mtok": {"input": self.price_per_mtok.input, "output": self.price_per_mtok.output},
            "api": self.api,
            "share": self.share,
            "budget_per_month": self.budget_per_month,
        }


class Orchestra(Strict):
    hosts: str = Field(default="role:inference", description="hosts: role:inference (the --limit syntax)")
    gpus: list[str] = Field(
        default_factory=list,
        description="gpus: [Tesla P40] (GPU models the orchestra may use; empty = all but training's)",
    )
    # warm and rotate are checked against each other and the library in cross_checks, where the
    # fix an error names can be one that passes (a field's own bound could only name a fixed example).
    warm: int = Field(default=5, description="warm: 5 (models kept loaded, at most the library's)")
    rotate: int = Field(
        default=2,
        description="rotate: 2 (models swapped each time, fewer than warm; 0: nothing rotates)",
    )
    every: str = Field(default="4h", description="every: 4h (the cadence: 4h, 90m, 6h)")
    pinned: list[str] = Field(default_factory=list, description="pinned: [Llama-3.1-8B-Instruct]")
    context: int = Field(
        default=DEFAULT_CONTEXT,
        ge=16,
        le=1 << 21,
        description="context: 4096 (tokens each model serves unless it names its own; capped at the model's)",
    )
    overhead: Overhead = Field(default_factory=lambda: Overhead())
    server: Server = Field(default_factory=lambda: Server())
    models: list[ModelEntry] = Field(
        min_length=1,
        description="models: [Llama-3.1-8B-Instruct, {name: Qwen2.5-Coder-7B, size_gb: 8.1}, ...]",
    )
    remote: list[RemoteTier] = Field(
        default_factory=list,
        description="remote: [{name: gpt-4o-mini, base_url: https://api.openai.com/v1, model: gpt-4o-mini, "
        "api_key_env: OPENAI_API_KEY}]",
    )

    @field_validator("models", mode="before")
    @classmethod
    def _bare_names(cls, v: Any) -> Any:
        # A model with nothing but a name is written as the name alone: `- Llama-3.1-8B`.
        if isinstance(v, list):
            return [{"name": m} if isinstance(m, str) else m for m in v]
        return v

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

    def engine_name(self, name: str) -> str:
        return self.model(name).engine or self.server.default_engine

    def need_gb(self, name: str, files: Mapping[str, Any] | None = None, scale: float = 1.0) -> float:
        """GB of GPU memory model `name` needs; `files`: what modelload.describe read of it; `scale`:
        GPU bytes per file byte of its weights (2 where its engine computes 16-bit in fp32)."""
        return gpu_need_gb(self.model(name), self.overhead, files, self.context, scale)

    def needs(
        self,
        names: list[str] | None = None,
        files: Mapping[str, Mapping[str, Any]] | None = None,
        scales: Mapping[str, float] | None = None,
    ) -> dict[str, float]:
        """{name: GPU memory need in GB} for `names` (default the whole library), in that order;
        `files`: {name: modelload.describe's answer} where the storage host had the model."""
        files, scales = files or {}, scales or {}
        return {
            n: self.need_gb(n, files.get(n), scales.get(n, 1.0))
            for n in (self.names if names is None else names)
        }


def gpu_need_gb(
    model: ModelEntry,
    overhead: Overhead,
    files: Mapping[str, Any] | None = None,
    default_context: int = DEFAULT_CONTEXT,
    scale: float = 1.0,
) -> float:
    """GB of GPU memory `model` needs: its gpu_gb; else, where the files were read, weights *
    (1 + activations) + the KV cache of its context + context_gb; else the typed weights *
    (1 + fraction) + context_gb. ValueError where neither files nor a typed size say."""
    if model.gpu_gb is not None:
        return model.gpu_gb
    if files and isinstance(files.get("weight_bytes"), int):
        weights = files["weight_bytes"] / 1e9 * scale
        kv = kv_cache_gb(files, served_context(model.context, default_context, files))
        if kv is not None:
            return weights * (1 + overhead.activations) + kv + overhead.context_gb
        return weights * (1 + overhead.fraction) + overhead.context_gb
    typed = model.weights_gb
    if typed is None:
        raise ValueError(
            f"{model.name}: no size_gb and its files were not read; give size_gb, or plan with the "
            "storage host reachable (without --offline)"
        )
    return typed * scale * (1 + overhead.fraction) + overhead.context_gb


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
    for i, r in enumerate(orch.remote):
        if r.name in first:
            problem(
                ("remote", i, "name"),
                f"'{r.name}' is already models[{first[r.name]}]; a remote tier needs a name of its own.",
            )
    remote_first: dict[str, int] = {}
    for i, r in enumerate(orch.remote):
        if r.name in remote_first:
            problem(("remote", i, "name"), f"'{r.name}' is already remote[{remote_first[r.name]}]; keep one.")
        remote_first.setdefault(r.name, i)
    seen: set[str] = set()
    for i, name in enumerate(orch.pinned):
        if name not in first:
            hint = did_you_mean(name, first)
            problem(("pinned", i), f"'{name}' is not in models.{hint} Pin a model of the library.")
        elif name in seen:
            problem(("pinned", i), f"'{name}' is pinned twice; keep one.")
        seen.add(name)
    warm, rotate, pinned = orch.warm, orch.rotate, len(seen)

    def fix(*fields: str) -> str:
        return count_fixes(warm, rotate, pinned, n, fields)

    if warm < 1:
        problem(("warm",), f"warm is {warm}: at least one model stays warm.{fix('warm')}")
    elif warm > n:
        problem(
            ("warm",),
            f"warm is {warm} but the library has {n} models; lower warm or add models.{fix('warm')}",
        )
    if rotate < 0:
        problem(("rotate",), f"rotate is {rotate}: it counts the models swapped each time.{fix('rotate')}")
    elif warm >= 1 and rotate >= warm:
        problem(
            ("rotate",),
            f"rotate ({rotate}) must be below warm ({warm}): some models stay warm while others swap."
            f"{fix('rotate', 'warm')}",
        )
    if warm >= 1 and pinned > warm:
        problem(
            ("pinned",),
            f"{pinned} models are pinned but only {warm} stay warm; pin at most warm.{fix('warm')}",
        )
    elif 0 <= rotate < warm and rotate > warm - pinned:
        problem(
            ("rotate",),
            f"rotate ({rotate}) is more than the {warm - pinned} warm models that are not pinned; "
            f"lower rotate, raise warm or pin fewer.{fix('rotate', 'warm')}",
        )
    return out


def counts_fit(warm: int, rotate: int, pinned: int, library: int) -> bool:
    """Whether warm, rotate and the number of pinned models fit a library of `library` models."""
    return 1 <= warm <= library and 0 <= rotate < warm and pinned <= warm and rotate <= warm - pinned


def count_fixes(warm: int, rotate: int, pinned: int, library: int, fields: Sequence[str]) -> str:
    """The fixes an error names (' Write `rotate: 1` or `warm: 3`.'): for each of `fields`, the value nearest the file's that
    makes every count fit on its own; where none does, warm and rotate together. Every fix named
    passes validation, so following one never leads to the next error."""
    fixes = []
    for f in fields:
        if f == "rotate":
            ok = [r for r in range(min(warm, library + 1)) if counts_fit(warm, r, pinned, library)]
            if ok:
                fixes.append(f"`rotate: {min(ok, key=lambda r: (abs(r - rotate), -r))}`")
        else:
            ok = [w for w in range(1, library + 1) if counts_fit(w, rotate, pinned, library)]
            if ok:
                fixes.append(f"`warm: {min(ok, key=lambda w: (abs(w - warm), -w))}`")
    if not fixes:
        ok = [w for w in range(1, library + 1) if counts_fit(w, 0, pinned, library)]
        if not ok:
            return ""
        fixes.append(f"`warm: {min(ok, key=lambda w: abs(w - warm))}, rotate: 0`")
    return " Write " + " or ".join(fixes) + "."


def require_rotation(orch: Orchestra, path: Path) -> None:
    """An InputError when the file rotates nothing (rotate: 0), so that scheduling its rotation
    says so at once instead of installing a job that does nothing at every cadence."""
    if orch.rotate != 0:
        return
    from labctl.documents.defaults import shown_path
    from labctl.output.errors import InputError

    n, pinned = len(orch.names), len(set(orch.pinned))
    options = [
        f"`warm: {w}, rotate: {r}`"
        for w in sorted(range(1, n + 1), key=lambda w: (w != orch.warm, w))
        for r in range(1, w)
        if counts_fit(w, r, pinned, n)
    ][:1]
    fix = (
        f"To rotate, write {options[0]} in it, then schedule again."
        if options
        else f"Its library of {n} cannot rotate (a swap needs a model outside the warm set): add models first."
    )
    raise InputError(
        f"{shown_path(path)} says rotate: 0, so there is nothing to rotate: a scheduled `labctl rotate` "
        f"would change nothing every {orch.every}.",
        f"{fix} With rotate: 0 the warm set stays as `labctl orchestra start` loaded it, and needs no schedule.",
    )


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
