"""Benchmark: labctl's model server on a Hugging Face causal LM, against `transformers`' own
generate() and against decoding without a KV cache.

One random Llama-architecture model made here by hfgen (hidden 256, 4 layers by default: big
enough that a token's compute shows next to Python's overhead), then, in this one process:

- labctl's server: an in-process server (server.py, the HF engine) asked over HTTP for a
  greedy /v1/completions of --tokens new tokens: the whole request path (JSON, tokenizer, the
  lock, the KV-cache decode);
- labctl's engine alone: the same decode loop (HFModel.tokens), no HTTP;
- transformers generate: `model.generate(do_sample=False, max_new_tokens=N)` on the same folder
  loaded by `from_pretrained`, in the same dtype on the same device;
- no KV cache: the server's model run on the whole sequence for every new token (what the
  tinylm path does), greedy.

All four must give the same tokens (checked); a prompt is picked for which the model does not
end the answer early. Median of --reps rounds, the contenders' order rotated every round. One
JSON line, then a table.

    .venv/bin/python bench/orchestra_hf.py [--hidden 256] [--layers 4] [--tokens 128] [--reps 5]
        [--device cpu] [--threads 1]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script: make `bench` and `labctl` importable
from bench.common import machine  # noqa: E402
from labctl.agent.modelload.hfgen import make_hf_model  # noqa: E402
from labctl.agent.orchestra.hf_model import HFModel  # noqa: E402
from labctl.agent.orchestra.server import Server  # noqa: E402

PROMPTS = ["def add(a, b):\n    return", "the lab", "hello orchestra", "for x in range(10):", "print(sum"]
SERVER = "labctl server (HTTP)"
ENGINE = "labctl engine (no HTTP)"
HF = "transformers generate"
NO_CACHE = "no KV cache (recompute)"


def sync(torch: Any, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def ask(port: int, name: str, prompt: str, n: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"model": name, "prompt": prompt, "max_tokens": n, "temperature": 0}
    conn.request(
        "POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"}
    )
    doc = json.loads(conn.getresponse().read())
    conn.close()
    return int(doc["usage"]["completion_tokens"])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument(
        "--tokens", type=int, default=128, help="new tokens per answer (the server caps at 256)"
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch's CPU threads (0: its default). One by default: a model this small gains little "
        "from more, and on a busy machine every op's thread barrier waits for a core (timings swing 10x)",
    )
    args = parser.parse_args()

    import torch
    import transformers

    if args.threads:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="orchestra-hf-") as tmp:
        folder = str(Path(tmp) / "model")
        info = make_hf_model(
            folder, seed=0, hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads
        )
        engine = HFModel("bench", folder, args.device)
        httpd = Server(0, engine, address="127.0.0.1")
        port = int(httpd.server_address[1])
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        try:
            engine.check()
            engine.load()
            engine.warm()
            device, n = engine.device, args.tokens
            ref = transformers.AutoModelForCausalLM.from_pretrained(
                folder, dtype=getattr(torch, engine.dtype)
            )
            ref = ref.to(device).eval()
            tok = transformers.AutoTokenizer.from_pretrained(folder)

            def hf(ids: list[int]) -> list[int]:
                with torch.inference_mode():
                    out = ref.generate(torch.tensor([ids], device=device), max_new_tokens=n, do_sample=False)
                sync(torch, device)
                return [int(t) for t in out[0, len(ids) :]]

            # A prompt whose greedy answer runs the full length: an early <|im_end|> would time less work.
            prompt = next((p for p in PROMPTS if len(hf(tok(p)["input_ids"])) == n), None)
            if prompt is None:
                sys.stderr.write(f"every prompt's answer ends before {n} tokens; try another --hidden\n")
                return 1
            ids = tok(prompt)["input_ids"]

            def ours(ids: list[int]) -> list[int]:
                with engine.lock:
                    got = [t for t, _ in engine.tokens(ids, n, 0.0, 1.0, None, False)]
                sync(torch, device)
                return got

            def no_cache(ids: list[int]) -> list[int]:
                seq = torch.tensor([ids], device=device)
                with torch.inference_mode():
                    for _ in range(n):
                        logits = engine._model(input_ids=seq, use_cache=False).logits[0, -1]
                        seq = torch.cat([seq, logits.argmax().view(1, 1)], dim=1)
                sync(torch, device)
                return [int(t) for t in seq[0, len(ids) :]]

            expected = hf(ids)
            assert ours(ids) == expected and no_cache(ids) == expected, "the paths disagree on the tokens"
            assert ask(port, "bench", prompt, n) == n
            contenders: dict[str, Callable[[], Any]] = {
                SERVER: lambda: ask(port, "bench", prompt, n),
                ENGINE: lambda: ours(ids),
                HF: lambda: hf(ids),
                NO_CACHE: lambda: no_cache(ids),
            }
            times: dict[str, list[float]] = {k: [] for k in contenders}
            order = list(contenders)
            for r in range(args.reps):
                for name in order[r % len(order) :] + order[: r % len(order)]:
                    start = time.perf_counter()
                    contenders[name]()
                    times[name].append(time.perf_counter() - start)
        finally:
            httpd.shutdown()
            httpd.server_close()

    rate = {k: n / statistics.median(v) for k, v in times.items()}
    result = {
        "bench": "orchestra_hf",
        "machine": machine(),
        "device": device,
        "dtype": engine.dtype,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "model": {k: info[k] for k in ("arch", "params", "vocab", "context")}
        | {"hidden": args.hidden, "layers": args.layers},
        "prompt_tokens": len(ids),
        "new_tokens": n,
        "reps": args.reps,
        "threads": torch.get_num_threads(),
        "tokens_per_s": {k: round(v, 1) for k, v in rate.items()},
        "server_vs_generate": round(rate[SERVER] / rate[HF], 3),
        "engine_vs_generate": round(rate[ENGINE] / rate[HF], 3),
        "kv_cache_vs_no_cache": round(rate[ENGINE] / rate[NO_CACHE], 3),
    }
    print(json.dumps(result))
    print(
        f"\n{info['params']:,} params, {len(ids)} prompt + {n} new tokens, greedy, {device} {engine.dtype}, "
        f"{torch.get_num_threads()} torch thread(s)"
    )
    print(f"| {'path':<26} | {'tokens/s':>9} | {'vs generate':>11} |")
    print(f"|{'-' * 28}|{'-' * 11}|{'-' * 13}|")
    for name, value in rate.items():
        print(f"| {name:<26} | {value:>9.1f} | {value / rate[HF]:>10.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
