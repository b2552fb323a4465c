"""labctl's model server holding a Hugging Face causal LM (labctl/agent/orchestra/hf_model.py): the
session's tiny Llama (hfgen: BPE tokenizer, ChatML template, eos <|im_end|>) served in this process
on the CPU, asked by the official OpenAI SDK, its answers checked against `transformers`' own
generate() on the same folder."""

from __future__ import annotations

import http.client
import json
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from labctl.agent.orchestra.hf_model import HFModel, pick_dtype
from labctl.agent.orchestra.openai_api import releasable
from labctl.agent.orchestra.server import Server, detect_format, open_model
from tests.unit.test_orchestra_server import REPO, call, free_port, server_argv, wait_ready

NAME = "tiny-llama"
CONTEXT = 512  # hfgen's default max_position_embeddings
EOS = "<|im_end|>"
PROMPTS = ["def add(a, b):\n    return", "the lab", "hello orchestra"]
# Prompts after which this random model writes <|im_end|> within a few dozen greedy tokens
# (found by trying): the first one that does serves the end-of-sequence test.
EOS_CANDIDATES = ["sum", "b", "1 (", "a print b ) add", ") a return return lab lab"]


class Served:
    def __init__(self, port: int, model: HFModel, before: list[tuple[str, int, Any]]) -> None:
        self.port = port
        self.model = model
        self.before = before


@pytest.fixture(scope="module")
def served(tiny_hf_model: Path) -> Iterator[Served]:
    """A ready server in this process and what it said at each stage before it was ready."""
    model = open_model(NAME, str(tiny_hf_model), "cpu")
    assert isinstance(model, HFModel)
    httpd = Server(0, model, address="127.0.0.1")
    port = int(httpd.server_address[1])
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}]}
    before: list[tuple[str, int, Any]] = []
    try:
        before.append(("loading", *call(port, "GET", "/health")))
        before.append(("loading chat", *call(port, "POST", "/v1/chat/completions", chat)))
        model.check()
        model.load()
        before.append(("warming", *call(port, "GET", "/health")))
        model.warm()
        yield Served(port, model, before)
    finally:
        httpd.shutdown()
        httpd.server_close()


class Reference:
    """transformers' own model and tokenizer from the same folder: what the server must match."""

    def __init__(self, folder: Path) -> None:
        import transformers

        self.tok = transformers.AutoTokenizer.from_pretrained(folder)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()

    def generate(self, ids: list[int], n: int) -> list[int]:
        """Greedy: the new tokens, an ending <|im_end|> included (generate() stops after it)."""
        import torch

        out = self.model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
        return [int(t) for t in out[0, len(ids) :]]

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        ids = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids if isinstance(ids, list) else ids["input_ids"])

    def text(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=True))


@pytest.fixture(scope="module")
def ref(tiny_hf_model: Path) -> Reference:
    return Reference(tiny_hf_model)


def sdk(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)


