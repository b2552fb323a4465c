"""Benchmark: one orchestra cycle (every warm model answers one prompt), asked at once by the
trainer's client against the same models asked one after another, in the same run.

k real model-server processes (labctl's own server, tinylm checkpoints, the CPU) on this
machine, each held to one thread as a model on its own GPU would compute alone; the two ways
alternate for each k, so load on the machine falls on both alike. The seed's "cycle of ~15 s for
5 model responses" is the one-after-another way: the sum of the latencies. Asked at once, the
cycle's floor is the slowest model's latency; on a machine with fewer cores than servers the
servers share the cores and the cycle sits above that floor, which the table shows.

    .venv/bin/python bench/orchestra_cycle.py --out docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MARK_BEGIN = "<!-- bench:orchestra_cycle:begin -->"
MARK_END = "<!-- bench:orchestra_cycle:end -->"
PROMPT = "def add(a, b):"

sys.path.insert(0, str(REPO))  # run as a script: make the `bench` package importable
from bench.common import machine, publish  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"a model server ended with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"the model server on port {port} never became ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=3, help="the largest k (servers started)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, help="markdown file whose section to update")
    parser.add_argument("--json", type=Path, default=REPO / ".labctl/bench/orchestra_cycle.json")
    args = parser.parse_args()
    from labctl.agent.modelload.modelgen import make_model
    from labctl.agent.models.tinylm import make_config
    from labctl.agent.orchestra.client import Endpoint, ask_all, complete

    config = make_config(vocab=256, d_model=128, n_layers=4, n_heads=4, d_ff=512, max_seq=128)
    procs: list[subprocess.Popen[bytes]] = []
    rows: list[dict[str, Any]] = []
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="labctl-bench-cycle-") as tmp:
        try:
            endpoints = []
            ports = []
            for i in range(args.models):
                folder = Path(tmp) / f"m{i}"
                make_model(str(folder), 0, seed=i, config=config)
                port = free_port()
                argv = [sys.executable, "-m", "labctl.agent.orchestra.server", "--model-dir", str(folder),
                        "--port", str(port), "--name", f"m{i}", "--device", "cpu"]  # fmt: skip
                procs.append(subprocess.Popen(argv, cwd=REPO, env=env, stderr=subprocess.DEVNULL))
                endpoints.append(Endpoint(f"m{i}", f"http://127.0.0.1:{port}/v1"))
                ports.append(port)
            for port, proc in zip(ports, procs, strict=True):
                wait_ready(port, proc)
            for k in range(1, args.models + 1):
                eps = endpoints[:k]

                def one_by_one(eps: list[Endpoint] = eps) -> tuple[float, float]:
                    start = time.perf_counter()
                    answers = [complete(e, PROMPT, args.max_tokens) for e in eps]
                    assert all(a.ok for a in answers), answers
                    return time.perf_counter() - start, max(a.latency_s for a in answers)

                def at_once(eps: list[Endpoint] = eps) -> tuple[float, float]:
                    start = time.perf_counter()
                    answers = ask_all(eps, PROMPT, args.max_tokens)
                    assert all(a.ok and not a.retried for a in answers), answers
                    return time.perf_counter() - start, max(a.latency_s for a in answers)

                one_by_one(), at_once()  # warm-up
                seq: list[tuple[float, float]] = []
                par: list[tuple[float, float]] = []
                for _ in range(args.runs):
                    seq.append(one_by_one())
                    par.append(at_once())
                rows.append(
                    {
                        "k": k,
                        "one_by_one_s": statistics.median(s for s, _ in seq),
                        "slowest_alone_s": statistics.median(m for _, m in seq),
                        "at_once_s": statistics.median(s for s, _ in par),
                    }
                )
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(60)
    lines = [
        MARK_BEGIN,
        "## Phase 3's orchestra cycle: every warm model asked at once (`bench/orchestra_cycle.py`)",
        "",
        f"Machine: {machine()}. k labctl model servers (tinylm, d_model 128, 4 layers, the CPU, one "
        f"thread each), {args.max_tokens} tokens per answer, median of {args.runs} cycles, the two ways "
        "alternating. The floor for asking at once is the slowest model's own latency (measured "
        "in the one-after-another cycles, where each model runs alone).",
        "",
        "| k models | one after another (s) | at once, `ask_all` (s) | slowest model alone (s) | speed-up |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['k']} | {r['one_by_one_s']:.3f} | {r['at_once_s']:.3f} | {r['slowest_alone_s']:.3f} | "
            f"{r['one_by_one_s'] / r['at_once_s']:.2f}x |"
        )
    lines += [
        "",
        f"This machine has {os.cpu_count()} cores: past that many servers they share cores, and the cycle "
        "asked at once rises above the slowest model's latency. On the lab's GPUs each warm model "
        "computes on its own card.",
        MARK_END,
    ]
    publish({"machine": machine(), "runs": args.runs, "rows": rows}, "\n".join(lines), args.json, args.out,
            MARK_BEGIN, MARK_END)  # fmt: skip


if __name__ == "__main__":
    main()
