"""The reference trainer that `labctl train` launches under torchrun: tinylm on a synthetic corpus.

    python -m labctl.agent.train.trainer --settings '{"steps": 200, ...}'
    python -m labctl.agent.train.trainer --settings @settings.json
    python -m torch.distributed.run --nproc-per-node=2 ... -m labctl.agent.train.trainer --settings ...

Without torchrun's environment (or with WORLD_SIZE 1) it is one process: no process group, no
DDP. With WORLD_SIZE > 1 it joins the process group (nccl on CUDA, gloo on the CPU or when
LABCTL_TRAIN_DEVICE=cpu) and trains a DDP-wrapped model.

Rank 0 prints one JSON object per line on stdout, each with an "event" key: "start", "step"
(every `log_every` steps and on the last; in phase 3 with the loop's figures, phase3.Window),
"checkpoint", "batch_resize", and "done" or, when
`time_limit` ended the run before its last step, "paused" (limit.py), and
appends the same lines to `metrics_path`; where TensorBoard is installed it also writes the
step events' scalars to event files beside it (events.py). Other ranks print nothing
on stdout. A failure is one line on stderr ("labctl trainer: error: ...") and a non-zero exit;
a TrainerError is fatal (fatal.py): exit 2, and under labctl a "fatal" event and no torchrun restart.
A paused run exits EXIT_PAUSED (75) alone and 0 under torchrun, which would take a non-zero
exit for a failure and restart the workers.

This module is the entry point: main() and the whole run (`Trainer.run`). The trainer is one
class in layers: setup.py starts a worker (device, process group, precision, model, optimizer,
resume), loop.py trains it step by step and writes its checkpoints, metrics.py holds the event
log and the step events' figures; settings.py holds the settings and their checks.

Like the rest of the agent package this module imports without torch (torch is imported
inside functions) and keeps to Python 3.8 syntax.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Any, Dict, List, Optional

from . import fatal
from .limit import clock_origin
from .loop import StepLoop
from .settings import EXIT_PAUSED, TrainerError, load_settings

__all__ = ["Trainer", "main"]


class Trainer(StepLoop):
    """One worker's training: setup() once, then run() (or train_steps() for a benchmark)."""

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
        if self.phase3 is not None:
            event["rl"] = dict(self.s["rl"], tasks=len(self.phase3.tasks))
        if self.metrics.events.tensorboard_dir is not None:
            event["tensorboard"] = self.metrics.events.tensorboard_dir
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
            "loss": self.metrics.last_loss,
            "seconds": self.metrics.seconds(),
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
            "loss": self.metrics.last_loss,
            "restart": self.restart,
        }
        self.emit(paused)
        if self.env.distributed:
            self._barrier()
        return paused

    def close(self) -> None:
        self.metrics.events.close()
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
        # Every attempt would fail the same way: no restart, and the reason is what the user reads.
        return fatal.end_run(str(exc), who)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        print(f"{who}: error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if trainer is not None:
            trainer.close()


if __name__ == "__main__":
    sys.exit(main())