def test_health_says_loading_then_warming_then_ready_with_the_format_and_dtype(
    served: Served, ref: Reference
) -> None:
    (_, c0, d0), (_, c1, d1), (_, c2, d2) = served.before
    assert (c0, d0["state"]) == (503, "loading")
    assert c1 == 503 and d1["error"]["code"] == "loading"  # the API's error shape, not an answer
    assert (c2, d2["state"]) == (503, "warming")
    code, health = call(served.port, "GET", "/health")
    params = sum(p.numel() for p in ref.model.parameters())
    assert code == 200 and health["state"] == "ready" and health["name"] == NAME
    assert (health["format"], health["device"], health["dtype"]) == ("hf", "cpu", "float32")
    assert health["params"] == params and health["memory_bytes"] == 4 * params  # fp32 on the CPU
    assert health["load_s"] > 0 and health["warmup_s"] > 0 and health["in_flight"] == 0
    listed = sdk(served.port).models.list().data
    assert [m.id for m in listed] == [NAME]
    assert call(served.port, "GET", "/v1/models")[1]["data"][0]["max_model_len"] == CONTEXT
    assert served.model.eos == {ref.tok.convert_tokens_to_ids(EOS)}


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_are_transformers_own_generate_token_for_token(
    served: Served, ref: Reference, prompt: str
) -> None:
    """48 tokens decoded one position at a time from the KV cache: a wrong position, mask or
    cache entry would change the logits and, within a few tokens, the argmax."""
    ids = ref.tok(prompt)["input_ids"]
    expected = ref.generate(ids, 48)
    code, native = call(served.port, "POST", "/generate", {"prompt": prompt, "max_tokens": 48})
    assert code == 200 and native["tokens"] == expected
    got = sdk(served.port).completions.create(model=NAME, prompt=prompt, max_tokens=48, temperature=0)
    (choice,) = got.choices
    assert choice.text == ref.text(expected)
    assert got.usage is not None
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (len(ids), len(expected))
    assert len(expected) > len(choice.text.split())  # subword tokens, not words or bytes


def test_a_chat_is_the_models_template_continued_as_transformers_would(
    served: Served, ref: Reference
) -> None:
    messages = [
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": "def add(a, b):"},
    ]
    ids = ref.chat_ids(messages)
    opening = ref.tok("<|im_start|>assistant\n")["input_ids"]  # the generation prompt
    assert ids[0] == ref.tok.convert_tokens_to_ids("<|im_start|>") and ids[-len(opening) :] == opening
    expected = ref.generate(ids, 40)
    got = sdk(served.port).chat.completions.create(
        model=NAME, messages=messages, max_tokens=40, temperature=0
    )
    assert got.object == "chat.completion" and got.id.startswith("chatcmpl-")
    (choice,) = got.choices
    assert choice.message.role == "assistant" and choice.message.content == ref.text(expected)
    assert got.usage is not None
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (len(ids), len(expected))
    # The same words without the template are another prompt, with another answer.
    plain = sdk(served.port).completions.create(
        model=NAME, prompt="You write Python.\ndef add(a, b):", max_tokens=40, temperature=0
    )
    assert plain.choices[0].text != choice.message.content


def test_text_parts_are_joined_and_what_a_chat_cannot_be_is_refused(served: Served, ref: Reference) -> None:
    client = sdk(served.port)
    parts = [{"type": "text", "text": "def add"}, {"type": "text", "text": "(a, b):"}]
    joined = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": parts}], max_tokens=8, temperature=0
    )
    whole = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "def add(a, b):"}], max_tokens=8, temperature=0
    )
    assert joined.choices[0].message.content == whole.choices[0].message.content
    for messages, says in (
        ([{"role": "wizard", "content": "x"}], "needs a role"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "text only"),
        ([], "1 to 256 messages"),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=NAME, messages=messages, max_tokens=2)
        assert says in str(caught.value)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=NAME,
            messages=[{"role": "user", "content": "x"}],
            tools=[{"type": "function", "function": {"name": "f"}}],
        )
    assert "tools" in str(caught.value)


def test_streams_on_both_endpoints_join_to_the_whole_answer_and_end_with_usage(served: Served) -> None:
    client = sdk(served.port)
    messages = [{"role": "user", "content": "hello"}]
    usage = {"include_usage": True}
    whole = client.completions.create(model=NAME, prompt="the lab", max_tokens=30, temperature=0)
    chunks = list(
        client.completions.create(
            model=NAME, prompt="the lab", max_tokens=30, temperature=0, stream=True, stream_options=usage
        )
    )
    with_text = [c for c in chunks if c.choices]
    assert all(c.object == "text_completion" and c.id == chunks[0].id for c in chunks)
    assert len(with_text) > 5 and "".join(c.choices[0].text for c in with_text) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in with_text] == [None] * (len(with_text) - 1) + ["length"]
    assert not chunks[-1].choices and chunks[-1].usage == whole.usage

    chat = client.chat.completions.create(model=NAME, messages=messages, max_tokens=30, temperature=0)
    parts = list(
        client.chat.completions.create(
            model=NAME, messages=messages, max_tokens=30, temperature=0, stream=True, stream_options=usage
        )
    )
    deltas = [c for c in parts if c.choices]
    assert all(c.object == "chat.completion.chunk" for c in parts)
    assert deltas[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in deltas) == chat.choices[0].message.content
    assert deltas[-1].choices[0].finish_reason == "length" and parts[-1].usage == chat.usage
    # Without include_usage there is no usage chunk: every chunk carries a choice.
    plain = list(client.completions.create(model=NAME, prompt="the lab", max_tokens=5, stream=True))
    assert all(c.choices and c.usage is None for c in plain)


