"""A cloud session's output for the ckpt tests, made here by the real reference trainer on the CPU."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

TINY = {"vocab": 256, "d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 128}


def session(out: Path, run_id: str = "kaggle-1", settings_file: bool = True) -> Path:
    """What a cloud session leaves: checkpoints in working/checkpoints, its settings beside them."""
    torch = pytest.importorskip("torch")
    from labctl.agent.train.settings import DEFAULTS
    from labctl.agent.train.trainer import Trainer

    working = out / "working"
    s: dict[str, Any] = dict(DEFAULTS)
    s.update(
        run_id=run_id,
        steps=4,
        batch_size=4,
        seq_len=16,
        model=dict(TINY),
        warmup_steps=1,
        mixed_precision=False,
        checkpoint_dir=str(working / "checkpoints"),
        checkpoint_every=2,
        log_every=10,
    )
    torch.manual_seed(0)
    t = Trainer(s, out=io.StringIO(), environ={})
    try:
        t.setup()
        t.run()
    finally:
        t.close()
    if settings_file:
        (working / "settings.json").write_text(json.dumps(s))
    return working
