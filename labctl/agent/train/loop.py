"""The reference trainer's step loop: each optimizer step (micro-batches, gradient clipping,
the EMA), its retry on a CUDA OOM, the step events, the time limit's stop decision, and the
checkpoints it writes (`StepLoop.train_steps`, on top of setup.py's `TrainerSetup`).

In phase 3 a step's tries (phase3.py: the contexts, the models' answers, the sandbox's verdicts,
the advantages) are made once, before the step's first attempt: a retry after a CUDA OOM
trains on the same rows, never asking the models or moving the baselines again.

Like the rest of the agent package this module imports without torch (torch is imported
inside functions) and keeps to Python 3.8 syntax.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Dict, Optional

from .ckpt import FORMAT
from .limit import check_interval, checkpoint_estimate, should_stop
from .phase3 import policy_loss, rl_batch, sample_context
from .settings import MIN_LR_RATIO, TrainerError, lr_factor
from .setup import TrainerSetup


def _is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.cuda.OutOfMemoryError)


class StepLoop(TrainerSetup):
    """Training from a set-up worker: train_steps(), the loop `labctl train` runs and a benchmark times."""

    def lr_at(self, step: int) -> float:
        return self.s["lr"] * lr_factor(step - 1, self.s["warmup_steps"], self.steps)

    def _train_step(self, step: int, rl: Any = None) -> Any:
        """One optimizer step; returns the on-device sum of its micro-batches' losses. `rl`:
        phase 3's rows for this step (_rl_rows), trained beside the last micro-batch."""
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
            # The contexts ride in the last micro-batch's forward: one forward per backward, as DDP wants.
            extra = rl if micro == acc - 1 else None
            # Gradients are all-reduced on the last micro-step only.
            sync = model.no_sync() if self.env.distributed and micro < acc - 1 else contextlib.nullcontext()
            with sync:
                with self._autocast():
                    if extra is None:
                        logits = model(x)
                    else:
                        both = model(torch.cat([x, extra[0]]))
                        logits, rl_logits = both[: x.shape[0]], both[x.shape[0] :]
                loss = F.cross_entropy(logits.float().view(-1, vocab), y.reshape(-1))
                scaled = loss / acc if acc > 1 else loss
                if extra is not None:
                    pg = policy_loss(rl_logits, extra[1], extra[2], self.s["rl"]["temperature"])
                    scaled = scaled + self.s["rl"]["weight"] * pg
                    self.phase3.window.policy_losses.append(float(pg.detach()))
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

    def _rl_rows(self, step: int) -> Any:
        """Phase 3's tries for this step (phase3.py), as rows to add to the forward, or None."""
        rl = self.s["rl"]

        def sample(prompt: Any, n: int) -> Any:
            return sample_context(
                self.module, prompt, n, rl["temperature"], self._rl_gen, self.device, self._autocast
            )

        rolls = self.phase3.rollouts(step, sample, self.seq_len)
        if self.phase3.sample is not None:
            self.metrics.sample(self.phase3.sample)
        return rl_batch(rolls, self.seq_len, self.device)

    def _step_with_retry(self, step: int) -> Any:
        # Phase 3: this step's tries, judged, before any gradient (the models and the sandbox
        # answer while nothing waits on the device), once: an OOM retry reuses them.
        rl = self._rl_rows(step) if self.phase3 is not None else None
        losses = len(self.phase3.window.policy_losses) if self.phase3 is not None else 0
        while True:
            try:
                return self._train_step(step, rl)
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
                if self.phase3 is not None:
                    del self.phase3.window.policy_losses[losses:]  # the failed attempt's, if any
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
        return self.metrics.last_loss

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
        extra = self.phase3.window.flush() if self.phase3 is not None else None
        self.metrics.step(step, loss, self.lr_at(step), self._grad_norm, self._tokens_per_step, extra)

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
        self.metrics.exclude(seconds)
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