def test_the_stream_is_server_sent_events_as_the_api_frames_them(served: Served) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    body = {"model": NAME, "prompt": "the lab", "max_tokens": 6, "temperature": 0, "stream": True, "n": 2}
    conn.request("POST", "/v1/completions", body=json.dumps(body))
    resp = conn.getresponse()
    raw = resp.read().decode()
    conn.close()
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    events = raw.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    docs = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: {") for e in events[:-2])
    ends = [(d["choices"][0]["index"], d["choices"][0]["finish_reason"]) for d in docs]
    assert [e for e in ends if e[1]] == [(0, "length"), (1, "length")]  # n=2: both choices, in order
    texts = ["".join(d["choices"][0]["text"] for d in docs if d["choices"][0]["index"] == i) for i in (0, 1)]
    assert texts[0] == texts[1] != ""  # greedy twice


def test_a_stop_sequence_cuts_the_answer_before_it_whole_and_streamed(served: Served) -> None:
    client = sdk(served.port)
    full = client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=40, temperature=0)
    text = full.choices[0].text
    stop = next(
        text[i : i + 3]
        for i in range(8, len(text) - 3)
        if text[i : i + 3].isascii() and text[i : i + 3].strip() and text.find(text[i : i + 3]) >= 5
    )
    first = text.find(stop)
    cut = client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=40, temperature=0, stop=[stop])
    assert cut.choices[0].text == text[:first] and cut.choices[0].finish_reason == "stop"
    assert cut.usage is not None and full.usage is not None
    assert 0 < cut.usage.completion_tokens < full.usage.completion_tokens
    streamed = list(
        client.completions.create(
            model=NAME, prompt=PROMPTS[0], max_tokens=40, temperature=0, stop=[stop], stream=True
        )
    )
    # Text that might begin the stop is held back, so no part of the stop is ever sent.
    assert "".join(c.choices[0].text for c in streamed) == text[:first]
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_the_end_of_sequence_token_ends_the_answer_as_a_stop_as_transformers_does(
    served: Served, ref: Reference
) -> None:
    eos = ref.tok.convert_tokens_to_ids(EOS)
    found = [(p, ref.generate(ref.tok(p)["input_ids"], 64)) for p in EOS_CANDIDATES]
    prompt, expected = next((p, e) for p, e in found if e[-1] == eos)
    got = sdk(served.port).completions.create(model=NAME, prompt=prompt, max_tokens=64, temperature=0)
    (choice,) = got.choices
    assert choice.finish_reason == "stop" and EOS not in choice.text and choice.text == ref.text(expected)
    assert got.usage is not None and got.usage.completion_tokens == len(expected) < 64
    native = call(served.port, "POST", "/generate", {"prompt": prompt, "max_tokens": 64})[1]
    assert native["tokens"] == expected


