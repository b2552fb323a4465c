"""The reference trainer on the card: fp32 against AMP, a time-boxed pause and its resume, two ranks.

Every training run goes through the real CLI (`labctl train --phase 1 --limit here --device
cuda --json`) against the one-host local lab: the preflight, torchrun, the trainer shipped in
the agent, the controller's copy of rank 0's events (`.labctl/runs/RUN/metrics.jsonl` beside
the inventory), which is where tokens/s is read (the step events' `tokens_per_s`, the first
logged interval left out: it carries CUDA's start-up). The phase's `gpus: [Tesla V100]` is
replaced by `gpus=[]` (every GPU), the rendezvous port by a free one.

What a one-GPU lab cannot do through the CLI is two ranks on the one GPU (labctl places one
process per GPU), so that attempt runs torchrun itself with the same trainer, both workers
told LOCAL_RANK 0: NCCL usually refuses ("Duplicate GPU detected"), which is recorded as a
skip with NCCL's line. With one process (world size 1) the trainer makes no process group at
all, so the single-GPU runs never reach NCCL; the two-rank attempt carries a `time_limit`, so
where NCCL does accept it the stop decision's broadcast on the gloo group beside NCCL runs too.

If the preflight refuses the local host, the refusal is recorded and the same trainer runs
under plain torchrun instead (same settings), so the figures still come.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import REPO, CheckEnv, CheckFailed, Nvml, Section, fmt, tail

TITLE = "Reference trainer: fp32 vs AMP tokens/s, time-limit pause and resume, two ranks on one GPU"
PLAN = [
    "`labctl train --phase 1 --limit here --device cuda --dry-run`: the preflight accepts the card (gpus=[]);"
    " the launch line and its backend (nccl) are recorded",
    "phase 1 with mixed_precision=false (fp32) and then =true (the trainer's AMP: bf16 autocast on"
    " compute capability >= 8.0, fp16 + GradScaler below), same model (d_model 1024, 8 layers, seq 512,"
    " batch 16, 100 steps): steady tokens/s of each and the AMP/fp32 ratio",
    "GPU utilisation %, memory used and power W sampled through NVML every 0.5 s during both runs (max, mean)",
    "`--time-limit` sized so the run pauses mid-way: exit 75, the `paused` event's step, its checkpoint on"
    " disk; the same checkpoint_dir again resumes from that step (not 0) and finishes",
    "two trainer ranks on the one GPU under torchrun (nccl, both on cuda:0): trained, or NCCL's refusal"
    " recorded as a skip",
]

KEY = "trainer"
BUSY_PCT = 5  # a sample at or above this utilisation counts as the GPU training
SAMPLE_EVERY_S = 0.5


@dataclass(frozen=True)
class Shape:
    """A tinylm run's size, in the trainer's own setting names."""

    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    seq_len: int
    batch: int
    steps: int
    log_every: int

    def settings(self) -> dict[str, Any]:
        return {
            "model": {
                "vocab": 256,
                "d_model": self.d_model,
                "n_layers": self.n_layers,
                "n_heads": self.n_heads,
                "d_ff": self.d_ff,
            },
            "seq_len": self.seq_len,
            "batch_size": self.batch,
            "accumulation_steps": 1,
            "steps": self.steps,
            "log_every": self.log_every,
            "warmup_steps": 10,
            "lr": 3e-4,
            "keep_checkpoints": 1,
            "checkpoint_every": 1_000_000,  # the last step's checkpoint only (or the pause's)
        }

    def tokens_per_step(self, world_size: int = 1) -> int:
        return self.batch * self.seq_len * world_size

    def state_bytes(self) -> int:
        """What a checkpoint holds: fp32 weights and AdamW's two moments (the trainer's own estimate)."""
        from labctl.agent.models.tinylm import make_config, param_count

        cfg = make_config(256, self.d_model, self.n_layers, self.n_heads, self.d_ff, self.seq_len)
        return param_count(cfg) * 4 * 3


# On the card: big enough that fp32 keeps it busy and bf16 matters (~100 M parameters, 8192
# tokens a step); the time-boxed run smaller, so its checkpoint (and the trainer's estimate of
# it before the first one) stays short; the two-rank attempt small.
GPU_SHAPES = {
    "throughput": Shape(1024, 8, 16, 4096, 512, 16, steps=100, log_every=10),
    "limited": Shape(512, 4, 8, 2048, 256, 16, steps=1_000_000, log_every=50),
    "two_ranks": Shape(256, 4, 4, 1024, 256, 8, steps=40, log_every=5),
}
# The CPU smoke run: the same code paths in seconds on two cores. Its figures count for nothing,
# so each run is as short as its code path allows: 4 logged intervals (the first is left out of
# the steady median), a resume of 2 logged intervals, two ranks that only have to meet.
SMOKE_SHAPES = {
    "throughput": Shape(64, 2, 4, 256, 64, 8, steps=20, log_every=5),
    "limited": Shape(64, 2, 4, 256, 64, 8, steps=1_000_000, log_every=10),
    "two_ranks": Shape(64, 2, 4, 256, 64, 8, steps=10, log_every=5),
}
TRAIN_WINDOW_S = {True: 10.0, False: 4.0}  # seconds of training before the pause, GPU / smoke
# Seconds each run may take before it is stopped (GPU, smoke): a hang must not eat the whole check.
TIMEOUT_S = {
    "preflight": (150.0, 120.0),  # the first import of torch on a fresh machine is slow
    "throughput": (180.0, 180.0),
    "resume": (120.0, 180.0),
    "two_ranks": (60.0, 150.0),  # NCCL refuses in seconds; a hang must not take the budget
}


# -- pure logic (tests/unit/test_gpu_check_trainer.py) -------------------------------------------


def last_start(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events of the newest start (a restarted worker group starts again)."""
    starts = [i for i, e in enumerate(events) if e.get("event") == "start"]
    return events[starts[-1] :] if starts else list(events)


