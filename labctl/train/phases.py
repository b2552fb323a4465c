"""Training phases: a YAML file of settings per phase, validated like the inventory.

    name: cet-training
    defaults: {hosts: role:train, gpus: [Tesla V100], steps: 2000, ...}
    phases:
      1: {name: cold_start, strategy: single_gpu_debug, batch_size_per_gpu: 2048, ...}

A phase's settings are the built-in defaults, then the file's `defaults`, then the phase,
then a named profile (`--profile cpu-demo`: PROFILES), then `--set key=value` (dotted keys
reach nested settings: `--set model.d_model=64`).
Every error names the file, the line and the field, and exits 2.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import yaml
from pydantic import AfterValidator, BaseModel, Field, ValidationError, field_validator, model_validator

from labctl.agent.core import paths
from labctl.agent.train.settings import RL_DEFAULTS
from labctl.documents.loader import open_document
from labctl.documents.suggest import did_you_mean
from labctl.documents.validation import (
    DocumentError,
    Problem,
    dotted,
    fix_the_lines,
    problems_from,
    unknown_key,
)
from labctl.inventory.model import HostPath, PythonCommand, Strict
from labctl.output.errors import InputError
from labctl.transport.shell import env_name_problem, env_value_problem

DEFAULT_PHASES = Path("playbooks/train.yaml")
STRATEGIES = ("single_gpu_debug", "multi_gpu_full", "multi_gpu_conservative")

# Named sets of --set values (`labctl train --profile NAME`), above the phase and below --set.
# The seed lab's phases are sized for GPUs; on CPUs one phase-3 step of them takes minutes.
PROFILES: dict[str, tuple[str, tuple[str, ...]]] = {
    "cpu-demo": (
        "phase 3 on CPUs, a step in seconds: a tiny CET, one task a step, answers of up to 64 "
        "tokens (`make demo`'s phase 3)",
        (
            "batch_size_per_gpu=8",
            "accumulation_steps=1",
            "seq_len=288",
            "model.d_model=64",
            "model.n_layers=2",
            "model.n_heads=4",
            "model.d_ff=256",
            "log_every=1",
            "rl.tasks_per_step=1",
            "rl.answer_tokens=64",
        ),
    ),
}


def profile_sets(name: str) -> list[str]:
    """The --set values of profile `name`; an unknown name is an InputError listing them."""
    if name not in PROFILES:
        raise InputError(
            f"--profile {name}: no such profile.{did_you_mean(name, PROFILES)}",
            f"Profiles: {', '.join(PROFILES)} (`labctl train settings` shows what each sets).",
        )
    return list(PROFILES[name][1])


class _Strict(Strict):
    pass


def _env_name(v: str) -> str:
    # The name lands unquoted in `env NAME=value torchrun ...` and `export NAME=value`.
    problem = env_name_problem(v)
    if problem:
        raise ValueError(problem)
    return v


def _env_value(v: str) -> str:
    problem = env_value_problem(v)
    if problem:
        raise ValueError(problem)
    return v


EnvName = Annotated[str, AfterValidator(_env_name)]
EnvValue = Annotated[str, AfterValidator(_env_value)]


class GradScaling(_Strict):
    enabled: bool = Field(default=True, description="enabled: true (scale the loss under mixed_precision)")
    initial_scale: float = Field(
        default=65536.0, gt=0, description="initial_scale: 65536.0 (the loss scale to start from)"
    )
    growth_factor: float = Field(
        default=2.0,
        gt=1,
        description="growth_factor: 2.0 (the scale grows by this after growth_interval good steps)",
    )
    backoff_factor: float = Field(
        default=0.5, gt=0, lt=1, description="backoff_factor: 0.5 (the scale shrinks by this on an overflow)"
    )
    growth_interval: int = Field(
        default=2000, ge=1, description="growth_interval: 2000 (steps without overflow before it grows)"
    )


class ModelShape(_Strict):
    vocab: int = Field(default=256, ge=2, description="vocab: 256 (the reference corpus is bytes)")
    d_model: int = Field(default=256, ge=8, description="d_model: 512 (the width of each layer)")
    n_layers: int = Field(default=4, ge=1, description="n_layers: 8 (transformer blocks)")
    n_heads: int = Field(default=4, ge=1, description="n_heads: 8 (attention heads; they divide d_model)")
    d_ff: int = Field(default=1024, ge=8, description="d_ff: 2048 (the feed-forward layer's width)")

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelShape:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})")
        return self


class Phase3Loop(_Strict):
    """Phase 3's loop in the reference trainer (labctl/agent/train/phase3.py), when the phase
    has requires_orchestra: the CET writes contexts, the warm models write code from them, the
    sandbox service runs it, and the pass rate is the reward. The defaults are the trainer's own
    (RL_DEFAULTS), so a phase that leaves a key out runs as the trainer alone would."""

    tasks_per_step: int = Field(
        default=RL_DEFAULTS["tasks_per_step"],
        ge=1,
        le=64,
        description="tasks_per_step: 2 (tasks each process tries per step)",
    )
    context_tokens: int = Field(
        default=RL_DEFAULTS["context_tokens"],
        ge=1,
        le=512,
        description="context_tokens: 16 (bytes of context the CET writes per task)",
    )
    answer_tokens: int = Field(
        default=RL_DEFAULTS["answer_tokens"],
        ge=1,
        le=4096,
        description="answer_tokens: 256 (the most tokens a model's program may take)",
    )
    temperature: float = Field(
        default=RL_DEFAULTS["temperature"],
        gt=0,
        description="temperature: 1.0 (the CET's sampling of its context, above 0: its log-probability is taken at it)",
    )
    group_size: int = Field(
        default=RL_DEFAULTS["group_size"],
        ge=1,
        le=64,
        description="group_size: 4 (contexts per task per step, each judged against its group's mean; 1: a moving baseline per task)",
    )
    max_unjudged_steps: int = Field(
        default=RL_DEFAULTS["max_unjudged_steps"],
        ge=0,
        description="max_unjudged_steps: 5 (steps in a row with nothing judged before the run stops; 0: never)",
    )
    answer_temperature: float = Field(
        default=RL_DEFAULTS["answer_temperature"],
        ge=0,
        description="answer_temperature: 0.7 (the models' sampling)",
    )
    weight: float = Field(
        default=RL_DEFAULTS["weight"],
        ge=0,
        description="weight: 1.0 (the policy-gradient term beside the LM loss)",
    )
    baseline_decay: float = Field(
        default=RL_DEFAULTS["baseline_decay"],
        ge=0,
        lt=1,
        description="baseline_decay: 0.9 (the reward baseline's moving average)",
    )
    timeout_s: float = Field(
        default=RL_DEFAULTS["timeout_s"],
        gt=0,
        le=60,
        description="timeout_s: 5 (each program's limit per test)",
    )
    wait_s: float = Field(
        default=RL_DEFAULTS["wait_s"],
        ge=0,
        description="wait_s: 120 (how long a step waits while a rotation lists no model)",
    )
    sandbox_tries: int = Field(
        default=RL_DEFAULTS["sandbox_tries"],
        ge=1,
        le=10,
        description="sandbox_tries: 3 (batches tried before the run fails)",
    )
    tasks: Optional[list[str]] = Field(
        default=None,
        min_length=1,
        description="tasks: [sum_two, product_two] (the tasks asked, in turn; default all 56: "
        "a coder model's trained tasks are in its labctl_coder.json)",
    )

    @field_validator("tasks")
    @classmethod
    def _known_tasks(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        if v is None:
            return v
        from labctl.agent.train.settings import TrainerError, check_task_names

        try:
            return check_task_names(v)
        except TrainerError as e:
            raise ValueError(str(e).removeprefix("settings: rl.tasks ")) from None


class K8sSettings(_Strict):
    """How a phase runs on Kubernetes (--backend k8s / trainjob); the flags of the same name win."""

    checkpoint_pvc: Optional[str] = Field(
        default=None, description="checkpoint_pvc: cet-ckpt (a ReadWriteMany claim, mounted at mount_path)"
    )
    mount_path: str = Field(
        default="/checkpoints", description="mount_path: /checkpoints (where the claim appears)"
    )
    cpu: Optional[str] = Field(default=None, description="cpu: '8' (CPU request per pod)")
    memory: Optional[str] = Field(default=None, description="memory: 32Gi (memory request per pod)")
    runtime: str = Field(
        default="torch-distributed",
        description="runtime: torch-distributed (--backend trainjob's ClusterTrainingRuntime)",
    )


class Settings(_Strict):
    """Everything one phase needs. Every key has a default, so a file names only what differs."""

    name: Optional[str] = Field(
        default=None, description="name: cold_start (the phase's name, shown in its runs)"
    )
    strategy: Literal["single_gpu_debug", "multi_gpu_full", "multi_gpu_conservative"] = Field(
        "multi_gpu_full",
        description="strategy: single_gpu_debug, multi_gpu_full or multi_gpu_conservative "
        "(one process per host, or one per training GPU; conservative places like full)",
    )
    hosts: str = Field("role:train", description="hosts: role:train (who trains, in the --limit syntax)")
    gpus: list[str] = Field(
        default_factory=list, description='gpus: ["Tesla V100"] (GPU models that train; empty = all)'
    )
    device: Literal["auto", "cuda", "cpu"] = Field(
        default="auto",
        description="device: auto, cuda or cpu (auto: CUDA where the chosen GPUs are; cpu trains on gloo)",
    )
    cpu_procs: int = Field(
        default=1, ge=1, description="cpu_procs: 1 (processes per host when training on CPU)"
    )
    port: int = Field(
        default=29500,
        ge=0,
        le=65535,
        description="port: 29500 (the rendezvous port on the first host; 0 picks a free one)",
    )
    max_restarts: int = Field(
        default=3, ge=0, description="max_restarts: 3 (torchrun restarts failed workers this often)"
    )
    rdzv_timeout: int = Field(
        default=900, ge=10, description="rdzv_timeout: 900 (seconds hosts wait for each other at rendezvous)"
    )
    stop_grace: int = Field(
        default=10, ge=1, description="stop_grace: 10 (seconds between SIGTERM and SIGKILL)"
    )
    python: Optional[PythonCommand] = Field(
        default=None,
        description="python: /opt/venv/bin/python (the hosts' interpreter with torch; default: the torch_env)",
    )
    script: Optional[str] = Field(
        default=None,
        description="script: train.py (your training script instead of the reference trainer; like --script)",
    )
    steps: int = Field(default=1000, ge=1, description="steps: 2000 (optimizer steps in the whole run)")
    batch_size_per_gpu: int = Field(
        default=32, ge=1, description="batch_size_per_gpu: 2048 (samples per process per micro-batch)"
    )
    accumulation_steps: int = Field(
        default=1, ge=1, description="accumulation_steps: 4 (micro-batches per optimizer step)"
    )
    seq_len: int = Field(default=128, ge=2, description="seq_len: 256 (tokens per sample)")
    model: ModelShape = Field(
        default_factory=lambda: ModelShape(),
        description="model: {d_model: 512, n_layers: 8} (the reference trainer's transformer)",
    )
    lr: float = Field(default=3e-4, gt=0, description="lr: 3.0e-4 (the peak learning rate)")
    warmup_steps: int = Field(
        default=100, ge=0, description="warmup_steps: 100 (steps of linear warm-up to lr)"
    )
    weight_decay: float = Field(default=0.1, ge=0, description="weight_decay: 0.1 (AdamW's weight decay)")
    grad_clip: Optional[float] = Field(
        default=1.0, gt=0, description="grad_clip: 1.0 (clip the gradient norm to this; null: no clipping)"
    )
    mixed_precision: bool = Field(
        default=False,
        description="mixed_precision: true (autocast on CUDA: bf16 where every GPU has it, else fp16)",
    )
    gradient_scaling: GradScaling = Field(
        default_factory=lambda: GradScaling(),
        description="gradient_scaling: {enabled: true} (the loss scaler under mixed_precision)",
    )
    ema: bool = Field(
        default=False, description="ema: true (keep an exponential moving average of the weights)"
    )
    ema_decay: float = Field(default=0.999, gt=0, lt=1, description="ema_decay: 0.999 (the average's decay)")
    dynamic_batch_sizing: bool = Field(
        default=False,
        description="dynamic_batch_sizing: true (on CUDA out-of-memory: halve the micro-batch, double accumulation)",
    )
    bucket_cap_mb: int = Field(
        default=25, ge=1, description="bucket_cap_mb: 25 (DDP's gradient bucket size in MB)"
    )
    checkpoint_dir: HostPath = Field(
        paths.TRAIN_DIR + "/phase{phase}",
        description="checkpoint_dir: /data/ckpt/phase{phase} (each host's checkpoint folder; {phase} is the number)",
    )
    checkpoint_every: int = Field(
        default=200, ge=1, description="checkpoint_every: 200 (steps between checkpoints)"
    )
    keep_checkpoints: int = Field(
        default=3, ge=1, description="keep_checkpoints: 3 (newest checkpoints kept on each host)"
    )
    log_every: int = Field(default=10, ge=1, description="log_every: 10 (steps between metric lines)")
    seed: int = Field(default=0, description="seed: 0 (the data order and the model's first weights)")
    requires_orchestra: bool = Field(
        False,
        description="requires_orchestra: true (the orchestra's warm set must be loaded first, as phase 3 needs)",
    )
    requires_sandbox: bool = Field(
        False,
        description="requires_sandbox: true (the sandbox service must run for the trainers, as phase 3's loop needs)",
    )
    rl: Phase3Loop = Field(
        default_factory=lambda: Phase3Loop(),
        description="rl: {tasks_per_step: 2} (phase 3's loop: taken by a phase with requires_orchestra)",
    )
    nccl_debug: EnvValue = Field(
        default="WARN", description="nccl_debug: WARN (NCCL_DEBUG on every host: INFO tells more)"
    )
    instance_type: Optional[str] = Field(
        None, description="instance_type: ml.p3.2xlarge (--backend sagemaker's machine)"
    )
    k8s: K8sSettings = Field(
        default_factory=lambda: K8sSettings(),
        description="k8s: {checkpoint_pvc: cet-ckpt} (--backend k8s and trainjob; their flags win)",
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, description="env: {NCCL_IB_DISABLE: '1'} (more environment for every process)"
    )

    @field_validator("env", mode="before")
    @classmethod
    def _env_as_text(cls, v: Any) -> Any:
        # Environment values are text; `NCCL_IB_DISABLE: 1` in YAML means "1".
        if isinstance(v, dict):
            return {
                k: (str(x).lower() if isinstance(x, bool) else str(x)) if isinstance(x, (int, float)) else x
                for k, x in v.items()
            }
        return v

    @model_validator(mode="after")
    def _cet_sees_its_task(self) -> Settings:
        # Checked here too, not only when the trainer starts: a refused run costs a launch.
        if self.requires_orchestra:
            from labctl.agent.train.settings import min_seq_len

            need = min_seq_len(self.rl.model_dump())
            if self.seq_len < need:
                raise ValueError(
                    f"seq_len {self.seq_len} is too short for phase 3: the CET reads the instruction, then the "
                    f"longest task, then its {self.rl.context_tokens}-byte context; set seq_len to {need} or more"
                )
        return self

    def trainer_settings(
        self, phase: int, run_id: str, metrics_path: str, time_limit_s: int | None = None
    ) -> dict[str, Any]:
        """What the reference trainer reads (labctl/agent/train/trainer.py); `time_limit_s` from --time-limit."""
        out: dict[str, Any] = {
            "phase": phase,
            "run_id": run_id,
            "steps": self.steps,
            "batch_size": self.batch_size_per_gpu,
            "accumulation_steps": self.accumulation_steps,
            "seq_len": self.seq_len,
            "model": self.model.model_dump(),
            "lr": self.lr,
            "warmup_steps": self.warmup_steps,
            "weight_decay": self.weight_decay,
            "grad_clip": self.grad_clip,
            "mixed_precision": self.mixed_precision,
            "gradient_scaling": self.gradient_scaling.model_dump(),
            "ema": self.ema,
            "ema_decay": self.ema_decay,
            "dynamic_batch_sizing": self.dynamic_batch_sizing,
            "bucket_cap_mb": self.bucket_cap_mb,
            "checkpoint_dir": self.checkpoint_path(phase),
            "checkpoint_every": self.checkpoint_every,
            "keep_checkpoints": self.keep_checkpoints,
            "metrics_path": metrics_path,
            "log_every": self.log_every,
            "seed": self.seed,
        }
        if self.requires_orchestra:
            out["rl"] = self.rl.model_dump()
        if time_limit_s is not None:
            out["time_limit"] = time_limit_s
        return out

    def checkpoint_path(self, phase: int) -> str:
        return self.checkpoint_dir.replace("{phase}", str(phase))


def describe_settings(model: type[BaseModel] = Settings, prefix: str = "") -> list[dict[str, Any]]:
    """Every setting a phase takes, nested ones dotted (model.d_model): its default, an example
    and what it means, from the fields' descriptions (`key: example (meaning)`)."""
    import json
    import re

    out: list[dict[str, Any]] = []
    for key, field in model.model_fields.items():
        desc = field.description or ""
        m = re.match(rf"{re.escape(key)}: (.+) \((.+)\)$", desc, re.S)
        default = field.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            default = ""  # its own settings follow, each with its default
        out.append(
            {
                "setting": prefix + key,
                "default": json.dumps(default) if not isinstance(default, str) else default,
                "example": m.group(1) if m else "",
                "meaning": m.group(2) if m else desc,
            }
        )
        inner = field.annotation
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            out += describe_settings(inner, f"{prefix}{key}.")
    return out


