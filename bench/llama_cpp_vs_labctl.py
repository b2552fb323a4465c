"""Benchmark: llama.cpp's llama-server against transformers, on the CPU, on one tiny Llama.

The model is labctl's own (labctl/agent/modelload/hfgen.py: hidden 256, 4 layers, a byte-level
BPE of about 900 tokens, random weights from seed 0), written as a Hugging Face folder and as
GGUF files by labctl's converter (f32, f16, q8_0). In the same run, on the same cores:

- llama-server (built CPU-only from llama-cpp-python 0.3.36's pinned sources by the `llama_cpp`
  resource's host code, cached: tests/llama_cpp_build.py) serving each GGUF on 127.0.0.1, asked
  over HTTP (/completion, greedy, 128 tokens, end of text ignored);
- transformers `generate(do_sample=False, min_new_tokens=128)` on the Hugging Face folder, fp32.

Tokens/s is 128 over the wall time of one request (prompt included), median of --reps after one
warm-up; llama-server's own decode rate (its `timings`) is shown beside it. The f32 rows also say
whether both produced the same 128 tokens. labctl's own model server (labctl/agent/orchestra/
server.py, its own process as the orchestra starts it, asked over /v1/completions) serves the
Hugging Face folder in the same run: the same model as GGUF against HF. It stops at the end of
text where the model writes one, so its rate is its completion tokens over the wall time. The
build time is the cached build's, from its manifest (a run that had to build says so).

    .venv/bin/python bench/llama_cpp_vs_labctl.py [--reps 5] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MARK_BEGIN = "<!-- bench:llama_cpp_vs_labctl:begin -->"
MARK_END = "<!-- bench:llama_cpp_vs_labctl:end -->"
N_TOKENS = 128
PROMPT = "def fizzbuzz(n):\n    "

sys.path.insert(0, str(REPO))  # run as a script: make `bench`, `tests` and `labctl` importable
from bench.common import machine, publish  # noqa: E402
from tests.integration.test_llama_server import ALIAS, Server, http  # noqa: E402
from tests.llama_cpp_build import build as build_llama_server  # noqa: E402


def llama_rows(binary: Path, files: dict[str, Path], reps: int, threads: int, work: Path) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for ftype, gguf in files.items():
        start = time.perf_counter()
        server = Server(binary, gguf, work / f"server-{ftype}.log", threads=threads)
        try:
            server.wait_ready()
            ready_s = time.perf_counter() - start
            body = {"prompt": PROMPT, "n_predict": N_TOKENS, "temperature": 0, "ignore_eos": True}
            body["return_tokens"] = True
            http(server.url + "/completion", body)  # warm-up
            walls, decode, tokens = [], [], []
            for _ in range(reps):
                t0 = time.perf_counter()
                status, answer = http(server.url + "/completion", body, timeout=600)
                walls.append(time.perf_counter() - t0)
                assert status == 200 and answer["timings"]["predicted_n"] == N_TOKENS, answer
                decode.append(answer["timings"]["predicted_per_second"])
                tokens = answer["tokens"]
        finally:
            server.stop()
        rows[ftype] = {
            "file_bytes": gguf.stat().st_size,
            "ready_s": round(ready_s, 3),
            "tokens_per_s": round(N_TOKENS / statistics.median(walls), 1),
            "decode_tokens_per_s": round(statistics.median(decode), 1),
            "tokens": tokens,
        }
    return rows


def transformers_row(hf_dir: Path, reps: int, threads: int) -> dict[str, Any]:
    import torch
    import transformers

    torch.set_num_threads(threads)
    start = time.perf_counter()
    tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    ready_s = time.perf_counter() - start
    ids = torch.tensor([tok(PROMPT)["input_ids"]])

    def once() -> list[int]:
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=N_TOKENS, min_new_tokens=N_TOKENS, do_sample=False)
        return [int(t) for t in out[0, ids.shape[1] :]]

    once()  # warm-up
    walls = []
    tokens: list[int] = []
    for _ in range(reps):
        t0 = time.perf_counter()
        tokens = once()
        walls.append(time.perf_counter() - t0)
    return {
        "version": transformers.__version__,
        "torch": torch.__version__,
        "ready_s": round(ready_s, 3),
        "tokens_per_s": round(N_TOKENS / statistics.median(walls), 1),
        "tokens": tokens,
    }


def labctl_row(hf_dir: Path, reps: int, threads: int, work: Path) -> dict[str, Any]:
    """labctl's server on the HF folder, in a process of its own on 127.0.0.1, as the orchestra runs it."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS=str(threads))
    argv = [sys.executable, "-m", "labctl.agent.orchestra.server", "--model-dir", str(hf_dir)]
    argv += ["--port", str(port), "--name", ALIAS, "--device", "cpu", "--host", "127.0.0.1"]
    start = time.perf_counter()
    with open(work / "labctl-server.log", "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                status, doc = http(url + "/health", None, timeout=5)
            except OSError:
                status, doc = 0, {}
            if status == 200:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"labctl's server did not become ready: {(work / 'labctl-server.log').read_text()[-400:]}"
                )
            time.sleep(0.2)
        ready_s = time.perf_counter() - start
        body = {"model": ALIAS, "prompt": PROMPT, "max_tokens": N_TOKENS, "temperature": 0}
        http(url + "/v1/completions", body, timeout=600)  # warm-up
        rates, counts = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            status, answer = http(url + "/v1/completions", body, timeout=600)
            wall = time.perf_counter() - t0
            assert status == 200, answer
            n = int(answer["usage"]["completion_tokens"])
            rates.append(n / wall)
            counts.append(n)
        return {
            "ready_s": round(ready_s, 3),
            "tokens_per_s": round(statistics.median(rates), 1),
            "completion_tokens": counts[-1],
            "dtype": doc.get("dtype"),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def render(r: dict[str, Any]) -> str:
    m = r["model"]
    build = r["build"]
    lines = [
        MARK_BEGIN,
        "## llama.cpp's llama-server vs labctl's server vs transformers (CPU)",
        "",
        f"`bench/llama_cpp_vs_labctl.py` on {r['machine']}, {r['threads']} threads each. Model: labctl's tiny "
        f"Llama (hidden {m['hidden']}, {m['layers']} layers, {m['params'] / 1e6:.1f} M parameters, vocab "
        f"{m['vocab']}), {N_TOKENS} greedy tokens after a {r['prompt_tokens']}-token prompt, median of "
        f"{r['reps']} after a warm-up. llama-server: llama.cpp {(build['llama_cpp_commit'] or '?')[:7]} from "
        f"llama-cpp-python {build['version']}, built here CPU-only in {build['build_seconds']:.0f} s "
        f"({build['jobs']} jobs{', this run' if build['built_now'] else ', cached'}).",
        "",
        "| engine | weights | file | ready | tokens/s (request) | decode tokens/s | same tokens as transformers |",
        "|---|---|---|---|---|---|---|",
    ]
    t = r["transformers"]
    for ftype, row in r["llama_server"].items():
        same = "yes" if row["tokens"] == t["tokens"] else "no"
        lines.append(
            f"| llama-server | GGUF {ftype} | {row['file_bytes'] / 1e6:.1f} MB | {row['ready_s']:.2f} s | "
            f"{row['tokens_per_s']:.0f} | {row['decode_tokens_per_s']:.0f} | {same if ftype == 'f32' else '-'} |"
        )
    lines.append(
        f"| transformers {t['version']} (torch {t['torch']}) | safetensors fp32 | {m['file_bytes'] / 1e6:.1f} MB | "
        f"{t['ready_s']:.2f} s | {t['tokens_per_s']:.0f} | - | - |"
    )
    lab = r.get("labctl")
    if lab:
        lines.append(
            f"| labctl's server (HTTP, its own process) | safetensors {lab['dtype']} | {m['file_bytes'] / 1e6:.1f} MB | "
            f"{lab['ready_s']:.2f} s | {lab['tokens_per_s']:.0f} | - | - ({lab['completion_tokens']} tokens: it stops at end of text) |"
        )
    lines += ["", MARK_END]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=None, help="markdown file whose section to update")
    ap.add_argument("--json", type=Path, default=REPO / "bench/out/llama_cpp_vs_labctl.json")
    args = ap.parse_args()

    from labctl.agent.modelload.ggufgen import hf_to_gguf
    from labctl.agent.modelload.hfgen import make_hf_model

    t0 = time.perf_counter()
    built = build_llama_server()
    build = {**built["manifest"], "built_now": built["built"], "check_s": round(time.perf_counter() - t0, 1)}
    binary = Path(built["prefix"]) / "bin" / "llama-server"
    with tempfile.TemporaryDirectory(prefix="labctl-llama-bench-") as tmp:
        work = Path(tmp)
        hf_dir = work / "tiny-llama-256"
        info = make_hf_model(str(hf_dir), seed=0, hidden=256, layers=4)
        files = {
            ft: Path(hf_to_gguf(str(hf_dir), str(work / f"{ALIAS}-{ft}.gguf"), ft)["path"])
            for ft in ("f32", "f16", "q8_0")
        }
        from transformers import AutoTokenizer

        prompt_tokens = len(AutoTokenizer.from_pretrained(str(hf_dir))(PROMPT)["input_ids"])
        rows = llama_rows(binary, files, args.reps, args.threads, work)
        hf_row = transformers_row(hf_dir, args.reps, args.threads)
        lab_row = labctl_row(hf_dir, args.reps, args.threads, work)
        model = {
            "hidden": 256,
            "layers": 4,
            "params": info["params"],
            "vocab": info["vocab"],
            "file_bytes": (hf_dir / "model.safetensors").stat().st_size,
        }
    result = {
        "machine": machine(),
        "threads": args.threads,
        "reps": args.reps,
        "n_tokens": N_TOKENS,
        "prompt_tokens": prompt_tokens,
        "model": model,
        "build": {
            k: build.get(k)
            for k in ("version", "llama_cpp_commit", "build_seconds", "jobs", "built_now", "cmake_args")
        },
        "llama_server": rows,
        "transformers": hf_row,
        "labctl": lab_row,
        "time": time.time(),
    }
    publish(result, render(result), args.json, args.out, MARK_BEGIN, MARK_END)
    print(json.dumps({k: {f: v for f, v in row.items() if f != "tokens"} for k, row in rows.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
