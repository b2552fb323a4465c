"""The reference trainer's settings: defaults, checks and the learning-rate schedule.

Phase 3's loop (`rl`) is checked here too, with the shortest seq_len its tasks need
(`min_seq_len`: the longest task's view for the CET and the context after it).

Standard library only (torch is the trainer's business) and Python 3.8 syntax, like the rest of
the agent package: the controller-side tests and `load_settings` run where torch is absent.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any, Dict, List, Mapping, Optional

from ..models.tinylm import make_config

# What a run gets for each setting the controller leaves out (standalone use).
DEFAULTS: Dict[str, Any] = {
    "phase": 0,
    "run_id": "local",
    "steps": 100,
    "batch_size": 16,
    "accumulation_steps": 1,
    "seq_len": 64,
    "model": {"vocab": 256, "d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 256},
    "lr": 3e-3,
    "warmup_steps": 10,
    "weight_decay": 0.01,
    "grad_clip": 1.0,
    "mixed_precision": True,
    "gradient_scaling": {
        "enabled": True,
        "initial_scale": 65536.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 2000,
    },
    "ema": False,
    "ema_decay": 0.999,
    "dynamic_batch_sizing": False,
    "bucket_cap_mb": 25,
    "checkpoint_dir": "checkpoints",
    "checkpoint_every": 100,
    "keep_checkpoints": 3,
    "metrics_path": None,
    "log_every": 10,
    "seed": 0,
    # Seconds the run may take (null: no limit): it stops before them at a step every rank
    # agrees on, with a checkpoint there, and says "paused" (limit.py).
    "time_limit": None,
    # The checkpoint folder is one folder every node sees (a cluster's shared filesystem, a
    # Kubernetes claim): one process (rank 0) writes, prunes and scans it, where on the lab's
    # hosts every host's local rank 0 keeps its own copy. Two nodes writing one file would race.
    "shared_checkpoints": False,
    # Phase 3's loop (phase3.py): null trains the language model alone.
    "rl": None,
}
MIN_LR_RATIO = 0.1  # the cosine decays to 10% of lr
EXIT_PAUSED = 75  # EX_TEMPFAIL: the time limit ended the run; the same command resumes it


class TrainerError(Exception):
    """A failure with a message that says it all: reported as one line, no traceback."""


RL_DEFAULTS: Dict[str, Any] = {
    "tasks_per_step": 1,
    "context_tokens": 16,
    "answer_tokens": 64,
    "temperature": 1.0,  # the CET's sampling of its context (exploration), and its log-probabilities (> 0)
    "answer_temperature": 0.7,
    "weight": 1.0,  # the policy-gradient term beside the language-modelling loss
    "baseline_decay": 0.9,
    "timeout_s": 5.0,  # each program's limit per test in the sandbox
    "wait_s": 120.0,  # how long a step waits for a warm model while a rotation has none listed
    "sandbox_tries": 3,
    # Contexts sampled per task per step, all asked and judged: each one's advantage is its reward
    # minus its group's mean reward. 1: one context, judged against the task's moving average.
    "group_size": 1,
    # Steps in a row with nothing judged (no answer came back, or the sandbox ran none of them)
    # before the run stops with the reason; 0: never.
    "max_unjudged_steps": 5,
    # The tasks asked, by name, in this order (null: all of them): the tasks a coder model was
    # trained on (its labctl_coder.json), to see learning on them alone.
    "tasks": None,
}


def resolve_rl(raw: Any) -> Optional[Dict[str, Any]]:
    """The "rl" setting with defaults filled in and checked; None (no loop) when it is null."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise TrainerError(f"settings: rl must be an object or null, got {raw!r}")
    unknown = sorted(set(raw) - set(RL_DEFAULTS))
    if unknown:
        raise TrainerError(f"settings: rl has unknown keys {unknown}; known: {sorted(RL_DEFAULTS)}")
    rl = dict(RL_DEFAULTS)
    rl.update(raw)
    for key, least in (
        ("tasks_per_step", 1),
        ("context_tokens", 1),
        ("answer_tokens", 1),
        ("sandbox_tries", 1),
        ("group_size", 1),
        ("max_unjudged_steps", 0),
    ):
        v = rl[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            raise TrainerError(f"settings: rl.{key} must be an integer >= {least}, got {v!r}")
    for key in ("temperature", "answer_temperature", "weight", "baseline_decay", "timeout_s", "wait_s"):
        v = rl[key]
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise TrainerError(f"settings: rl.{key} must be a number >= 0, got {v!r}")
        rl[key] = float(v)
    if rl["baseline_decay"] >= 1 or rl["timeout_s"] <= 0:
        raise TrainerError("settings: rl.baseline_decay must be below 1 and rl.timeout_s above 0")
    rl["tasks"] = check_task_names(rl["tasks"])
    if not rl["temperature"] > 0:
        raise TrainerError(
            f"settings: rl.temperature must be above 0, got {rl['temperature']:g}: the CET samples its "
            "contexts at it and the policy gradient takes their log-probabilities there, which greedy "
            "decoding has none of; set it to 1.0 (the default), or a small value such as 0.1 for "
            "near-greedy contexts"
        )
    return rl


def check_task_names(raw: Any) -> Optional[List[str]]:
    if raw is None:
        return None
    from ..models.tasks import TASKS

    known = [t.name for t in TASKS]
    if not isinstance(raw, (list, tuple)) or not raw or not all(isinstance(n, str) for n in raw):
        raise TrainerError(f"settings: rl.tasks must be a list of task names or null (all), got {raw!r}")
    unknown = [n for n in raw if n not in known]
    if unknown:
        raise TrainerError(
            f"settings: rl.tasks names {unknown}, which are no phase-3 tasks; known: {', '.join(known)}"
        )
    if len(set(raw)) != len(raw):
        raise TrainerError(f"settings: rl.tasks names a task twice: {list(raw)}")
    return list(raw)


def min_seq_len(rl: Mapping[str, Any]) -> int:
    """The shortest seq_len that holds the longest task's CET prompt (prompting.cet_prompt) and the
    context after it: a shorter one would cut the start of some task's view."""
    from ..models.prompting import longest_cet_prompt

    return longest_cet_prompt() + int(rl["context_tokens"])


def _fail(key: str, want: str, value: Any) -> TrainerError:
    return TrainerError(f"settings: {key} must be {want}, got {value!r}")


def _int(s: Mapping[str, Any], key: str, minimum: int, label: Optional[str] = None) -> int:
    value = s[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise _fail(label or key, f"an integer >= {minimum}", value)
    return value


def _float(s: Mapping[str, Any], key: str, minimum: float, label: Optional[str] = None) -> float:
    value = s[key]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= minimum:
        raise _fail(label or key, f"a number >= {minimum}", value)
    return float(value)


def _bool(s: Mapping[str, Any], key: str) -> bool:
    value = s[key]
    if not isinstance(value, bool):
        raise _fail(key, "true or false", value)
    return value


def resolve_settings(raw: Mapping[str, Any]) -> Dict[str, Any]:
    """The settings with defaults filled in (nested objects key by key), checked and typed."""
    if not isinstance(raw, Mapping):
        raise TrainerError(f"settings must be a JSON object, got {type(raw).__name__}")
    s = copy.deepcopy(DEFAULTS)
    for key, value in raw.items():
        if key in ("model", "gradient_scaling") and isinstance(value, Mapping):
            merged = dict(s[key])
            merged.update(value)
            s[key] = merged
        else:
            s[key] = value
    for key in ("model", "gradient_scaling"):
        if not isinstance(s[key], dict):
            raise _fail(key, "an object", s[key])
    _int(s, "phase", 0)
    if not isinstance(s["run_id"], str):
        raise _fail("run_id", "a string", s["run_id"])
    for key in ("steps", "batch_size", "accumulation_steps", "seq_len", "log_every", "keep_checkpoints"):
        _int(s, key, 1)
    for key in ("warmup_steps", "checkpoint_every", "bucket_cap_mb", "seed"):
        _int(s, key, 0)
    s["lr"] = _float(s, "lr", 0.0)
    s["weight_decay"] = _float(s, "weight_decay", 0.0)
    if s["grad_clip"] is not None:
        s["grad_clip"] = _float(s, "grad_clip", 0.0)
    s["ema_decay"] = _float(s, "ema_decay", 0.0)
    if s["ema_decay"] >= 1.0:
        raise _fail("ema_decay", "below 1", s["ema_decay"])
    for key in ("mixed_precision", "ema", "dynamic_batch_sizing", "shared_checkpoints"):
        _bool(s, key)
    for key in ("checkpoint_dir", "metrics_path"):
        if s[key] is not None and not isinstance(s[key], str):
            raise _fail(key, "a path or null", s[key])
    if s["time_limit"] is not None:
        s["time_limit"] = _float(s, "time_limit", 0.0)
        if not 0 < s["time_limit"] < math.inf:
            raise _fail("time_limit", "a number of seconds above 0, or null", s["time_limit"])
        if not s["checkpoint_dir"]:
            raise TrainerError(
                "settings: time_limit needs a checkpoint_dir: a paused run resumes from the checkpoint it writes"
            )
    gs = s["gradient_scaling"]
    _bool(gs, "enabled")
    gs["initial_scale"] = _float(gs, "initial_scale", 1e-30, "gradient_scaling.initial_scale")
    gs["growth_factor"] = _float(gs, "growth_factor", 1.0, "gradient_scaling.growth_factor")
    gs["backoff_factor"] = _float(gs, "backoff_factor", 0.0, "gradient_scaling.backoff_factor")
    _int(gs, "growth_interval", 1, "gradient_scaling.growth_interval")
    s["rl"] = resolve_rl(s["rl"])
    if s["rl"] is not None and s["seq_len"] < min_seq_len(s["rl"]):
        need = min_seq_len(s["rl"])
        raise TrainerError(
            f"settings: seq_len ({s['seq_len']}) is too short for phase 3: the CET reads each task's "
            f"statement, {need - s['rl']['context_tokens']} bytes for the longest, then writes "
            f"rl.context_tokens ({s['rl']['context_tokens']}) after it; set seq_len to at least {need}"
        )
    m = s["model"]
    try:
        s["model_config"] = make_config(
            vocab=m.get("vocab"),
            d_model=m.get("d_model"),
            n_layers=m.get("n_layers"),
            n_heads=m.get("n_heads"),
            d_ff=m.get("d_ff"),
            max_seq=s["seq_len"],
            tie_embeddings=bool(m.get("tie_embeddings", False)),
            dtype="fp32",
        )
    except ValueError as exc:
        raise TrainerError(f"settings: model: {exc}") from None
    return s


def load_settings(arg: Optional[str]) -> Dict[str, Any]:
    """--settings' value: JSON text, or @PATH of a JSON file (left in place: every rank reads it)."""
    if arg is None:
        text = "{}"
    elif arg.startswith("@"):
        try:
            with open(arg[1:]) as f:
                text = f.read()
        except OSError as exc:
            raise TrainerError(f"cannot read settings file {arg[1:]}: {exc.strerror}") from None
    else:
        text = arg
    try:
        raw = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise TrainerError(f"--settings is not valid JSON: {exc}") from None
    return resolve_settings(raw)


def lr_factor(completed: int, warmup: int, total: int) -> float:
    """The lr multiplier for the step after `completed` steps: linear warmup, cosine to 10%."""
    if completed < warmup:
        return (completed + 1) / warmup
    progress = min(1.0, (completed - warmup) / max(1, total - warmup))
    return MIN_LR_RATIO + (1.0 - MIN_LR_RATIO) * 0.5 * (1.0 + math.cos(math.pi * progress))
