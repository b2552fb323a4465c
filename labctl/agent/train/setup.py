"""The reference trainer's start: one worker's device, process group, precision, model and
optimizer, the checkpoint it resumes from, and a micro-batch that fits (`TrainerSetup.setup`).

The trainer is one class in layers, one module each: `TrainerSetup` here, the step loop and its
checkpoints on top of it (loop.py), and the whole run with the command line (trainer.py); the
events it reports go through `Metrics` (metrics.py).

Like the rest of the agent package this module imports without torch (torch is imported
inside functions) and keeps to Python 3.8 syntax.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from typing import IO, Any, Dict, List, Mapping, Optional, Sequence

from .ckpt import FORMAT, CheckpointDir, choose_common, config_mismatch, pt_name
from .corpus import Corpus
from .limit import StepTimes
from .metrics import Metrics
from .settings import TrainerError, resolve_settings

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


class TrainerSetup:
    """One worker before its first step: settings resolved at once, the rest in setup()."""

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
        self.steps: int = self.s["steps"]
        self.batch_size: int = self.s["batch_size"]
        self.acc: int = self.s["accumulation_steps"]
        self.seq_len: int = self.s["seq_len"]
        self.log_every: int = self.s["log_every"]
        self.ckpt_every: int = self.s["checkpoint_every"]
        self.model_config: Dict[str, Any] = self.s["model_config"]
        self.restart = self.env.restart
        self.metrics = Metrics(self.out, self.is_rank0, self.steps, self.restart)
        self.ckdir: Optional[CheckpointDir] = (
            CheckpointDir(self.s["checkpoint_dir"]) if self.s["checkpoint_dir"] else None
        )
        self.pg_initialized = False
        self.backend: Optional[str] = None
        self.notes: List[str] = []
        self.resumed_from: Optional[int] = None
        self.skipped: List[Dict[str, Any]] = []
        self.step = 0  # optimizer steps completed
        self.hosts = 1
        self.time_limit: Optional[float] = self.s["time_limit"]
        self.started_at = time.monotonic() if started_at is None else started_at
        self.step_times = StepTimes()
        self.checkpoint_seconds: List[float] = []
        self.paused_at: Optional[int] = None
        self._next_check = 0  # the step after which rank 0 next decides (every rank knows it)
        self._ctl_group: Any = None  # the process group the stop decision travels on

    def emit(self, event: Dict[str, Any]) -> None:
        """A JSON line on stdout and in metrics_path (and TensorBoard scalars), from rank 0 only."""
        self.metrics.emit(event)

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

        from ..models.tinylm import build_model

        self.device = self._device()
        self._init_dist()
        cap = list(torch.cuda.get_device_capability(self.device)) if self.device.type == "cuda" else None
        infos = self.gather({"local_rank": self.env.local_rank, "capability": cap})
        self.hosts = sum(1 for i in infos if i["local_rank"] == 0)
        self._precision(infos)
        self.metrics.events.open(self.s["metrics_path"])
        if self.metrics.events.note:
            self.notes.append(self.metrics.events.note)

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
        self.phase3: Any = None
        if self.s["rl"] is not None:
            from .phase3 import Phase3

            self.phase3 = Phase3(self.s["rl"], self.env.rank, self.env.world_size, self._vocab)
            # The contexts' sampling: its own stream, so the corpus' batches stay what they were.
            self._rl_gen = torch.Generator().manual_seed(self.s["seed"] * 1000003 + self.env.rank)
        self.metrics.start_clock(self.step)

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

    def _autocast(self) -> Any:
        import torch

        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    @property
    def keeps_checkpoints(self) -> bool:
        """Whether this process writes and scans the checkpoint folder: every host's local rank 0,
        or rank 0 alone when the folder is shared by every node."""
        return self.env.rank == 0 if self.s["shared_checkpoints"] else self.env.local_rank == 0
