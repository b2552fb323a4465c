"""Benchmark: the same tiny run as a Slurm job (the sbatch script `labctl train --backend slurm`
writes, submitted to a real one-node Slurm) against plain torchrun of the same trainer command.

What Slurm adds: scheduling, the job step (srun), the interface decided at start, and the
agent zip on PYTHONPATH; what it should not change: the step rate. Both runs are one CPU
process of the reference trainer with the same settings (a fresh checkpoint folder each),
alternating, several rounds. Reported (medians over the rounds): wall time from submit (or
start) to the end, rank 0's time per step after the first ten, and the ratios.

Needs root and Debian's slurm-wlm + munge (the cluster is started and stopped here, like the tests).

    .venv/bin/python bench/slurm_launch.py            # updates docs/benchmarks.md
    .venv/bin/python bench/slurm_launch.py --no-write
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MARK_BEGIN = "<!-- bench:slurm_launch:begin -->"
MARK_END = "<!-- bench:slurm_launch:end -->"

sys.path.insert(0, str(REPO))  # run as a script: make `bench` and `tests` importable
from bench.common import machine, publish, run  # noqa: E402
from tests import k8s_pod_run, slurm_cluster  # noqa: E402

STEPS = 1000
PHASES = f"""\
name: bench
defaults:
  steps: {STEPS}
  seq_len: 16
  model: {{vocab: 256, d_model: 32, n_layers: 1, n_heads: 2, d_ff: 64}}
  checkpoint_every: 50
  log_every: 1
  batch_size_per_gpu: 4
  checkpoint_dir: CKPT/phase{{phase}}
phases:
  1: {{}}
"""


def write_job(folder: Path) -> Path:
    inv = folder / "inv.yaml"
    inv.write_text(
        f"lab: b\nhosts:\n  here: {{address: 127.0.0.1, connection: local, python: {sys.executable}, roles: [train]}}\n"
    )
    phases = folder / "phases.yaml"
    phases.write_text(PHASES.replace("CKPT", str(folder / "ckpt")))
    out = folder / "job"
    run([sys.executable, "-m", "labctl", "-i", str(inv), "train", "-f", str(phases), "--phase", "1",
         "--device", "cpu", "--backend", "slurm", "-o", str(out)])  # fmt: skip
    return out


def step_seconds(events: list[dict[str, Any]]) -> float:
    """Rank 0's mean seconds per step after the first ten (a step event's `seconds` counts from
    the trainer's start, in whole milliseconds: one step is about that long here)."""
    steps = [e for e in events if e["event"] == "step" and e["step"] >= 10]
    first, last = steps[0], steps[-1]
    return float(last["seconds"] - first["seconds"]) / (last["step"] - first["step"])


def slurm_version() -> str:
    # `sinfo --version` wants a configuration to read even for that; the package says it without.
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "slurm-wlm"], capture_output=True, text=True, timeout=10
    ).stdout.strip()
    return f"slurm-wlm {out}" if out else "slurm-wlm"


def metrics(job: Path) -> list[dict[str, Any]]:
    [path] = job.glob("labctl-runs/*/metrics.jsonl")
    return k8s_pod_run.events(path)


def under_slurm(job: Path, env: dict[str, str]) -> tuple[float, float]:
    shutil.rmtree(job / "labctl-runs", ignore_errors=True)
    shutil.rmtree(job.parent / "ckpt", ignore_errors=True)
    [script] = job.glob("*.sbatch")
    start = time.perf_counter()
    proc = subprocess.run(
        ["sbatch", "--parsable", f"--export=ALL,PYTHON={sys.executable}", script.name],
        cwd=job, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    job_id = proc.stdout.strip().split(";")[0]
    state = slurm_cluster.wait_for(job_id, env, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=600)
    wall = time.perf_counter() - start
    if state != "COMPLETED":
        raise SystemExit(f"the Slurm job ended {state}")
    return wall, step_seconds(metrics(job))


def plain_torchrun(job: Path) -> tuple[float, float]:
    """The script's own torchrun command, without Slurm: one node, the same trainer and settings."""
    shutil.rmtree(job / "labctl-runs", ignore_errors=True)
    shutil.rmtree(job.parent / "ckpt", ignore_errors=True)
    [script] = job.glob("*.sbatch")
    text = script.read_text()
    entry = shlex.split(text[text.index("-m labctl.agent.train.trainer") :].splitlines()[0])
    [agent] = job.glob("*.pyz")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", *entry]
    env = {"PYTHONPATH": str(agent), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2"}
    start = time.perf_counter()
    subprocess.run(cmd, cwd=job, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, step_seconds(metrics(job))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    why = slurm_cluster.missing()
    if why:
        raise SystemExit(f"cannot run: {why}")
    folder = Path(tempfile.mkdtemp(prefix="labctl-bench-slurm-"))
    rows: dict[str, list[tuple[float, float]]] = {"slurm": [], "torchrun": []}
    try:
        job = write_job(folder)
        with slurm_cluster.one_node_cluster() as env:
            for i in range(args.rounds):
                order = ("slurm", "torchrun") if i % 2 == 0 else ("torchrun", "slurm")
                for name in order:
                    rows[name].append(under_slurm(job, env) if name == "slurm" else plain_torchrun(job))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    wall = {k: statistics.median(w for w, _ in v) for k, v in rows.items()}
    step = {k: statistics.median(s for _, s in v) for k, v in rows.items()}
    result = {"machine": machine(), "steps": STEPS, "rounds": args.rounds, "wall_s": wall, "step_s": step}
    md = "\n".join(
        [
            MARK_BEGIN,
            "## `train --backend slurm`: the sbatch job on a real one-node Slurm, against plain torchrun",
            "",
            f"`bench/slurm_launch.py` on {machine()}: one CPU process of the reference trainer, {STEPS} steps of a tiny "
            f"model, median of {args.rounds} alternating rounds. Slurm: Debian's {slurm_version()}, one node "
            "started by the benchmark; the job is the script `labctl train --backend slurm` writes, submitted with sbatch.",
            "",
            "| run | submit/start to end | rank 0 time per step (after step 10) |",
            "| --- | --- | --- |",
            f"| sbatch (labctl's script) | {wall['slurm']:.2f} s | {step['slurm'] * 1000:.1f} ms |",
            f"| plain torchrun, same command | {wall['torchrun']:.2f} s | {step['torchrun'] * 1000:.1f} ms |",
            f"| ratio | {wall['slurm'] / wall['torchrun']:.2f} (+{wall['slurm'] - wall['torchrun']:.2f} s) | "
            f"{step['slurm'] / step['torchrun']:.3f} |",
            "",
            "The difference in wall time is Slurm's: the scheduler's pass, the batch step and srun's job step. "
            f"Per step the job ran {abs(step['slurm'] / step['torchrun'] - 1) * 100:.1f}% "
            f"{'slower' if step['slurm'] > step['torchrun'] else 'faster'} than plain torchrun (one process, "
            "the same threads: Slurm's confinement is the only difference).",
            MARK_END,
        ]
    )
    out = None if args.no_write else REPO / "docs" / "benchmarks.md"
    publish(result, md, REPO / ".labctl" / "bench" / "slurm_launch.json", out, MARK_BEGIN, MARK_END)


if __name__ == "__main__":
    main()
