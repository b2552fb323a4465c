"""The reference trainer that `labctl train` launches under torchrun: tinylm on a synthetic corpus.

    python -m labctl.agent.train.trainer --settings '{"steps": 200, ...}'
    python -m labctl.agent.train.trainer --settings @settings.json
    python -m torch.distributed.run --nproc-per-node=2 ... -m labctl.agent.train.trainer --settings ...

Without torchrun's environment (or with WORLD_SIZE 1) it is one process: no process group, no
DDP. With WORLD_SIZE > 1 it joins the process group (nccl on CUDA, gloo on the CPU or when
LABCTL_TRAIN_DEVICE=cpu) and trains a DDP-wrapped model.

Rank 0 prints one JSON object per line on stdout, each with an "event" key: "start", "step"
(every `log_every` steps and on the last), "checkpoint", "batch_resize", and "done" or, when
`time_limit` ended the run before its last step, "paused" (trainer_limit.py), and
appends the same lines to `metrics_path`; where TensorBoard is installed it also writes the
step events' scalars to event files beside it (trainer_events.py). Other ranks print nothing
on stdout. A failure is one line on stderr ("labctl trainer: error: ...") and a non-zero exit.
A paused run exits EXIT_PAUSED (75) alone and 0 under torchrun, which would take a non-zero
exit for a failure and restart the workers.
The settings and their checks live in trainer_settings.py.

Like the rest of the agent package this module imports without torch (torch is imported
inside functions) and keeps to Python 3.8 syntax.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import socket
import sys
import time
import traceback
from typing import IO, Any, Dict, List, Mapping, Optional, Sequence

from .ckpt import FORMAT, CheckpointDir, choose_common, config_mismatch, pt_name
from .corpus import Corpus
from .events import EventLog
from .limit import StepTimes, check_interval, checkpoint_estimate, clock_origin, should_stop
from .settings import (
    DEFAULTS,
    EXIT_PAUSED,
    MIN_LR_RATIO,
    TrainerError,
    load_settings,
    lr_factor,
    resolve_settings,
)

# What other code imports from here; the settings moved to trainer_settings.py.
__all__ = [
    "DEFAULTS",
    "DEVICE_ENV",
    "EXIT_PAUSED",
    "MIN_LR_RATIO",
    "DistEnv",
    "Trainer",
    "TrainerError",
    "load_settings",
    "lr_factor",
    "main",
    "resolve_settings",
]

DEVICE_ENV = "LABCTL_TRAIN_DEVICE"  # "cpu" forces the CPU (and gloo) where CUDA exists


class DistEnv:
    """What torchrun tells a worker through its environment (all 0/1 without torchrun)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        def num(key: str, default: int) -> int:
            value = environ.get(key, "")
            try:
                return int(value) if value.strip() else default
            except ValueError:
                raise TrainerError(f"environment: {key}={value!r} is not an integer") from None

        self.world_size = num("WORLD_SIZE", 1)
        self.distributed = self.world_size > 1
        self.rank = num("RANK", 0) if self.distributed else 0
        self.local_rank = num("LOCAL_RANK", 0) if self.distributed else 0
        self.local_world_size = num("LOCAL_WORLD_SIZE", 1) if self.distributed else 1
        self.restart = num("TORCHELASTIC_RESTART_COUNT", 0)
        self.device_pref = environ.get(DEVICE_ENV, "").strip().lower()
        # The inventory's name for this host (the controller sets it), for reports.
        self.host = environ.get("LABCTL_HOST") or socket.gethostname()


def _is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.cuda.OutOfMemoryError)