class PhasesFile(BaseModel):
    path: Path
    name: str
    defaults: dict[str, Any]
    phases: dict[int, dict[str, Any]]

    def settings(
        self, phase: int, overrides: list[str] | None = None, profile: str | None = None
    ) -> Settings:
        """Phase `phase`'s settings: the file's, then `profile`'s (PROFILES), then `overrides` (--set)."""
        layers = (profile_sets(profile) if profile else []) + list(overrides or [])
        if phase not in self.phases:
            raise InputError(
                f"No phase {phase} in {self.path}.",
                f"Phases there: {', '.join(str(p) for p in sorted(self.phases))}.",
            )
        merged = _merge(_merge({}, self.defaults), self.phases[phase])
        for text in layers:
            merged = _merge(merged, parse_override(text))
        try:
            return Settings.model_validate(merged)
        except ValidationError as e:
            problems = problems_from(e, Settings)
            lines = "\n  ".join(f"{fld}: {msg}" for _, fld, msg in problems)
            raise InputError(
                f"Phase {phase}'s settings (from {self.path}"
                + (f", --profile {profile}" if profile else "")
                + f" and --set) have problems:\n  {lines}",
                "Fix the --set values or the file.",
            ) from None


def _merge(base: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in layer.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "env":
            out[k] = _merge(out[k], v)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


def parse_override(text: str) -> dict[str, Any]:
    """`steps=40` or `model.d_model=64` → a nested mapping; the value is read as YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise InputError(
            f"--set {text!r} is not KEY=VALUE.", "Write e.g. --set steps=40 or --set model.d_model=64"
        )
    parts = key.split(".")
    allowed: Any = Settings
    for i, part in enumerate(parts):
        fields = getattr(allowed, "model_fields", None)
        if fields is None:
            break
        if part not in fields:
            hint = did_you_mean(part, fields, prefix="".join(f"{p}." for p in parts[:i]))
            raise InputError(
                f"--set {key}: unknown setting '{part}'.{hint}",
                f"Settings: {', '.join(fields)}.",
            )
        annotation = fields[part].annotation
        allowed = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    out: dict[str, Any] = {parts[-1]: value}
    for part in reversed(parts[:-1]):
        out = {part: out}
    return out


def load_phases(path: Path | None = None, inventory_path: Path | None = None) -> PhasesFile:
    """The phases file `path`; by default playbooks/train.yaml beside the inventory, else here."""
    if path is None:
        from labctl.documents.defaults import find_default
        from labctl.hosts.context import resolve_inventory_path

        path = find_default(DEFAULT_PHASES, resolve_inventory_path(inventory_path), "phases file", "-f")
    doc = open_document(
        Path(path), "phases file", f"Pass one with -f, or use the default {DEFAULT_PHASES}.", phases_error
    )
    data = doc.mapping("a phases file is a mapping with 'name', 'defaults' and 'phases'")
    for key in data:
        if key not in ("name", "defaults", "phases"):
            doc.problems.append(
                (doc.line_of((key,)), str(key), unknown_key(key, ["name", "defaults", "phases"]))
            )
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        doc.problems.append((doc.line_of(("defaults",)), "defaults", "defaults is a mapping of settings"))
        defaults = {}
    else:
        doc.check(Settings, defaults, ("defaults",))
    raw_phases = data.get("phases")
    phases: dict[int, dict[str, Any]] = {}
    if not isinstance(raw_phases, dict) or not raw_phases:
        doc.problems.append(
            (doc.line_of(("phases",)), "phases", "at least one phase is required: phases: {1: {steps: 100}}")
        )
        raw_phases = {}
    for key, layer in raw_phases.items():
        loc = ("phases", key)
        if not isinstance(key, int) or isinstance(key, bool) or key < 1:
            doc.problems.append((doc.line_of(loc), dotted(loc), "phases are numbered 1, 2, 3 ..."))
            continue
        if not isinstance(layer, dict):
            doc.problems.append(
                (doc.line_of(loc), dotted(loc), "a phase is a mapping of settings, e.g. {steps: 100}")
            )
            continue
        if doc.check(Settings, layer, loc) is not None:
            # Each layer alone is valid; the merged phase must be too (e.g. n_heads dividing d_model).
            phases[key] = layer
    # The check command the error names runs a phase the file declares.
    numbered = [k for k in raw_phases if isinstance(k, int) and not isinstance(k, bool) and k >= 1]
    doc.error = lambda at, found: phases_error(at, found, min(numbered, default=1))
    doc.finish()
    return PhasesFile(
        path=doc.path, name=str(data.get("name") or doc.path.stem), defaults=defaults, phases=phases
    )


def phases_error(path: Path, problems: list[Problem], phase: int = 1) -> DocumentError:
    """`phase`: one the file declares, for a check command that runs as written."""
    from labctl.documents.defaults import shown_path

    again = f"labctl train --phase {phase} -f {shlex.quote(shown_path(path))} --check"
    return DocumentError(
        "phases file", path, problems, fix_the_lines(len(problems), f"`{again}` validates without launching")
    )