def steady_tokens_per_s(events: list[dict[str, Any]]) -> float | None:
    """Median tokens/s of the step events after the first (which carries CUDA's start-up and warm-up)."""
    rates = [
        float(e["tokens_per_s"])
        for e in last_start(events)
        if e.get("event") == "step" and isinstance(e.get("tokens_per_s"), (int, float))
    ]
    if not rates:
        return None
    return statistics.median(rates[1:] if len(rates) > 1 else rates)


def summarise_gpu(samples: list[dict[str, Any]], busy_pct: float = BUSY_PCT) -> dict[str, Any]:
    """Max and mean of NVML samples: over all of them and over the busy window (first to last
    sample at or above `busy_pct`, so torchrun's start-up and the teardown do not dilute the mean)."""
    if not samples:
        return {"samples": 0}

    def nums(rows: list[dict[str, Any]], key: str) -> list[float]:
        return [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]

    def mean(xs: list[float]) -> float | None:
        return round(statistics.fmean(xs), 1) if xs else None

    def top(xs: list[float]) -> float | None:
        return round(max(xs), 1) if xs else None

    busy = [i for i, s in enumerate(samples) if (s.get("util_pct") or 0) >= busy_pct]
    window = samples[busy[0] : busy[-1] + 1] if busy else []
    return {
        "samples": len(samples),
        "seconds": round(float(samples[-1].get("t", 0.0)) - float(samples[0].get("t", 0.0)), 1),
        "busy_samples": len(window),
        "util_max_pct": top(nums(samples, "util_pct")),
        "util_mean_pct": mean(nums(samples, "util_pct")),
        "util_mean_busy_pct": mean(nums(window, "util_pct")),
        "mem_max_mib": top(nums(samples, "mem_mib")),
        "mem_mean_busy_mib": mean(nums(window, "mem_mib")),
        "power_max_w": top(nums(samples, "power_w")),
        "power_mean_busy_w": mean(nums(window, "power_w")),
    }


