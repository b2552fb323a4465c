"""llama.cpp's llama-server, built CPU-only from pinned sources by the `llama_cpp` resource's host
code (cached across runs: tests/llama_cpp_build.py), serving the GGUF labctl writes of its tiny
Llama (labctl/agent/modelload/ggufgen.py) on 127.0.0.1.

Greedy text from llama.cpp equals transformers' `generate(do_sample=False)` on the Hugging Face
folder, token for token: with random weights any slip in the conversion (a tensor's name, the
Q/K row permutation RoPE needs, the tokenizer's pre-split, merges or specials, the chat
template) changes the tokens at once. The first run builds llama.cpp (about 8 minutes on 2 cores).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

ALIAS = "tiny-llama"
# Prose, code, digits, punctuation runs, non-ASCII and a special token written in the text: the
# cases where a pre-tokenizer or a byte-level vocabulary differs first.
PROMPTS = [
    "The quick brown fox",
    "def add(a, b):\n    return",
    "for i in range(10):  # count 12345 6.02e23 !!!??",
    "Café naïve — 東京 🦙",
    "x<|im_start|>user\nhi",
]
MAX_TOKENS = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(url: str, body: dict[str, Any] | None = None, timeout: float = 60) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


class Server:
    def __init__(self, binary: Path, model: Path, log: Path, threads: int = 2) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [str(binary), "--host", "127.0.0.1", "--port", str(self.port), "--alias", ALIAS]
        # One slot holding the whole context; no web UI (this build has none to serve anyway).
        argv += ["-m", str(model), "-c", "512", "-np", "1", "-t", str(threads), "--no-webui"]
        self.log = log
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log.open("wb"), stderr=subprocess.STDOUT
        )
        self.health: list[tuple[int, Any]] = []  # every answer /health gave until it was 200

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"llama-server exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
                )
            try:
                status, body = http(self.url + "/health", timeout=5)
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.01)  # not listening yet
                continue
            self.health.append((status, body))
            if status == 200:
                return
            time.sleep(0.01)
        raise AssertionError(f"llama-server not ready in {timeout} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def binary() -> Path:
    if shutil.which("cmake") is None or shutil.which("c++") is None:
        pytest.skip("building llama.cpp needs cmake and a C++ compiler")
    from tests.llama_cpp_build import llama_server

    return llama_server()


@pytest.fixture(scope="module")
def gguf_files(tiny_hf_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from labctl.agent.modelload.ggufgen import hf_to_gguf

    out = tmp_path_factory.mktemp("gguf")
    return {
        ft: Path(hf_to_gguf(str(tiny_hf_model), str(out / f"{ALIAS}-{ft}.gguf"), ft)["path"])
        for ft in ("f32", "f16", "q8_0")
    }


@pytest.fixture(scope="module")
def server(
    binary: Path, gguf_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    s = Server(binary, gguf_files["f32"], tmp_path_factory.mktemp("llama") / "server.log")
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def hf(tiny_hf_model: Path) -> tuple[Any, Any]:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_hf_model))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_hf_model), dtype=torch.float32)
    model.eval()
    return tok, model


def hf_greedy(hf: tuple[Any, Any], ids: list[int]) -> list[int]:
    import torch

    _, model = hf
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False)
    return [int(t) for t in out[0, len(ids) :]]


def test_health_answers_loading_then_ok(server: Server) -> None:
    # While the model loads /health answers 503 {"error": {"message": "Loading model", ...}}; a
    # model this small often loads before the first poll, so that answer may not be seen at all.
    *before, last = server.health
    assert last == (200, {"status": "ok"})
    for status, body in before:
        assert status == 503 and body["error"]["message"] == "Loading model", body


def test_models_lists_the_alias(server: Server, binary: Path) -> None:
    status, body = http(server.url + "/v1/models")
    assert status == 200
    assert [m["id"] for m in body["data"]] == [ALIAS]
    manifest = json.loads((binary.parent.parent / "build.json").read_text())
    assert manifest["version"] == "0.3.36" and manifest["cuda_archs"] == []


def test_tokenizer_is_the_same(server: Server, hf: tuple[Any, Any]) -> None:
    tok, _ = hf
    for prompt in PROMPTS:
        status, body = http(
            server.url + "/tokenize", {"content": prompt, "add_special": True, "parse_special": True}
        )
        assert status == 200
        assert body["tokens"] == tok(prompt)["input_ids"], prompt
        status, back = http(server.url + "/detokenize", {"tokens": body["tokens"]})
        assert back["content"] == prompt


def test_greedy_completion_equals_transformers(server: Server, hf: tuple[Any, Any]) -> None:
    tok, _ = hf
    for prompt in PROMPTS:
        want_ids = hf_greedy(hf, tok(prompt)["input_ids"])
        want_text = tok.decode(want_ids, skip_special_tokens=True)
        body = {"model": ALIAS, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
        status, answer = http(server.url + "/v1/completions", body)
        assert status == 200, answer
        assert answer["model"] == ALIAS
        assert answer["choices"][0]["text"] == want_text, prompt
        # The token ids themselves, from the native endpoint.
        native = {"prompt": prompt, "n_predict": MAX_TOKENS, "temperature": 0, "return_tokens": True}
        status, raw = http(server.url + "/completion", native)
        assert status == 200 and raw["tokens"] == [t for t in want_ids if t != tok.eos_token_id], prompt


def test_chat_applies_chatml_as_transformers_does(server: Server, hf: tuple[Any, Any]) -> None:
    tok, _ = hf
    messages = [
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": "Add two numbers."},
    ]
    status, rendered = http(server.url + "/apply-template", {"messages": messages})
    assert status == 200
    want_prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered["prompt"] == want_prompt
    assert want_prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    want_ids = hf_greedy(hf, list(ids))
    body = {"model": ALIAS, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
    status, answer = http(server.url + "/v1/chat/completions", body)
    assert status == 200, answer
    assert answer["usage"]["prompt_tokens"] == len(ids)
    assert answer["choices"][0]["message"]["content"] == tok.decode(want_ids, skip_special_tokens=True)


@pytest.mark.parametrize("ftype", ["f16", "q8_0"])
def test_smaller_files_load_and_answer(
    binary: Path, gguf_files: dict[str, Path], ftype: str, tmp_path: Path
) -> None:
    s = Server(binary, gguf_files[ftype], tmp_path / "server.log")
    try:
        s.wait_ready()
        body = {"model": ALIAS, "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0}
        status, answer = http(s.url + "/v1/completions", body)
        assert status == 200 and answer["usage"]["completion_tokens"] >= 1
    finally:
        s.stop()