class Trainer:
    """One worker's training: setup() once, then run() (or train_steps() for a benchmark)."""

    def __init__(
        self,
        settings: Mapping[str, Any],
        out: Optional[IO[str]] = None,
        environ: Optional[Mapping[str, str]] = None,
        started_at: Optional[float] = None,
    ) -> None:
        """`started_at`: the time.monotonic() a time_limit counts from (default: now)."""
        self.s = resolve_settings(settings)
        self.env = DistEnv(os.environ if environ is None else environ)
        self.out = sys.stdout if out is None else out
        self.is_rank0 = self.env.rank == 0
        self.events = EventLog(self.out, active=self.is_rank0)
        self.steps: int = self.s["steps"]
        self.batch_size: int = self.s["batch_size"]
        self.acc: int = self.s["accumulation_steps"]
        self.seq_len: int = self.s["seq_len"]
        self.log_every: int = self.s["log_every"]
        self.ckpt_every: int = self.s["checkpoint_every"]
        self.model_config: Dict[str, Any] = self.s["model_config"]
        self.restart = self.env.restart
        self.ckdir: Optional[CheckpointDir] = (
            CheckpointDir(self.s["checkpoint_dir"]) if self.s["checkpoint_dir"] else None
        )
        self.pg_initialized = False
        self.backend: Optional[str] = None
        self.notes: List[str] = []
        self.resumed_from: Optional[int] = None
        self.skipped: List[Dict[str, Any]] = []
        self.step = 0  # optimizer steps completed
        self.last_loss: Optional[float] = None
        self.hosts = 1
        self.t0 = time.perf_counter()
        self.time_limit: Optional[float] = self.s["time_limit"]
        self.started_at = time.monotonic() if started_at is None else started_at
        self.step_times = StepTimes()
        self.checkpoint_seconds: List[float] = []
        self.paused_at: Optional[int] = None
        self._next_check = 0  # the step after which rank 0 next decides (every rank knows it)
        self._ctl_group: Any = None  # the process group the stop decision travels on

    # -- output ---------------------------------------------------------------------------

    def emit(self, event: Dict[str, Any]) -> None:
        """A JSON line on stdout and in metrics_path (and TensorBoard scalars), from rank 0 only."""
        self.events.write(event)

    # -- setup ------------------------------------------------------------------------------

    def _device(self) -> Any:
        import torch

        pref = self.env.device_pref
        if pref not in ("", "auto", "cpu", "cuda"):
            raise TrainerError(f"{DEVICE_ENV} must be cpu, cuda or auto, got {pref!r}")
        if pref == "cpu" or (pref != "cuda" and not torch.cuda.is_available()):
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise TrainerError(f"{DEVICE_ENV}=cuda but torch sees no CUDA device")
        count = torch.cuda.device_count()
        if self.env.local_rank >= count:
            raise TrainerError(
                f"local rank {self.env.local_rank} has no GPU: torch sees {count} "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
            )
        torch.cuda.set_device(self.env.local_rank)
        return torch.device("cuda", self.env.local_rank)

    def _init_dist(self) -> None:
        import torch.distributed as dist

        if not self.env.distributed:
            return
        if self.device.type == "cuda":
            dist.init_process_group("nccl", device_id=self.device)
            self.backend = "nccl"
        else:
            dist.init_process_group("gloo")
            self.backend = "gloo"
        self.pg_initialized = True
        if self.time_limit is not None and self.backend == "nccl":
            # A CUDA tensor's broadcast would make every step wait for the GPU: the decision
            # goes on a CPU (gloo) group beside NCCL instead.
            self._ctl_group = dist.new_group(backend="gloo")

    def gather(self, obj: Any) -> List[Any]:
        """Every rank's `obj`, in rank order (just [obj] in a single process)."""
        if not self.env.distributed:
            return [obj]
        import torch.distributed as dist

        out: List[Any] = [None] * self.env.world_size
        dist.all_gather_object(out, obj)
        return out

    def _precision(self, infos: Sequence[Dict[str, Any]]) -> None:
        """Choose autocast and gradient scaling; every rank must choose the same.

        One GPU below compute capability 8.0 (no bf16) puts every rank on fp16: a scaler on
        some ranks but not others would average scaled gradients with unscaled ones.
        """
        import torch

        self.amp_dtype: Any = None
        self.scaler: Any = None
        self.precision = "fp32"
        if not self.s["mixed_precision"]:
            return
        if self.device.type != "cuda":
            self.notes.append("mixed_precision ignored on the CPU: training in fp32")
            return
        caps = [tuple(i["capability"]) for i in infos if i.get("capability")]
        if min(caps) >= (8, 0):
            self.amp_dtype, self.precision = torch.bfloat16, "bf16"
            return
        self.amp_dtype, self.precision = torch.float16, "fp16"
        gs = self.s["gradient_scaling"]
        if gs["enabled"]:
            self.scaler = torch.amp.GradScaler(
                "cuda",
                init_scale=gs["initial_scale"],
                growth_factor=gs["growth_factor"],
                backoff_factor=gs["backoff_factor"],
                growth_interval=gs["growth_interval"],
            )
        else:
            self.notes.append("fp16 without gradient scaling: small gradients may underflow to zero")

    def setup(self) -> None:
        import torch

        from ..tinylm import build_model

        self.device = self._device()
        self._init_dist()
        cap = list(torch.cuda.get_device_capability(self.device)) if self.device.type == "cuda" else None
        infos = self.gather({"local_rank": self.env.local_rank, "capability": cap})
        self.hosts = sum(1 for i in infos if i["local_rank"] == 0)
        self._precision(infos)
        self.events.open(self.s["metrics_path"])
        if self.events.note:
            self.notes.append(self.events.note)

        torch.manual_seed(self.s["seed"])
        self.module = build_model(self.model_config, device=self.device)
        named = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        self.param_names = [n for n, _ in named]
        self.params = [p for _, p in named]
        decay = [p for p in self.params if p.dim() >= 2]
        no_decay = [p for p in self.params if p.dim() < 2]
        groups = [
            {"params": decay, "weight_decay": self.s["weight_decay"]},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        fused = True if self.device.type == "cuda" else None
        self.opt = torch.optim.AdamW(groups, lr=self.s["lr"], fused=fused)
        self.ema: Optional[List[Any]] = None
        if self.s["ema"]:
            self.ema = [p.detach().clone() for p in self.params]
        self.corpus = Corpus(self.s["seed"], self.model_config["vocab"], self.seq_len)
        self.corpus.to(self.device)
        self._resume()
        if self.s["dynamic_batch_sizing"] and self.device.type == "cuda":
            # Before DDP exists: its gradient hooks would all-reduce the probe's gradients.
            self._fit_micro_batch()
        self.model: Any = self.module
        if self.env.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP

            # Wrapped after loading: DDP broadcasts rank 0's weights, so every replica starts equal.
            self.model = DDP(
                self.module,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                bucket_cap_mb=self.s["bucket_cap_mb"],
            )
        self._loss_sum = torch.zeros((), device=self.device)
        self._grad_norm: Any = None
        self._param_data = [p.detach() for p in self.params]
        self._vocab = self.model_config["vocab"]
        self._tokens_per_step = self.batch_size * self.acc * self.env.world_size * self.seq_len
        # weights and AdamW's two moments (and the EMA): what a checkpoint holds, for its first estimate
        self._state_bytes = sum(p.numel() * p.element_size() for p in self.params) * (
            3 + (1 if self.ema is not None else 0)
        )
        self._stop_flag = torch.zeros(2, dtype=torch.int32)
        self.t0 = time.perf_counter()
        self._last_log = (self.step, self.t0)

    def _resume(self) -> None:
        """Load the newest checkpoint valid on every host, if there is one."""
        import torch

        mine = None
        if self.ckdir is not None and self.keeps_checkpoints:
            # One process per host hashes the host's checkpoints; its local peers read the same folder.
            self.ckdir.clean_temp()
            valid, skipped = self.ckdir.scan()
            mine = {"host": self.env.host, "valid": valid, "skipped": skipped}
        reports = [r for r in self.gather(mine) if r is not None]
        chosen = choose_common([r["valid"] for r in reports])
        for r in reports:
            for entry in r["skipped"]:
                self.skipped.append(dict(entry, host=r["host"]))
            for step in r["valid"]:
                if chosen is None or step > chosen:
                    elsewhere = [o["host"] for o in reports if step not in o["valid"]]
                    self.skipped.append(
                        {
                            "host": r["host"],
                            "step": step,
                            "path": os.path.join(self.s["checkpoint_dir"], pt_name(step)),
                            "reason": "not valid on every host (missing or invalid on "
                            + ", ".join(elsewhere)
                            + ")",
                        }
                    )
        self.skipped.sort(key=lambda e: (-e["step"], e["host"]))
        if self.is_rank0:
            for entry in self.skipped:
                print(
                    f"labctl trainer: skipping checkpoint {entry['path']} on {entry['host']}: {entry['reason']}",
                    file=sys.stderr,
                    flush=True,
                )
        if chosen is None or self.ckdir is None:
            return
        where = self.ckdir.pt_path(chosen)
        manifest = self.ckdir.manifest(chosen)
        diffs = config_mismatch(manifest.get("model") or {}, self.model_config)
        if diffs:
            raise TrainerError(
                f"checkpoint dir {self.ckdir.path} holds {pt_name(chosen)} of a different model ("
                + "; ".join(diffs)
                + "): resuming needs the same model; use a new checkpoint_dir or empty this one"
            )
        state = torch.load(where, map_location=self.device, weights_only=True)
        if state.get("format") != FORMAT or state.get("step") != chosen:
            raise TrainerError(f"{where} is not a step-{chosen} checkpoint of this trainer")
        self.module.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        # The settings, not the checkpoint, own the hyper-parameters: a resumed run may change them.
        self.opt.param_groups[0]["weight_decay"] = self.s["weight_decay"]
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None:
            saved = state.get("ema")
            for i, name in enumerate(self.param_names):
                self.ema[i].copy_(saved[name] if saved else self.params[i].detach())
            if not saved:
                self.notes.append(f"{pt_name(chosen)} has no EMA: the EMA restarts from its weights")
        self.step = chosen
        self.resumed_from = chosen

    def _fit_micro_batch(self) -> None:
        """Find a micro-batch that fits before the first step, the same on every rank.

        An OOM in the middle of a DDP step cannot be retried (the other ranks are already
        inside the gradient all-reduce), so every CUDA run with dynamic_batch_sizing probes one
        forward/backward on its own at the configured size, halving until it fits. The probe
        does not hold the optimizer's state yet; a single process still retries later OOMs.
        """
        import torch

        while True:
            try:
                x, y = self.corpus.batch(1, 0, 0, 1, self.batch_size, 1)
                with self._autocast():
                    logits = self.module(x)
                torch.nn.functional.cross_entropy(
                    logits.float().view(-1, logits.shape[-1]), y.reshape(-1)
                ).backward()
                fits = True
            except torch.cuda.OutOfMemoryError:
                fits = False
            self.opt.zero_grad(set_to_none=True)
            if fits:
                break
            torch.cuda.empty_cache()
            if not self._shrink(self.step + 1, "CUDA out of memory in the start-up probe"):
                raise TrainerError(f"CUDA out of memory with a micro-batch of {self.batch_size}")
        smallest = min(self.gather(self.batch_size))
        while self.batch_size > smallest:
            if not self._shrink(self.step + 1, "another rank needed a smaller micro-batch"):
                break

    def _shrink(self, step: int, reason: str) -> bool:
        """Halve the micro-batch (about; it must divide the per-rank batch) and raise accumulation."""
        total = self.batch_size * self.acc
        smaller = [d for d in range(self.batch_size // 2, 0, -1) if total % d == 0]
        if not smaller:
            return False
        previous = self.batch_size
        self.batch_size = smaller[0]
        self.acc = total // self.batch_size
        self.emit(
            {
                "event": "batch_resize",
                "step": step,
                "batch_size": self.batch_size,
                "accumulation_steps": self.acc,
                "previous_batch_size": previous,
                "reason": reason,
                "restart": self.restart,
            }
        )
        return True

    # -- the step loop ------------------------------------------------------------------------

    def _autocast(self) -> Any:
        import torch

        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def lr_at(self, step: int) -> float:
        return self.s["lr"] * lr_factor(step - 1, self.s["warmup_steps"], self.steps)

    def _train_step(self, step: int) -> Any:
        """One optimizer step; returns the on-device sum of its micro-batches' losses."""
        import torch
        from torch.nn import functional as F

        model, opt, scaler, acc = self.model, self.opt, self.scaler, self.acc
        lr = self.lr_at(step)
        for group in opt.param_groups:
            group["lr"] = lr
        loss_sum = self._loss_sum
        loss_sum.zero_()
        ws, rank, vocab = self.env.world_size, self.env.rank, self._vocab
        for micro in range(acc):
            x, y = self.corpus.batch(step, micro, rank, ws, self.batch_size, acc)
            # Gradients are all-reduced on the last micro-step only.
            sync = model.no_sync() if self.env.distributed and micro < acc - 1 else contextlib.nullcontext()
            with sync:
                with self._autocast():
                    logits = model(x)
                loss = F.cross_entropy(logits.float().view(-1, vocab), y.reshape(-1))
                scaled = loss / acc if acc > 1 else loss
                if scaler is not None:
                    scaler.scale(scaled).backward()
                else:
                    scaled.backward()
            loss_sum += loss.detach()
        clip = self.s["grad_clip"]
        # The norm is measured where clipping computes it anyway, else only on the steps that log it.
        self._grad_norm = None
        if clip or step % self.log_every == 0 or step == self.steps:
            if scaler is not None:
                scaler.unscale_(opt)
            # The total norm before clipping (max_norm inf clips nothing); a device tensor, read when logged.
            self._grad_norm = torch.nn.utils.clip_grad_norm_(self.params, clip if clip else math.inf)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if self.ema is not None:
            with torch.no_grad():
                torch._foreach_lerp_(self.ema, self._param_data, 1.0 - self.s["ema_decay"])
        return loss_sum

    def _step_with_retry(self, step: int) -> Any:
        while True:
            try:
                return self._train_step(step)
            except Exception as exc:
                if not (_is_oom(exc) and self.s["dynamic_batch_sizing"]):
                    raise
                if self.env.distributed:
                    raise TrainerError(
                        f"CUDA out of memory at step {step} with a micro-batch of {self.batch_size} on "
                        f"rank {self.env.rank}: a DDP step cannot be retried; lower batch_size"
                    ) from exc
                del exc
                import torch

                self.opt.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                if not self._shrink(step, "CUDA out of memory"):
                    raise

    def train_steps(self, first: int, last: int) -> Optional[float]:
        """Steps first..last (1-based); returns the last logged loss. The loop a benchmark times.

        With a time_limit it may stop earlier, at a step every rank agrees on, with a checkpoint
        there (`paused_at`).
        """
        log_every, ckpt_every, steps = self.log_every, self.ckpt_every, self.steps
        timed = self.time_limit is not None
        for step in range(first, last + 1):
            began = time.perf_counter() if timed else 0.0
            loss_sum = self._step_with_retry(step)
            self.step = step
            # Only logging steps synchronise with the device (.item()) or build JSON.
            logged = step % log_every == 0 or step == steps
            if logged:
                self._log(step, loss_sum)
            if timed:
                self.step_times.add(time.perf_counter() - began)
            saved = step == steps or bool(ckpt_every and step % ckpt_every == 0)
            if saved:
                self.save(step)
            if timed and step < steps and step >= self._next_check and self._stop_here(step):
                if not logged:
                    self._log(step, loss_sum)  # the step a paused run resumes after says its loss
                if not saved:
                    self.save(step)
                self.paused_at = step
                break
        return self.last_loss

    def _stop_here(self, step: int) -> bool:
        """Rank 0's should_stop, the same answer on every rank, with the step of the next check
        (one broadcast of two numbers)."""
        assert self.time_limit is not None
        stop, interval = 0, 1
        if self.is_rank0:
            step_s = self.step_times.estimate()
            interval = min(check_interval(step_s), self.steps - step)
            if self.ckpt_every:
                # A regular checkpoint's time is measured, not foreseen: check right after it.
                interval = min(interval, self.ckpt_every - step % self.ckpt_every)
            estimate = checkpoint_estimate(self.checkpoint_seconds, self._state_bytes)
            stop = int(should_stop(self.elapsed(), interval * step_s, estimate, self.time_limit))
        if self.env.distributed:
            import torch.distributed as dist

            flag = self._stop_flag
            flag[0], flag[1] = stop, interval
            dist.broadcast(flag, src=0, group=self._ctl_group)
            stop, interval = int(flag[0]), int(flag[1])
        self._next_check = step + interval
        return bool(stop)

    def elapsed(self) -> float:
        """Seconds since the clock a time_limit counts from started."""
        return time.monotonic() - self.started_at

    def _log(self, step: int, loss_sum: Any) -> None:
        if self.env.distributed:
            import torch.distributed as dist

            dist.all_reduce(loss_sum)
        loss = loss_sum.item() / (self.acc * self.env.world_size)
        if not math.isfinite(loss):
            raise TrainerError(f"loss is {loss} at step {step}: training diverged")
        loss = round(loss, 6)
        now = time.perf_counter()
        last_step, last_time = self._last_log
        rate = (step - last_step) * self._tokens_per_step / max(now - last_time, 1e-9)
        self._last_log = (step, now)
        self.last_loss = loss
        grad_norm = None
        if self._grad_norm is not None:
            norm = self._grad_norm.item()
            # An fp16 overflow step (skipped by the scaler) has an inf norm, which JSON cannot carry.
            grad_norm = round(norm, 6) if math.isfinite(norm) else None
        self.emit(
            {
                "event": "step",
                "step": step,
                "steps": self.steps,
                "loss": loss,
                "lr": self.lr_at(step),
                "grad_norm": grad_norm,
                "tokens_per_s": round(rate, 1),
                "seconds": round(now - self.t0, 3),
                "restart": self.restart,
            }
        )

    # -- checkpoints ---------------------------------------------------------------------------

    def _state(self, step: int) -> Dict[str, Any]:
        ema = None
        if self.ema is not None:
            ema = {name: self.ema[i] for i, name in enumerate(self.param_names)}
        return {
            "format": FORMAT,
            "step": step,
            "model": self.module.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": {
                "name": "warmup_cosine",
                "completed_steps": step,
                "lr": self.s["lr"],
                "warmup_steps": self.s["warmup_steps"],
                "total_steps": self.steps,
                "min_lr_ratio": MIN_LR_RATIO,
            },
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "ema": ema,
            "ema_decay": self.s["ema_decay"] if ema is not None else None,
            "config": self.model_config,
            "settings": {
                k: self.s[k]
                for k in (
                    "run_id",
                    "phase",
                    "steps",
                    "batch_size",
                    "accumulation_steps",
                    "seq_len",
                    "lr",
                    "seed",
                )
            },
            "world_size": self.env.world_size,
            "precision": self.precision,
        }

    def _barrier(self) -> None:
        import torch.distributed as dist

        if self.backend == "nccl":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    @property
    def keeps_checkpoints(self) -> bool:
        """Whether this process writes and scans the checkpoint folder: every host's local rank 0,
        or rank 0 alone when the folder is shared by every node."""
        return self.env.rank == 0 if self.s["shared_checkpoints"] else self.env.local_rank == 0

    def save(self, step: int) -> None:
        """Each keeper writes its copy (see keeps_checkpoints); rank 0 reports once all have."""
        if self.ckdir is None:
            return
        start = time.perf_counter()
        info = None
        if self.keeps_checkpoints:
            info = self.ckdir.save(step, self._state(step), self.model_config)
            self.ckdir.prune(self.s["keep_checkpoints"])
        if self.env.distributed:
            self._barrier()
        seconds = time.perf_counter() - start
        self.checkpoint_seconds.append(seconds)
        # Saving is not training: keep it out of the next tokens_per_s.
        last_step, last_time = self._last_log
        self._last_log = (last_step, last_time + seconds)
        if info is not None:
            self.emit(
                {
                    "event": "checkpoint",
                    "step": step,
                    "path": info["path"],
                    "sha256": info["sha256"],
                    "bytes": info["bytes"],
                    "seconds": round(seconds, 3),
                }
            )

    # -- the whole run -----------------------------------------------------------------------

    def start_event(self) -> Dict[str, Any]:
        import torch

        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        event = {
            "event": "start",
            "run_id": self.s["run_id"],
            "phase": self.s["phase"],
            "world_size": self.env.world_size,
            "hosts": self.hosts,
            "device": str(self.device),
            "device_name": name,
            "backend": self.backend,
            "precision": self.precision,
            "resumed_from": self.resumed_from,
            "skipped_checkpoints": self.skipped,
            "restart": self.restart,
            "params": sum(p.numel() for p in self.params),
            "steps": self.steps,
            "batch_size": self.batch_size,
            "accumulation_steps": self.acc,
            "global_batch": self.batch_size * self.acc * self.env.world_size,
            "seq_len": self.seq_len,
            "time_limit": self.time_limit,
        }
        if self.events.tensorboard_dir is not None:
            event["tensorboard"] = self.events.tensorboard_dir
        if self.notes:
            event["notes"] = self.notes
        return event

    def replicas_agree(self) -> bool:
        """Whether every rank ends with the same weights (per-tensor sums compared exactly)."""
        import torch

        with torch.no_grad():
            sums = torch.stack([p.detach().double().sum() for p in self.params]).tolist()
        return all(s == sums for s in self.gather(sums))

    def run(self) -> Dict[str, Any]:
        self.emit(self.start_event())
        # A run resumed at (or past) its step count trains nothing and rewrites nothing.
        if self.step < self.steps:
            self.train_steps(self.step + 1, self.steps)
        if self.paused_at is not None:
            return self._pause()
        done = {
            "event": "done",
            "step": self.step,
            "loss": self.last_loss,
            "seconds": round(time.perf_counter() - self.t0, 3),
            "restart": self.restart,
        }
        if self.env.distributed:
            done["replicas_agree"] = self.replicas_agree()
        self.emit(done)
        if self.env.distributed:
            self._barrier()  # nothing in flight on any rank when the process groups go away
        return done

    def _pause(self) -> Dict[str, Any]:
        assert self.ckdir is not None and self.paused_at is not None
        paused = {
            "event": "paused",
            "reason": "time_limit",
            "step": self.paused_at,
            "resume_step": self.paused_at,
            "checkpoint": self.ckdir.pt_path(self.paused_at),
            "time_limit": self.time_limit,
            "seconds": round(self.elapsed(), 3),
            "loss": self.last_loss,
            "restart": self.restart,
        }
        self.emit(paused)
        if self.env.distributed:
            self._barrier()
        return paused

    def close(self) -> None:
        self.events.close()
        if self.pg_initialized:
            import gc

            import torch.distributed as dist

            # DDP's reducer holds the process group: left alive, gloo's worker threads would be
            # torn down at interpreter exit instead, which aborts the process (SIGABRT).
            self.model = None
            gc.collect()
            dist.destroy_process_group()
            self.pg_initialized = False


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m labctl.agent.train.trainer", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--settings", help="the run's settings as a JSON object, or @PATH of a JSON file")
    args = ap.parse_args(argv)
    rank = os.environ.get("RANK", "0")
    who = (
        "labctl trainer"
        if os.environ.get("WORLD_SIZE", "1") in ("", "1")
        else f"labctl trainer (rank {rank})"
    )
    trainer = None
    started_at = clock_origin(os.environ)
    try:
        trainer = Trainer(load_settings(args.settings), started_at=started_at)
        trainer.setup()
        end = trainer.run()
        if end["event"] == "paused" and not os.environ.get("TORCHELASTIC_RUN_ID"):
            return EXIT_PAUSED
        return 0
    except TrainerError as exc:
        print(f"{who}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        print(f"{who}: error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if trainer is not None:
            trainer.close()


if __name__ == "__main__":
    sys.exit(main())
