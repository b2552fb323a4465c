"""Orchestra, real format: labctl's server on a Hugging Face model on the card, against transformers.

A Llama-architecture model of about 110 M parameters (labctl/agent/modelload/hfgen.py: its own
BPE tokenizer and chat template, random weights from a seed; no download) is served by labctl's
server in a process of its own on cuda:0, as `labctl orchestra start` starts it. Measured: the
dtype it chose for the card (bf16 from compute capability 8.0), its load and warm-up, the time to
the first token of a streamed chat (the first content chunk of the server-sent events, from the
moment the request is sent), and greedy tokens/s over /v1/completions, beside transformers' own
`generate` on the same card, dtype and tokens in the same run (the goal: 0.9x or better).
"""

from __future__ import annotations

import http.client
import json
import socket
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from .base import CheckEnv, CheckFailed, Section, fmt, tail

TITLE = "Orchestra, real format: labctl's server on a Hugging Face model, time to first token and tokens/s"
PLAN = [
    "make a Llama-architecture HF model (about 110 M parameters, BPE tokenizer, chat template) from a seed",
    "start labctl's server on it on cuda:0 (its own process, as the orchestra does); the dtype it picks, load, warm-up",
    "time to first token of a streamed chat completion (median of 5), through the model's chat template",
    "greedy tokens/s over /v1/completions (128 new tokens, median of 5)",
    "transformers' generate on the same card, dtype and number of tokens; goal: labctl's server at 0.9x or better",
]
NAME = "gpucheck-hf"
PROMPT = "def fizzbuzz(n):\n    "


def _size(env: CheckEnv) -> dict[str, int]:
    if env.smoke or not env.cuda:
        return {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "tokens": 16, "reps": 2}
    return {"hidden": 768, "layers": 12, "heads": 12, "kv_heads": 4, "tokens": 128, "reps": 5}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(port: int, path: str, body: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        doc = json.loads(resp.read())
        if resp.status != 200:
            raise CheckFailed(f"POST {path} answered {resp.status}: {doc}")
        return doc  # type: ignore[no-any-return]
    finally:
        conn.close()


def _first_token_s(port: int) -> float:
    """Seconds from sending a streamed chat request to its first content chunk."""
    body = {
        "model": NAME,
        "messages": [{"role": "user", "content": "Write fizzbuzz in Python."}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
    }
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        start = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        while True:
            line = resp.readline()
            if not line:
                raise CheckFailed("the stream ended before any content")
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0].get("delta") or {}
            if delta.get("content"):
                first = time.perf_counter() - start
                resp.read()  # the rest of the stream
                return first
    finally:
        conn.close()


def _wait_ready(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CheckFailed(f"labctl's server exited {proc.returncode}:\n{tail(log.read_text())}")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/health")
            resp = conn.getresponse()
            doc = json.loads(resp.read())
            if resp.status == 200:
                return doc  # type: ignore[no-any-return]
        except (OSError, ValueError):
            pass
        finally:
            conn.close()
        time.sleep(0.2)
    raise CheckFailed(f"labctl's server was not ready in {timeout:.0f} s:\n{tail(log.read_text())}")


def _transformers(folder: Path, device: str, dtype: str, n: int, reps: int) -> float:
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, dtype))
    model = model.to(device).eval()
    ids = torch.tensor([tok(PROMPT)["input_ids"]], device=device)

    def once() -> float:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    once()
    return float(statistics.median(n / once() for _ in range(reps)))


def run(env: CheckEnv) -> Section:
    from labctl.agent.modelload.hfgen import make_hf_model

    sec = Section("orchestra_hf", TITLE)
    size = _size(env)
    folder = env.work / "hf-model"
    info = make_hf_model(
        str(folder),
        seed=0,
        vocab=1024,
        hidden=size["hidden"],
        layers=size["layers"],
        heads=size["heads"],
        kv_heads=size["kv_heads"],
        context=2048,
        dtype="bfloat16" if env.cuda else "float32",
    )
    sec.row(
        "model",
        f"{info['params'] / 1e6:.1f} M parameters",
        f"Llama, {size['layers']} layers, made from seed 0",
    )
    port = _port()
    log = env.out / "orchestra_hf-server.log"
    argv = [
        env.python,
        "-m",
        "labctl.agent.orchestra.server",
        "--model-dir",
        str(folder),
        "--port",
        str(port),
    ]
    argv += ["--name", NAME, "--device", "cuda" if env.cuda else "cpu", "--host", "127.0.0.1"]
    env.log("$ " + " ".join(argv))
    start = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env.environ(), stdout=out, stderr=subprocess.STDOUT)
    try:
        health = _wait_ready(port, proc, log, 300)
        ready_s = time.perf_counter() - start
        dtype = str(health.get("dtype") or "")
        sec.row("dtype labctl's server chose", dtype, f"compute capability {env.gpu.get('cc', '-')}")
        sec.row(
            "ready (process start to health 200)",
            fmt(ready_s, " s"),
            f"load {health.get('load_s')} s, warm-up {health.get('warmup_s')} s",
        )
        _first_token_s(port)  # the first request after warm-up pays for lazy initialisation
        ttft = statistics.median(_first_token_s(port) for _ in range(size["reps"]))
        sec.row("time to first token (streamed chat)", fmt(ttft * 1000, " ms"), "median")
        n = size["tokens"]
        body = {"model": NAME, "prompt": PROMPT, "max_tokens": n, "temperature": 0}
        _post(port, "/v1/completions", body)
        rates, counts = [], []
        for _ in range(size["reps"]):
            t0 = time.perf_counter()
            doc = _post(port, "/v1/completions", body)
            count = int(doc["usage"]["completion_tokens"])
            rates.append(count / (time.perf_counter() - t0))
            counts.append(count)
        ours = statistics.median(rates)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    # The same number of tokens as the server wrote (a random model may end its text early).
    theirs = _transformers(
        folder, "cuda" if env.cuda else "cpu", dtype.replace("torch.", ""), min(counts), size["reps"]
    )
    sec.row("labctl's server tokens/s (HTTP, greedy)", fmt(ours, "", 1), f"{min(counts)} tokens")
    sec.row("transformers generate tokens/s", fmt(theirs, "", 1), "same card, dtype and tokens")
    sec.figures.update(
        {
            "params": info["params"],
            "dtype": dtype,
            "ready_s": round(ready_s, 3),
            "load_s": health.get("load_s"),
            "warmup_s": health.get("warmup_s"),
            "first_token_s": round(ttft, 4),
            "tokens_per_s": round(ours, 1),
            "transformers_tokens_per_s": round(theirs, 1),
            "tokens": min(counts),
        }
    )
    sec.goal(
        "labctl's server against transformers' generate",
        round(ours / theirs, 2) if theirs else None,
        0.9,
        why="tokens/s, same card, dtype and tokens",
    )
    return sec
