"""Benchmark: the reference trainer's step loop against a plain PyTorch loop (CPU, one process).

Both train the same tinylm (same initial weights) on the same synthetic batches with AdamW,
in the same process:

- trainer: `labctl.agent.train.trainer.Trainer.train_steps`, the loop `labctl train` runs: lr
  schedule, loss accumulation on the device, the DDP/autocast hooks (inactive here), the
  OOM-retry wrapper, a logging step every `--log-every` steps (`.item()`, JSON to /dev/null);
- plain: `loss = F.cross_entropy(model(x), y); loss.backward(); opt.step(); opt.zero_grad()`.

No checkpoint is written in the timed windows and gradient clipping and EMA are off, so the
two do the same arithmetic and the difference is the trainer's bookkeeping. Each round times
`--steps` steps of each, the order alternating every round, after an untimed warm-up of
both; reported: median seconds per window and the median of the per-round ratios.

    .venv/bin/python bench/train_overhead.py            # updates docs/benchmarks.md
    .venv/bin/python bench/train_overhead.py --no-write
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MARK_BEGIN = "<!-- bench:train_overhead:begin -->"
MARK_END = "<!-- bench:train_overhead:end -->"
TARGET_PCT = 3.0

sys.path.insert(0, str(REPO))  # run as a script: make `bench` and `labctl` importable
from bench.common import machine, publish  # noqa: E402
from labctl.agent.models.tinylm import build_model  # noqa: E402
from labctl.agent.train.corpus import Corpus  # noqa: E402
from labctl.agent.train.trainer import Trainer  # noqa: E402

# About 90 ms a step on the 2-core VM: long enough that timer and scheduler noise is small.
MODEL = {"vocab": 256, "d_model": 256, "n_layers": 4, "n_heads": 4, "d_ff": 1024}
SEQ_LEN = 128
BATCH = 4


def bench_settings(log_every: int) -> dict[str, Any]:
    return {
        "run_id": "bench",
        "steps": 1_000_000,  # never the last step: no final checkpoint or lr floor in the window
        "batch_size": BATCH,
        "accumulation_steps": 1,
        "seq_len": SEQ_LEN,
        "model": dict(MODEL),
        "lr": 1e-3,
        "warmup_steps": 0,  # with 1M steps the cosine keeps lr at 1e-3 here, as in the plain loop
        "weight_decay": 0.01,
        "grad_clip": None,
        "mixed_precision": False,
        "ema": False,
        "dynamic_batch_sizing": False,
        "checkpoint_dir": None,
        "checkpoint_every": 0,
        "metrics_path": None,
        "log_every": log_every,
        "seed": 0,
    }


def make_plain(torch: Any, trainer: Trainer) -> tuple[Callable[[int, int], None], Any]:
    """The plain loop (and its model), on a copy of the trainer's initial weights and data."""
    from torch.nn import functional as F

    model = build_model(trainer.model_config)
    model.load_state_dict(trainer.module.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    corpus = Corpus(0, MODEL["vocab"], SEQ_LEN)
    vocab = MODEL["vocab"]

    def plain(first: int, last: int) -> None:
        for step in range(first, last + 1):
            x, y = corpus.batch(step, 0, 0, 1, BATCH, 1)
            loss = F.cross_entropy(model(x).view(-1, vocab), y.reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    return plain, model


def same_training(torch: Any, trainer: Trainer, plain_model: Any) -> dict[str, float]:
    """Both models' loss on one held-out batch: equal (to rounding) only if both loops did the same."""
    from torch.nn import functional as F

    x, y = Corpus(1, MODEL["vocab"], SEQ_LEN).batch(0, 0, 0, 1, 16, 1)
    with torch.no_grad():
        out = {
            name: F.cross_entropy(m(x).view(-1, MODEL["vocab"]), y.reshape(-1)).item()
            for name, m in (("trainer", trainer.module), ("plain", plain_model))
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=11, help="timed rounds (each: both loops)")
    ap.add_argument("--steps", type=int, default=20, help="steps per timed window")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps of each loop first")
    ap.add_argument("--log-every", type=int, default=10, help="the trainer's logging interval")
    ap.add_argument("--out", type=Path, default=REPO / "docs/benchmarks.md", help="markdown file to update")
    ap.add_argument("--json", type=Path, default=REPO / "bench/out/train_overhead.json")
    ap.add_argument("--no-write", action="store_true", help="print the result, leave the markdown alone")
    args = ap.parse_args()

    import torch

    devnull = open(os.devnull, "w")  # noqa: SIM115 (the trainer's stdout for the whole run)
    trainer = Trainer(bench_settings(args.log_every), out=devnull, environ={})
    trainer.setup()
    plain, plain_model = make_plain(torch, trainer)
    contenders: dict[str, Callable[[int, int], Any]] = {"trainer": trainer.train_steps, "plain": plain}
    next_step = dict.fromkeys(contenders, 1)

    def window(name: str, n: int) -> float:
        first = next_step[name]
        next_step[name] += n
        gc.collect()
        start = time.perf_counter()
        contenders[name](first, first + n - 1)
        return time.perf_counter() - start

    for name in contenders:
        window(name, args.warmup)
    check = same_training(torch, trainer, plain_model)
    # The plain loop decays the norms' weights too (one AdamW group); a few steps barely differ.
    if abs(check["trainer"] - check["plain"]) > 1e-3 * check["plain"]:
        raise SystemExit(f"the two loops trained differently: held-out losses {check}")
    times: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for rep in range(args.reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            times[name].append(window(name, args.steps))
    trainer.close()
    devnull.close()

    tokens = BATCH * SEQ_LEN * args.steps
    rows = []
    for name in names:
        s = statistics.median(times[name])
        rows.append(
            {
                "name": name,
                "seconds": s,
                "steps_per_s": args.steps / s,
                "tokens_per_s": tokens / s,
                "best_seconds": min(times[name]),
            }
        )
        print(f"{name:8s} {s:.3f} s / {args.steps} steps  {args.steps / s:6.2f} steps/s", file=sys.stderr)
    ratios = [t / p for t, p in zip(times["trainer"], times["plain"], strict=True)]
    overhead = (statistics.median(times["trainer"]) / statistics.median(times["plain"]) - 1) * 100
    paired = (statistics.median(ratios) - 1) * 100
    result = {
        "machine": machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d"),
        "model": MODEL,
        "params": sum(p.numel() for p in trainer.params),
        "seq_len": SEQ_LEN,
        "batch": BATCH,
        "steps": args.steps,
        "reps": args.reps,
        "warmup": args.warmup,
        "log_every": args.log_every,
        "held_out_loss_after_warmup": check,
        "rows": rows,
        "overhead_pct": overhead,
        "paired_overhead_pct": paired,
        "paired_ratios": ratios,
        "runs_seconds": times,
    }
    publish(result, render(result), args.json, None if args.no_write else args.out, MARK_BEGIN, MARK_END)
    return 0


def render(r: dict[str, Any]) -> str:
    m = r["model"]
    met = max(r["overhead_pct"], r["paired_overhead_pct"]) <= TARGET_PCT
    lines = [
        MARK_BEGIN,
        "## The reference trainer's step loop against a plain PyTorch loop (CPU)",
        "",
        f"Machine: {r['machine']}, Python {r['python']}, torch {r['torch']} ({r['threads']} threads), "
        f"{r['date']}. One process, fp32. tinylm d_model {m['d_model']}, {m['n_layers']} layers, "
        f"{m['n_heads']} heads, d_ff {m['d_ff']}, vocab {m['vocab']} ({r['params'] / 1e6:.2f} M parameters), "
        f"batch {r['batch']} x {r['seq_len']} tokens, AdamW, the same initial weights and the same synthetic "
        f"batches for both. Windows of {r['steps']} steps after {r['warmup']} untimed, {r['reps']} rounds, "
        "order alternating; the trainer logs (loss `.item()`, a JSON line) every "
        f"{r['log_every']} steps; no checkpoints, clipping or EMA in the window. "
        "Command: `.venv/bin/python bench/train_overhead.py`.",
        "",
        "| loop | seconds / window (median) | steps/s | tokens/s | best window |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['name']} | {row['seconds']:.3f} s | {row['steps_per_s']:.2f} | {row['tokens_per_s']:.0f} "
            f"| {row['best_seconds']:.3f} s |"
        )
    lines += [
        "",
        f"Overhead of the trainer: {r['overhead_pct']:+.1f}% (ratio of the medians), "
        f"{r['paired_overhead_pct']:+.1f}% (median of the per-round ratios, which cancels drift between "
        f"rounds). Target: at most {TARGET_PCT:.0f}%: {'met' if met else 'not met'}. Both loops train the "
        f"same model on the same data: after the warm-up a held-out batch's loss is "
        f"{r['held_out_loss_after_warmup']['trainer']:.5f} (trainer) and "
        f"{r['held_out_loss_after_warmup']['plain']:.5f} (plain).",
        MARK_END,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