def refusal_line(output: str) -> str:
    """The line that says why a distributed run failed: NCCL's duplicate-GPU message where there
    is one, else the trainer's own error line, else the last line that says error."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for needle in ("duplicate gpu", "duplicated gpu", "labctl trainer", "error"):
        found = [ln for ln in lines if needle in ln.lower() and (needle != "labctl trainer" or "error" in ln)]
        if found:
            # NCCL repeats its line per rank and the traceback repeats it again: the first says it.
            return found[0][:400]
    return lines[-1][:400] if lines else "no output"


def preflight_problems(said: str) -> str:
    """The problems a refused preflight lists (its indented lines), else its first line."""
    lines = [ln.strip() for ln in said.splitlines() if ln.strip()]
    problems = [ln.strip() for ln in said.splitlines() if ln.startswith("  ") and ln.strip()]
    return " | ".join(problems) if problems else (lines[0] if lines else "no output")


def time_limit_s(startup_s: float, window_s: float, state_bytes: int) -> int:
    """A --time-limit that leaves `window_s` of training after `startup_s` (torchrun's start to the
    first step) and before the room the trainer keeps for its checkpoint and exit, so the run
    pauses mid-way rather than at its first step or never."""
    from labctl.agent.train.limit import CHECKPOINT_SAFETY, checkpoint_estimate, exit_margin

    limit = startup_s + window_s + checkpoint_estimate([], state_bytes) * CHECKPOINT_SAFETY
    return math.ceil(limit + exit_margin(limit))


def yaml_value(value: Any) -> str:
    """A value as `--set` reads it (YAML): floats always with a point (PyYAML reads `1e-05` as text)."""
    if isinstance(value, float):
        mantissa, e, exponent = repr(value).partition("e")
        return f"{mantissa}{'' if '.' in mantissa else '.0'}{e}{exponent}" if e else mantissa
    if isinstance(value, (bool, list, dict)) or value is None:
        return json.dumps(value)
    return str(value)


def cli_sets(settings: dict[str, Any]) -> list[str]:
    """The trainer's settings as `labctl train --set` arguments (the phases file's names)."""
    names = {"batch_size": "batch_size_per_gpu"}
    out: list[str] = []
    for key, value in settings.items():
        if key == "model":
            out += [f"model.{k}={yaml_value(v)}" for k, v in value.items()]
        else:
            out.append(f"{names.get(key, key)}={yaml_value(value)}")
    return [x for s in out for x in ("--set", s)]


# -- GPU sampling -----------------------------------------------------------------------------------


class Sampler:
    """Calls `query` every `every` seconds on a thread until stop(); each answer is one sample."""

    def __init__(self, query: Callable[[], dict[str, Any]], every: float = SAMPLE_EVERY_S) -> None:
        self.query = query
        self.every = every
        self.samples: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)
        self._t0 = time.monotonic()

    def _loop(self) -> None:
        while True:
            try:
                self.samples.append({"t": round(time.monotonic() - self._t0, 2), **self.query()})
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                if len(self.errors) >= 5:
                    return
            if self._stop.wait(self.every):
                return

    def start(self) -> Sampler:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.samples


# -- running things --------------------------------------------------------------------------------


def run_group(
    env: CheckEnv, cmd: list[str], timeout: float, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `cmd` from the checkout in its own process group; past `timeout` the whole group is
    stopped (SIGINT, SIGTERM, SIGKILL), so no torchrun worker is left holding the GPU.
    Never raises for a non-zero exit; a timeout raises CheckFailed."""
    env.log("$ " + " ".join(shlex.quote(c) for c in cmd)[:600])
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env.environ(extra_env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = "", ""
        for sig, wait in ((signal.SIGINT, 15.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, err = proc.communicate(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        env._keep(cmd, out or "", err or "")
        raise CheckFailed(f"{' '.join(cmd[:8])} ran past {timeout:.0f} s\n{tail(err or out or '')}") from None
    env._keep(cmd, out, err)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def read_events(path: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    try:
        text = path.read_text()
    except OSError:
        return events
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "event" in doc:
            events.append(doc)
    return events


@dataclass
class TrainRun:
    """One training run, however it was launched: exit code, wall time, rank 0's events."""

    name: str
    rc: int
    wall_s: float
    events: list[dict[str, Any]]
    output: str = ""
    doc: dict[str, Any] | None = None  # `labctl train --json`'s document (CLI runs)
    via: str = "cli"

    def _last(self, kind: str) -> dict[str, Any] | None:
        found = [e for e in last_start(self.events) if e.get("event") == kind]
        return found[-1] if found else None

    @property
    def start(self) -> dict[str, Any] | None:
        return self._last("start")

    @property
    def done(self) -> dict[str, Any] | None:
        return self._last("done")

    @property
    def paused(self) -> dict[str, Any] | None:
        return self._last("paused")

    @property
    def steps(self) -> list[dict[str, Any]]:
        return [e for e in last_start(self.events) if e.get("event") == "step"]

    @property
    def tokens_per_s(self) -> float | None:
        return steady_tokens_per_s(self.events)

    def startup_s(self) -> float | None:
        """Seconds from the launch to the first logged step (CLI), else the wall time the
        trainer's own clock does not cover (launch, start-up, teardown)."""
        if self.doc and isinstance(self.doc.get("first_step_seconds"), (int, float)):
            return float(self.doc["first_step_seconds"])
        if self.done and isinstance(self.done.get("seconds"), (int, float)):
            return max(0.0, self.wall_s - float(self.done["seconds"]))
        return None

    def why(self) -> str:
        """What went wrong, in one line, for an error message."""
        hosts = (self.doc or {}).get("hosts") or []
        errors = [str(h.get("error")) for h in hosts if isinstance(h, dict) and h.get("error")]
        if errors:
            return f"{self.name} exited {self.rc}: {errors[0][:400]}"
        return f"{self.name} exited {self.rc}: {refusal_line(self.output)}"

    def summary(self, tokens_per_step: int) -> dict[str, Any]:
        start = self.start or {}
        steps = self.steps
        return {
            "via": self.via,
            "rc": self.rc,
            "wall_s": round(self.wall_s, 2),
            "run_id": (self.doc or {}).get("run_id") or start.get("run_id"),
            "device": start.get("device"),
            "device_name": start.get("device_name"),
            "precision": start.get("precision"),
            "process_group": start.get("backend"),  # None with one process: the trainer makes no group
            "world_size": start.get("world_size"),
            "params": start.get("params"),
            "tokens_per_step": tokens_per_step,
            "notes": start.get("notes"),
            "steps_logged": len(steps),
            "last_step": steps[-1]["step"] if steps else None,
            "first_loss": steps[0].get("loss") if steps else None,
            "last_loss": steps[-1].get("loss") if steps else None,
            "tokens_per_s_logged": [e.get("tokens_per_s") for e in steps],
            "tokens_per_s": _round(self.tokens_per_s),
            "train_seconds": (self.done or {}).get("seconds"),
            "startup_s": _round(self.startup_s()),
        }


def _round(v: float | None, digits: int = 1) -> float | None:
    return None if v is None else round(v, digits)


class Launcher:
    """Starts the reference trainer on the local lab: through `labctl train` (the CLI), or, where
    its preflight refused the host, through torchrun directly with the same settings."""

    def __init__(self, env: CheckEnv, root: Path) -> None:
        self.env = env
        self.root = root
        self.via = "cli"

    def labctl_cmd(self, *args: str) -> list[str]:
        assert self.env.inventory is not None, "write_inventory first"
        return [self.env.python, "-m", "labctl", "-i", str(self.env.inventory), "--json", *args]

    def train_args(self, settings: dict[str, Any], time_limit: int | None) -> list[str]:
        args = [
            "train",
            "--phase",
            "1",
            "--limit",
            self.env.host,
            "--device",
            self.env.device.split(":")[0],
            "--python",
            self.env.python,
            # The phase trains on its `gpus: [Tesla V100]`: here every GPU the host has.
            "--set",
            "gpus=[]",
            "--set",
            "port=0",  # a free rendezvous port
            "--set",
            "max_restarts=0",  # a failure is a failure here, not a restart that muddles the figures
            *cli_sets(settings),
        ]
        if time_limit is not None:
            args += ["--time-limit", f"{time_limit}s"]
        return args

    def preflight(self, settings: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """`labctl train --dry-run`: (accepted, what it said)."""
        timeout = timeout_s("preflight", self.env)
        proc = run_group(self.env, self.labctl_cmd(*self.train_args(settings, None), "--dry-run"), timeout)
        doc = _json(proc.stdout)
        if proc.returncode == 0 and doc:
            host = (doc.get("hosts") or [{}])[0]
            return True, {
                "accepted": True,
                "launch_backend": doc.get("backend"),
                "world_size": doc.get("world_size"),
                "gpus": host.get("gpus"),
                "device": host.get("device"),
                "cuda_visible_devices": (host.get("env") or {}).get("CUDA_VISIBLE_DEVICES"),
                "command": host.get("command"),
            }
        text = str((doc or {}).get("error") or proc.stderr or proc.stdout).strip()
        return False, {"accepted": False, "rc": proc.returncode, "said": tail(text, 1500)}

    def train(
        self, name: str, settings: dict[str, Any], timeout: float, time_limit: int | None = None
    ) -> TrainRun:
        if self.via == "direct":
            return self._direct(name, settings, timeout, time_limit)
        t0 = time.perf_counter()
        proc = run_group(self.env, self.labctl_cmd(*self.train_args(settings, time_limit)), timeout)
        wall = time.perf_counter() - t0
        doc = _json(proc.stdout)
        events: list[dict[str, Any]] = []
        if doc and doc.get("run_id"):
            from labctl.train.runs import runs_dir

            assert self.env.inventory is not None
            events = read_events(runs_dir(self.env.inventory) / str(doc["run_id"]) / "metrics.jsonl")
        return TrainRun(name, proc.returncode, wall, events, proc.stderr + proc.stdout, doc, "cli")

    def _direct(
        self, name: str, settings: dict[str, Any], timeout: float, time_limit: int | None
    ) -> TrainRun:
        metrics = self.root / f"{name}.metrics.jsonl"
        metrics.unlink(missing_ok=True)
        full = dict(settings, phase=1, run_id=f"gpucheck-{name}", metrics_path=str(metrics))
        if time_limit is not None:
            full["time_limit"] = time_limit
        cmd = [
            *torchrun(self.env, 1),
            "-m",
            "labctl.agent.train.trainer",
            "--settings",
            json.dumps(full),
        ]
        t0 = time.perf_counter()
        proc = run_group(self.env, cmd, timeout, trainer_env(self.env))
        wall = time.perf_counter() - t0
        events = read_events(metrics)
        rc = proc.returncode
        if rc == 0 and any(e.get("event") == "paused" for e in last_start(events)):
            rc = 75  # under torchrun a paused trainer exits 0; labctl train would say 75
        return TrainRun(name, rc, wall, events, proc.stderr + proc.stdout, None, "direct")


def timeout_s(what: str, env: CheckEnv) -> float:
    gpu, smoke = TIMEOUT_S[what]
    return gpu if env.cuda else smoke


def torchrun(env: CheckEnv, nproc: int) -> list[str]:
    return [
        env.python,
        "-m",
        "torch.distributed.run",
        "--standalone",  # a c10d rendezvous of its own on a free local port
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
    ]


def trainer_env(env: CheckEnv) -> dict[str, str]:
    """What labctl's launch gives a worker that matters here (plan.node_env)."""
    extra = {
        "LABCTL_TRAIN_DEVICE": env.device.split(":")[0],
        "LABCTL_HOST": env.host,
        "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // 2)),
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
    if env.cuda:
        extra["NCCL_DEBUG"] = "WARN"
    return extra


def _json(text: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    return path


# -- the section ----------------------------------------------------------------------------------


@dataclass
class State:
    env: CheckEnv
    section: Section
    root: Path
    shapes: dict[str, Shape]
    launcher: Launcher
    errors: list[str] = field(default_factory=list)
    startup: list[float] = field(default_factory=list)

    def part(self, what: str, fn: Callable[[], None]) -> None:
        """One part of the section; a failure is recorded and the next part still runs."""
        self.env.log(f"trainer: {what}")
        try:
            fn()
        except Exception as exc:
            msg = (
                f"{what}: {type(exc).__name__}: {exc}"
                if not isinstance(exc, CheckFailed)
                else f"{what}: {exc}"
            )
            self.env.log(f"trainer: {what} failed: {msg[:300]}")
            self.errors.append(msg)


def run(env: CheckEnv) -> Section:
    section = Section(KEY, TITLE)
    t0 = time.perf_counter()
    root = (env.work / "trainer").resolve()
    root.mkdir(parents=True, exist_ok=True)
    shapes = SMOKE_SHAPES if env.smoke else GPU_SHAPES
    st = State(env, section, root, shapes, Launcher(env, root))
    section.figures["device"] = env.device
    section.figures["smoke"] = env.smoke
    section.figures["shapes"] = {k: vars(v) for k, v in shapes.items()}
    try:
        st.part("preflight", lambda: _preflight(st))
        st.part("fp32 and AMP throughput", lambda: _throughput(st))
        st.part("time-limit pause and resume", lambda: _time_limit(st))
        st.part("two ranks on one device", lambda: _two_ranks(st))
    finally:
        section.seconds = time.perf_counter() - t0
    if st.errors:
        section.error = "; ".join(st.errors)
    return section


def _preflight(st: State) -> None:
    env, section = st.env, st.section
    settings = dict(st.shapes["throughput"].settings(), checkpoint_dir=str(st.root / "ckpt-preflight"))
    ok, said = st.launcher.preflight(settings)
    section.figures["preflight"] = said
    if ok:
        section.row(
            "`labctl train --dry-run` preflight",
            f"accepted: {said.get('device')} {', '.join(said.get('gpus') or []) or ''}".strip(),
            f"launch backend {said.get('launch_backend')}, world size {said.get('world_size')}",
        )
        return
    # Refused: say why, and train through torchrun directly so the trainer's figures still come.
    st.launcher.via = "direct"
    why = preflight_problems(str(said.get("said", "")))
    section.skip("labctl train through the CLI (preflight refused the local host)", why[:600])
    section.row("`labctl train --dry-run` preflight", "REFUSED (trained through torchrun instead)", why[:300])
    env.log(
        f"trainer: the preflight refused the host, training through torchrun directly:\n{said.get('said')}"
    )


def _throughput(st: State) -> None:
    env, section, shape = st.env, st.section, st.shapes["throughput"]
    nvml = Nvml()
    if not nvml.ok:
        section.skip("GPU utilisation / memory / power during the trainer's runs (NVML)", str(nvml.why))
    else:
        section.figures["nvml_gpu"] = {"index": 0, "name": nvml.name, "count": nvml.count}
    results: dict[str, TrainRun] = {}
    failed: list[str] = []
    try:
        for label, mixed in (("fp32", False), ("amp", True)):
            ckpt = fresh_dir(st.root / f"ckpt-{label}")
            settings = dict(shape.settings(), mixed_precision=mixed, checkpoint_dir=str(ckpt))
            sampler = Sampler(nvml.query).start() if nvml.ok else None
            try:
                r = st.launcher.train(label, settings, timeout_s("throughput", env))
            except CheckFailed as exc:  # ran past its timeout: the other precision still runs
                failed.append(f"{label}: {exc}")
                continue
            finally:
                samples = sampler.stop() if sampler else []
                shutil.rmtree(ckpt, ignore_errors=True)  # ~1.3 GB each on the card
            results[label] = r
            fig = r.summary(shape.tokens_per_step())
            if sampler is not None:
                fig["gpu"] = summarise_gpu(samples)
                if sampler.errors:
                    fig["gpu"]["errors"] = sampler.errors[:3]
            section.figures[label] = fig
            if r.rc != 0 or r.done is None:
                failed.append(r.why())  # the other precision still runs: one GPU session, every figure it can
                continue
            s = r.startup_s()
            if s is not None:
                st.startup.append(s)
    finally:
        nvml.close()
    if failed:
        raise CheckFailed("; ".join(failed))
    fp32, amp = results["fp32"], results["amp"]
    ratio = (amp.tokens_per_s / fp32.tokens_per_s) if amp.tokens_per_s and fp32.tokens_per_s else None
    section.figures["amp_over_fp32"] = _round(ratio, 3)
    precision = (amp.start or {}).get("precision")
    section.figures["amp_precision"] = precision
    section.row(
        "trainer fp32 tokens/s", fmt(fp32.tokens_per_s, "tok/s", 0), f"{shape.steps} steps, steady median"
    )
    section.row(
        f"trainer AMP ({precision}) tokens/s",
        fmt(amp.tokens_per_s, "tok/s", 0),
        f"{fmt(ratio, 'x')} of fp32"
        + ("" if precision != "fp32" else " (AMP off on this device: both fp32)"),
    )
    for label in ("fp32", "amp"):
        gpu = section.figures[label].get("gpu")
        if gpu and gpu.get("samples"):
            section.row(
                f"GPU during the {label} run (NVML, every {SAMPLE_EVERY_S} s)",
                f"util max {fmt(gpu.get('util_max_pct'), '%', 0)}, mean {fmt(gpu.get('util_mean_busy_pct'), '%', 0)}",
                f"memory max {fmt(gpu.get('mem_max_mib'), 'MiB', 0)}, power max {fmt(gpu.get('power_max_w'), 'W', 0)}"
                f" mean {fmt(gpu.get('power_mean_busy_w'), 'W', 0)}",
            )


def _time_limit(st: State) -> None:
    env, section, shape = st.env, st.section, st.shapes["limited"]
    startup = min(st.startup) if st.startup else (30.0 if env.cuda else 20.0)
    limit = time_limit_s(startup + 3.0, TRAIN_WINDOW_S[env.cuda], shape.state_bytes())
    ckpt = fresh_dir(st.root / "ckpt-time-limit")
    base = dict(shape.settings(), mixed_precision=True, checkpoint_dir=str(ckpt))
    fig: dict[str, Any] = {"limit_s": limit, "startup_estimate_s": round(startup, 2)}
    section.figures["time_limit"] = fig
    first = st.launcher.train("time-limit", base, limit + timeout_s("resume", env), time_limit=limit)
    paused = first.paused or {}
    fig.update(
        first_rc=first.rc,
        first_wall_s=round(first.wall_s, 2),
        precision=(first.start or {}).get("precision"),
        process_group=(first.start or {}).get("backend"),
        stop_step=paused.get("step"),
        resume_step=paused.get("resume_step"),
        paused_seconds=paused.get("seconds"),
        checkpoint=paused.get("checkpoint"),
        checkpoint_exists=bool(paused.get("checkpoint")) and Path(str(paused.get("checkpoint"))).is_file(),
        first_tokens_per_s=_round(first.tokens_per_s),
    )
    if first.rc != 75 or not paused:
        raise CheckFailed(f"expected a pause (exit 75 and a paused event): {first.why()}")
    n = int(paused["resume_step"])
    if not fig["checkpoint_exists"]:
        raise CheckFailed(f"paused at step {n} but its checkpoint {paused.get('checkpoint')} is not on disk")
    extra = 2 * shape.log_every
    second = st.launcher.train("resume", dict(base, steps=n + extra), timeout_s("resume", env))
    start2, done2, steps2 = second.start or {}, second.done or {}, second.steps
    fig.update(
        resume_rc=second.rc,
        resume_wall_s=round(second.wall_s, 2),
        resumed_from=start2.get("resumed_from"),
        resume_first_logged_step=steps2[0]["step"] if steps2 else None,
        resume_done_step=done2.get("step"),
        resume_target_step=n + extra,
        loss_at_pause=paused.get("loss"),
        resume_first_loss=steps2[0].get("loss") if steps2 else None,
    )
    if second.rc != 0 or not done2:
        raise CheckFailed(f"the resumed run did not finish: {second.why()}")
    if start2.get("resumed_from") != n or done2.get("step") != n + extra:
        raise CheckFailed(
            f"the second run should resume at step {n} and finish at {n + extra}: it started from "
            f"{start2.get('resumed_from')} and ended at {done2.get('step')}"
        )
    section.row(
        f"`--time-limit {limit}s`: paused at step (exit {first.rc})",
        str(n),
        f"after {fmt(paused.get('seconds'), 's', 1)} of the limit; checkpoint on disk",
    )
    section.row(
        "the same checkpoint_dir again: resumed from step",
        str(start2.get("resumed_from")),
        f"finished at step {done2.get('step')} in {fmt(second.wall_s, 's', 1)} (not from 0)",
    )


TWO_RANKS_WRAPPER = '''"""Two torchrun workers on one device: both are told LOCAL_RANK 0 (bench/gpucheck/trainer.py)."""
import os
import sys

os.environ["LOCAL_RANK"] = "0"
from labctl.agent.train.trainer import main  # noqa: E402

sys.exit(main())
'''


def _two_ranks(st: State) -> None:
    env, section, shape = st.env, st.section, st.shapes["two_ranks"]
    wrapper = st.root / "two_ranks_one_device.py"
    wrapper.write_text(TWO_RANKS_WRAPPER)
    ckpt = fresh_dir(st.root / "ckpt-two-ranks")
    metrics = st.root / "two-ranks.metrics.jsonl"
    metrics.unlink(missing_ok=True)
    settings = dict(
        shape.settings(),
        phase=1,
        run_id="gpucheck-two-ranks",
        mixed_precision=True,
        checkpoint_dir=str(ckpt),
        # Both ranks see one checkpoint folder: rank 0 alone writes it.
        shared_checkpoints=True,
        metrics_path=str(metrics),
        # Never reached; it makes rank 0 broadcast its stop decision (a gloo group beside NCCL).
        time_limit=600,
    )
    cmd = [*torchrun(env, 2), str(wrapper), "--settings", json.dumps(settings)]
    backend = "nccl" if env.cuda else "gloo"
    t0 = time.perf_counter()
    try:
        proc = run_group(env, cmd, timeout_s("two_ranks", env), trainer_env(env))
    except CheckFailed as exc:
        why = f"timed out: {str(exc).splitlines()[0]}"
        section.figures["two_ranks"] = {"attempted": True, "ok": False, "backend": backend, "reason": why}
        section.skip(f"two ranks on one {env.device} ({backend})", why)
        return
    wall = time.perf_counter() - t0
    r = TrainRun(
        "two-ranks", proc.returncode, wall, read_events(metrics), proc.stderr + proc.stdout, None, "torchrun"
    )
    fig = {"attempted": True, "backend": backend, **r.summary(shape.tokens_per_step(2))}
    section.figures["two_ranks"] = fig
    done = r.done
    if r.rc == 0 and done is not None:
        fig.update(ok=True, replicas_agree=done.get("replicas_agree"), done_step=done.get("step"))
        section.row(
            f"two ranks on one {env.device} ({(r.start or {}).get('backend')}) tokens/s",
            fmt(r.tokens_per_s, "tok/s", 0),
            f"world size {(r.start or {}).get('world_size')}, replicas agree: {done.get('replicas_agree')}",
        )
        return
    why = refusal_line(r.output)
    fig.update(ok=False, reason=why)
    section.skip(f"two ranks on one {env.device} ({backend})", why)
    section.row(f"two ranks on one {env.device} ({backend})", "refused", why[:200])