def test_a_prompt_longer_than_the_context_is_a_400_naming_the_limit(served: Served, ref: Reference) -> None:
    client = sdk(served.port)
    long = "hello orchestra " * 400
    assert len(ref.tok(long)["input_ids"]) > CONTEXT
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=NAME, prompt=long, max_tokens=2)
    assert f"max_position_embeddings={CONTEXT}" in str(caught.value) and "prompt" in str(caught.value)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": long}], max_tokens=2)
    assert f"max_position_embeddings={CONTEXT}" in str(caught.value)
    # A prompt that fits with room for 2 tokens gets those 2: the answer stops at the context.
    words = ref.tok(long)["input_ids"][: CONTEXT - 2]
    near = ref.tok.decode(words)
    assert len(ref.tok(near)["input_ids"]) == CONTEXT - 2
    got = client.completions.create(model=NAME, prompt=near, max_tokens=50, temperature=0)
    assert got.usage is not None and got.usage.completion_tokens == 2
    assert got.choices[0].finish_reason == "length"


def test_sampling_repeats_with_a_seed_and_a_tiny_nucleus_is_greedy(served: Served) -> None:
    client = sdk(served.port)

    def texts(seed: int, **kw: Any) -> list[str]:
        answer = client.completions.create(
            model=NAME, prompt="the lab", max_tokens=12, temperature=1.0, seed=seed, n=3, **kw
        )
        return [c.text for c in answer.choices]

    first = texts(7)
    assert texts(7) == first and texts(8) != first and len(set(first)) > 1
    greedy = client.completions.create(model=NAME, prompt="the lab", max_tokens=12, temperature=0)
    assert texts(9, top_p=1e-9) == [greedy.choices[0].text] * 3


def test_a_client_that_hangs_up_mid_stream_stops_the_generation_without_a_traceback(
    served: Served, capfd: pytest.CaptureFixture[str]
) -> None:
    body = {"model": NAME, "prompt": "the lab", "max_tokens": 256, "temperature": 0, "stream": True}
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        got = b""
        while got.count(b"data: ") < 2:
            got += s.recv(4096)
    deadline = time.monotonic() + 30
    while call(served.port, "GET", "/health")[1]["in_flight"] > 0:
        assert time.monotonic() < deadline, "the abandoned stream still holds the model"
        time.sleep(0.01)
    # The model is free at once, and the next client is answered.
    assert served.model.lock.acquire(timeout=5)
    served.model.lock.release()
    assert sdk(served.port).completions.create(model=NAME, prompt="x", max_tokens=1).choices
    err = capfd.readouterr().err
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert [e["route"] for e in events if e["event"] == "abandoned"] == ["/v1/completions"]
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("capability", "bf16", "dtype"),
    [
        ((9, 0), True, "bfloat16"),  # H100
        ((8, 6), True, "bfloat16"),  # RTX 3090
        ((8, 0), False, "float16"),  # no bf16 in this torch build: the next best
        ((7, 5), True, "float16"),  # T4 (torch may emulate bf16 there: not native, slow)
        ((7, 0), False, "float16"),  # V100
        ((6, 1), False, "float32"),  # P40: fp16 at 1/64 rate
        ((6, 0), False, "float32"),  # P100
    ],
)
def test_the_dtype_follows_the_gpus_compute_capability(
    capability: tuple[int, int], bf16: bool, dtype: str
) -> None:
    assert pick_dtype("cuda:0", capability, bf16) == dtype


def test_the_cpu_serves_in_fp32() -> None:
    assert pick_dtype("cpu", None, True) == "float32"
    assert pick_dtype("cpu", (9, 0), True) == "float32"


def test_the_format_is_read_from_config_json_and_a_flag_overrides_it(
    tiny_hf_model: Path, tmp_path: Path
) -> None:
    from labctl.agent.modelload.modelgen import make_model
    from labctl.agent.models.tinylm import make_config
    from labctl.agent.orchestra.tinylm_model import Model

    make_model(
        str(tmp_path / "tl"),
        0,
        config=make_config(vocab=64, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq=16),
    )
    assert detect_format(str(tiny_hf_model)) == "hf"
    assert detect_format(str(tmp_path / "tl")) == "tinylm"  # its config has a model_type too
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text(json.dumps({"layers": 2}))
    with pytest.raises(ValueError, match="neither a Hugging Face config"):
        detect_format(str(tmp_path / "odd"))
    assert type(open_model("a", str(tiny_hf_model))) is HFModel
    assert type(open_model("a", str(tmp_path / "tl"))) is Model
    assert type(open_model("a", str(tmp_path / "odd"), fmt="tinylm")) is Model
    # An HF folder told it is a tinylm fails its checks, in ms and without torch.
    with pytest.raises(ValueError):
        open_model("a", str(tiny_hf_model), fmt="tinylm").check()


