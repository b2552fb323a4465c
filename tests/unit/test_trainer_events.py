"""The reference trainer's step events: grad_norm, and TensorBoard event files beside metrics.jsonl.

Real torch on the CPU with a tiny tinylm; TensorBoard is read back with its own EventAccumulator.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from labctl.agent.models.tinylm import build_model  # noqa: E402
from labctl.agent.train.corpus import Corpus  # noqa: E402
from labctl.agent.train.settings import resolve_settings  # noqa: E402
from labctl.agent.train.trainer import Trainer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY = {"vocab": 256, "d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 128}


def settings(tmp_path: Path, **over: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "run_id": "t",
        "steps": 6,
        "batch_size": 8,
        "seq_len": 32,
        "model": dict(TINY),
        "warmup_steps": 2,
        "grad_clip": 1.0,
        "checkpoint_dir": None,
        "metrics_path": str(tmp_path / "run" / "metrics.jsonl"),
        "log_every": 2,
        "seed": 0,
    }
    s.update(over)
    return s


def run_inproc(s: dict[str, Any]) -> list[dict[str, Any]]:
    out = io.StringIO()
    t = Trainer(s, out=out, environ={})
    try:
        t.setup()
        t.run()
    finally:
        t.close()
    return [json.loads(line) for line in out.getvalue().splitlines()]


def first_step_grad_norm(s: dict[str, Any]) -> float:
    """Step 1's total gradient norm, computed here from scratch the way the trainer trains."""
    r = resolve_settings(s)
    torch.manual_seed(r["seed"])
    model = build_model(r["model_config"])
    corpus = Corpus(r["seed"], r["model_config"]["vocab"], r["seq_len"])
    x, y = corpus.batch(1, 0, 0, 1, r["batch_size"], 1)
    logits = model(x)
    torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1)).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


@pytest.mark.parametrize("grad_clip", [1e-3, None], ids=["clipped", "no_clip"])
def test_step_events_carry_the_gradient_norm_before_clipping(tmp_path: Path, grad_clip: Any) -> None:
    s = settings(tmp_path, grad_clip=grad_clip, log_every=1, steps=3)
    steps = [e for e in run_inproc(s) if e["event"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3]
    expected = first_step_grad_norm(s)
    assert steps[0]["grad_norm"] == pytest.approx(expected, rel=1e-4)
    if grad_clip:
        # Before clipping: every norm is far above the clip threshold it was clipped to.
        assert all(e["grad_norm"] > 100 * grad_clip for e in steps)


def test_unlogged_steps_without_clipping_still_log_a_norm(tmp_path: Path) -> None:
    s = settings(tmp_path, grad_clip=None, log_every=4, steps=6)
    steps = [e for e in run_inproc(s) if e["event"] == "step"]
    assert [e["step"] for e in steps] == [4, 6]
    assert all(isinstance(e["grad_norm"], float) and e["grad_norm"] > 0 for e in steps)


def test_tensorboard_event_files_hold_the_metrics_jsonl_values(tmp_path: Path) -> None:
    pytest.importorskip(
        "tensorboard", reason="tensorboard is not installed (pip install -e '.[tensorboard]')"
    )
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    s = settings(tmp_path)
    events = run_inproc(s)
    metrics = [json.loads(line) for line in Path(s["metrics_path"]).read_text().splitlines()]
    assert metrics == events
    tb_dir = tmp_path / "run" / "tensorboard"
    assert events[0]["tensorboard"] == str(tb_dir)
    assert [n for n in os.listdir(tb_dir) if n.startswith("events.out.tfevents.")]
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    steps = [e for e in metrics if e["event"] == "step"]
    assert [e["step"] for e in steps] == [2, 4, 6]
    for key in ("loss", "lr", "tokens_per_s", "grad_norm"):
        scalars = acc.Scalars(f"train/{key}")
        assert [sc.step for sc in scalars] == [e["step"] for e in steps], key
        # TensorBoard keeps scalars as float32: the same numbers at that precision.
        want = [float(torch.tensor(e[key], dtype=torch.float32)) for e in steps]
        assert [sc.value for sc in scalars] == want, key


# Importing tensorboard fails with sys.argv[2]: ModuleNotFoundError as on a host without the
# package, RuntimeError as from a broken install.
NO_TENSORBOARD = """
import builtins, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'tensorboard':
            raise getattr(builtins, sys.argv[2])('no ' + name + ' on this host')
sys.meta_path.insert(0, Block())
from labctl.agent.train.trainer import main
sys.exit(main(['--settings', sys.argv[1]]))
"""


@pytest.mark.parametrize("failure", ["ModuleNotFoundError", "RuntimeError"])
def test_without_tensorboard_blocked_import_the_run_writes_what_it_always_did(
    tmp_path: Path, failure: str
) -> None:
    s = settings(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(key, None)
    proc = subprocess.run(
        [sys.executable, "-c", NO_TENSORBOARD, json.dumps(s), failure],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [e["event"] for e in events] == ["start", "step", "step", "step", "done"]
    assert "tensorboard" not in events[0]
    notes = events[0].get("notes", [])
    if failure == "RuntimeError":
        # The CPU's mixed-precision note, then why there are no event files.
        assert notes[-1].startswith("tensorboard is installed but does not import (RuntimeError: no ")
    else:
        assert not [n for n in notes if "tensorboard" in n]
    assert Path(s["metrics_path"]).read_text() == proc.stdout
    assert os.listdir(tmp_path / "run") == ["metrics.jsonl"]
