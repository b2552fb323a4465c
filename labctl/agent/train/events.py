"""Where rank 0's events go: JSON lines on stdout and in metrics_path, TensorBoard scalars beside it,
phase 3's samples (what a model wrote and how it ran) in samples.jsonl beside it.

TensorBoard is optional (the `tensorboard` extra): where torch.utils.tensorboard cannot be
imported the trainer writes exactly what it wrote before, and nothing fails.
Python 3.8 syntax and no torch at import, like the rest of the agent package.
"""

from __future__ import annotations

import json
import math
import os
from typing import IO, Any, Dict, Optional, Tuple

# The step event's numbers TensorBoard shows, under these tags.
SCALARS = (
    ("loss", "train/loss"),
    ("lr", "train/lr"),
    ("tokens_per_s", "train/tokens_per_s"),
    ("grad_norm", "train/grad_norm"),
    ("reward", "phase3/reward"),
    ("exec_success_rate", "phase3/exec_success_rate"),
    ("rotation_wait_s", "phase3/rotation_wait_s"),
    ("policy_loss", "phase3/policy_loss"),
)
SAMPLES_FILE = "samples.jsonl"  # beside metrics.jsonl: phase 3's sample per step
TENSORBOARD_DIR = "tensorboard"  # beside metrics.jsonl, so one `tensorboard --logdir RUNS` sees every run
FLUSH_SECONDS = 10  # a watching TensorBoard lags the run by at most this


def tensorboard_writer_class() -> Tuple[Any, Optional[str]]:
    """torch's SummaryWriter (None where it or the tensorboard package is missing), and why not if broken."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None, None
    except Exception as exc:
        # A broken install (say a protobuf it cannot load) costs the TensorBoard files, not the run.
        return (
            None,
            f"tensorboard is installed but does not import ({type(exc).__name__}: {exc}): no event files",
        )
    return SummaryWriter, None


class EventLog:
    """Rank 0's events; every other rank's EventLog writes nothing."""

    def __init__(self, out: IO[str], active: bool) -> None:
        self.out = out
        self.active = active
        self.metrics: Optional[IO[str]] = None
        self.tensorboard: Any = None
        self.tensorboard_dir: Optional[str] = None
        self.note: Optional[str] = None  # for the start event's notes
        self.samples_path: Optional[str] = None

    def open(self, metrics_path: Optional[str]) -> None:
        """Open metrics_path for appending and, where TensorBoard is importable, an event file beside it."""
        if not metrics_path or not self.active:
            return
        parent = os.path.dirname(os.path.abspath(metrics_path))
        os.makedirs(parent, exist_ok=True)
        self.metrics = open(metrics_path, "a")  # noqa: SIM115 (open for the whole run, closed by close())
        self.samples_path = os.path.join(parent, SAMPLES_FILE)
        writer, self.note = tensorboard_writer_class()
        if writer is not None:
            self.tensorboard_dir = os.path.join(parent, TENSORBOARD_DIR)
            # A restarted or resumed run adds its own event file here; TensorBoard merges them by step.
            self.tensorboard = writer(log_dir=self.tensorboard_dir, flush_secs=FLUSH_SECONDS)

    def write(self, event: Dict[str, Any]) -> None:
        if not self.active:
            return
        line = json.dumps(event) + "\n"
        self.out.write(line)
        self.out.flush()
        if self.metrics is not None:
            self.metrics.write(line)
            self.metrics.flush()
        if self.tensorboard is not None and event.get("event") == "step":
            for key, tag in SCALARS:
                value = event.get(key)
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.tensorboard.add_scalar(tag, value, global_step=event["step"])
            for model, ms in (event.get("orchestra_ms") or {}).items():
                for q in ("p50", "p95"):
                    self.tensorboard.add_scalar(
                        f"phase3/latency_{q}_ms/{model}", ms[q], global_step=event["step"]
                    )

    def sample(self, sample: Dict[str, Any]) -> None:
        """A phase-3 sample: a {"event": "sample"} line on stdout (the controller keeps it in the
        run's samples.jsonl) and in samples.jsonl beside metrics_path, never in metrics.jsonl: a
        sample is kilobytes, and what reads the metrics reads numbers."""
        if not self.active:
            return
        line = json.dumps({"event": "sample", **sample}) + "\n"
        self.out.write(line)
        self.out.flush()
        if self.samples_path is not None:
            with open(self.samples_path, "a") as f:
                f.write(line)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