def test_the_server_process_serves_an_hf_folder_on_the_host_asked_for(tiny_hf_model: Path) -> None:
    port = free_port()
    argv = server_argv(tiny_hf_model, port, NAME, "--device", "cpu", "--host", "127.0.0.1")
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        health = wait_ready(port, proc)
        assert (health["format"], health["dtype"]) == ("hf", "float32")
        with socket.socket() as s:  # bound to 127.0.0.1 only: another address's port is still free
            s.bind(("127.0.0.2", port))
        got = sdk(port).chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0
        )
        assert got.choices[0].message.role == "assistant"
        proc.terminate()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert [json.loads(line)["event"] for line in err.splitlines()][-2:] == ["stopping", "stopped"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_tied_embeddings_serve_the_input_embedding_as_the_head_and_a_missing_weight_is_named(
    tiny_hf_model: Path, tmp_path: Path
) -> None:
    """A checkpoint saved with tie_word_embeddings has no lm_head.weight: the head is the
    embedding, as transformers ties it; any other weight missing is an error, not a random one."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "tied"
    shutil.copytree(tiny_hf_model, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    tensors = load_file(folder / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    model = HFModel("tied", str(folder), "cpu")
    model.load()
    model.warm()
    ref = Reference(folder)
    assert model.params == sum(p.numel() for p in ref.model.parameters())  # the shared one counted once
    ids = ref.tok("the lab")["input_ids"]
    assert model.generate({"prompt": "the lab", "max_tokens": 24})["tokens"] == ref.generate(ids, 24)

    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=re.escape("model.layers.1.mlp.up_proj.weight")):
        HFModel("broken", str(folder), "cpu").load()


@pytest.mark.parametrize(
    ("text", "stops", "sent"),
    [
        ("hello wor", ["world"], "hello "),  # "wor" may become the stop: held back
        ("hello wox", ["world"], "hello wox"),  # it cannot any more
        ("abc", ["cd", "bcx"], "a"),  # the longest possible beginning of any stop
        ("ab\ufffd", [], "ab"),  # half a UTF-8 character waits for its other bytes
        ("a\ufffdb", [], "a\ufffdb"),  # a bad byte inside the text is sent as it is
        ("", ["x"], ""),
    ],
)
def test_a_stream_sends_only_text_that_no_later_token_can_turn_into_a_stop(
    text: str, stops: list[str], sent: str
) -> None:
    assert releasable(text, stops) == sent


@pytest.mark.parametrize(
    ("archs", "cap", "runs"),
    [
        (["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"], (6, 1), False),  # cu128 torch, a P40
        (
            ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"],
            (6, 1),
            True,
        ),  # cu126: sm_60 runs on 6.1
        (["sm_75", "sm_80", "sm_90", "compute_90"], (12, 0), True),  # PTX is compiled for newer cards
        (["sm_80", "sm_90"], (7, 0), False),
        ([], (6, 1), True),  # a build that does not say is let through: its first kernel will
    ],
)
def test_a_card_the_torch_build_has_no_kernels_for_is_refused_before_loading(
    archs: list[str], cap: tuple[int, int], runs: bool
) -> None:
    from labctl.agent.orchestra.backend import arch_gap

    why = arch_gap(archs, cap)
    assert (why is None) == runs
    if not runs:
        assert f"no kernels for sm_{cap[0]}{cap[1]}" in (why or "")
