"""The model server's OpenAI-compatible face (labctl/agent/orchestra/openai_api.py), asked by the
real OpenAI Python SDK: what an SDK, vLLM's clients or the trainer's client send, labctl's server
answers in the API's shapes. A real tinylm checkpoint, torch on the CPU, HTTP on this machine."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from labctl.agent.modelload.modelgen import make_model
from labctl.agent.models.tinylm import make_config
from labctl.agent.orchestra.openai_api import ApiError, parse_completion
from labctl.agent.orchestra.server import MAX_TOKENS, Model, Server
from tests.unit.test_orchestra_server import call

CONFIG = make_config(vocab=256, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq=64)
# Tokens 0..127 are ASCII bytes: every answer is clean text, so a stop sequence can be taken from one.
ASCII = make_config(vocab=128, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq=64)


def serve(model: Model) -> tuple[Server, int]:
    httpd = Server(0, model, address="127.0.0.1")
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, int(httpd.server_address[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, dict[str, Any]]]:
    """A ready server on this machine and what its /v1 endpoints said before the model was loaded."""
    path = tmp_path_factory.mktemp("model") / "tiny"
    make_model(str(path), 0, config=CONFIG)
    model = Model("tiny", str(path), "cpu")
    httpd, port = serve(model)
    try:
        before = {
            "models": call(port, "GET", "/v1/models"),
            "completions": call(port, "POST", "/v1/completions", {"model": "tiny", "prompt": "a"}),
        }
        model.check()
        model.load()
        model.warm()
        yield port, before
    finally:
        httpd.shutdown()
        httpd.server_close()


def sdk(port: int) -> openai.OpenAI:
    # No retries: a refusal must reach the test as the SDK's own error, once.
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)


def test_the_sdk_lists_the_one_model_and_nothing_answers_before_it_is_ready(
    server: tuple[int, dict[str, Any]],
) -> None:
    port, before = server
    for code, doc in before.values():
        assert code == 503 and doc["error"]["code"] == "loading" and "/health" in doc["error"]["message"]
    listed = sdk(port).models.list().data
    assert [(m.id, m.owned_by) for m in listed] == [("tiny", "labctl")]
    assert call(port, "GET", "/v1/models")[1]["data"][0]["max_model_len"] == CONFIG["max_seq"]


def test_a_greedy_completion_is_the_servers_own_generation_with_usage_counted(
    server: tuple[int, dict[str, Any]],
) -> None:
    port, _ = server
    got = sdk(port).completions.create(model="tiny", prompt="the lab", max_tokens=12, temperature=0)
    native = call(port, "POST", "/generate", {"prompt": "the lab", "max_tokens": 12})[1]
    assert got.object == "text_completion" and got.model == "tiny" and got.id.startswith("cmpl-")
    (choice,) = got.choices
    assert choice.text == native["text"] and choice.finish_reason == "length" and choice.index == 0
    assert got.usage is not None
    assert (got.usage.prompt_tokens, got.usage.completion_tokens, got.usage.total_tokens) == (7, 12, 19)


def test_sampling_with_a_seed_repeats_and_n_choices_come_per_prompt_in_order(
    server: tuple[int, dict[str, Any]],
) -> None:
    port, _ = server
    client = sdk(port)

    def texts(seed: int, **kw: Any) -> list[str]:
        answer = client.completions.create(
            model="tiny", prompt=["ab", "cd"], max_tokens=8, temperature=1.0, seed=seed, n=3, **kw
        )
        assert [c.index for c in answer.choices] == list(range(6))
        assert answer.usage is not None and answer.usage.completion_tokens == 6 * 8
        return [c.text for c in answer.choices]

    first = texts(7)
    assert texts(7) == first  # the same seed, the same samples
    assert texts(8) != first  # 48 random bytes alike under two seeds: never in practice
    assert len(set(first)) > 1  # samples, not one greedy answer repeated
    greedy = call(port, "POST", "/generate", {"prompt": "ab", "max_tokens": 8})[1]["text"]
    # A nucleus this small keeps only the most likely token: sampling becomes greedy.
    assert texts(9, top_p=1e-9)[:3] == [greedy] * 3


def test_a_streamed_completion_is_the_whole_answer_in_chunks_with_usage_last(
    server: tuple[int, dict[str, Any]],
) -> None:
    port, _ = server
    whole = sdk(port).completions.create(model="tiny", prompt="the lab", max_tokens=12, temperature=0)
    chunks = list(
        sdk(port).completions.create(
            model="tiny",
            prompt="the lab",
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) > 2 and "".join(texts) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert not chunks[-1].choices and chunks[-1].usage == whole.usage


def test_echo_with_logprobs_scores_the_prompt_as_score_does(server: tuple[int, dict[str, Any]]) -> None:
    port, _ = server
    text = "hello orchestra"
    got = sdk(port).completions.create(model="tiny", prompt=text, max_tokens=0, echo=True, logprobs=0)
    (choice,) = got.choices
    assert choice.text == text and choice.logprobs is not None
    values = choice.logprobs.token_logprobs
    assert values is not None and values[0] is None and len(values) == len(text)
    assert choice.logprobs.tokens == list(text)
    mean = sum(v for v in values[1:] if v is not None) / (len(text) - 1)
    native = call(port, "POST", "/score", {"text": text})[1]["mean_logprob"]
    assert math.isclose(mean, native, rel_tol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        ({"model": "other"}, openai.NotFoundError, "holds 'tiny'"),
        ({"stream": True, "logprobs": 0}, openai.BadRequestError, "logprobs is not supported on a stream"),
        ({"stream_options": {"include_usage": True}}, openai.BadRequestError, "only allowed with stream"),
        ({"max_tokens": MAX_TOKENS + 1}, openai.BadRequestError, "max_tokens"),
        ({"prompt": "x" * 65}, openai.BadRequestError, "max_seq=64"),
        ({"prompt": [1, 2, 3]}, openai.BadRequestError, "token ids are not taken"),
        ({"prompt": ""}, openai.BadRequestError, "prompt is empty"),
        ({"temperature": 3}, openai.BadRequestError, "temperature"),
        ({"logprobs": 2}, openai.BadRequestError, "logprobs"),
        ({"frequency_penalty": 0.5}, openai.BadRequestError, "frequency_penalty"),
        ({"extra_body": {"guided_json": {}}}, openai.BadRequestError, "unknown field 'guided_json'"),
    ],
)
def test_what_the_server_cannot_do_is_the_sdks_own_error_naming_the_field(
    server: tuple[int, dict[str, Any]], kwargs: dict[str, Any], error: type[Exception], says: str
) -> None:
    port, _ = server
    request: dict[str, Any] = {"model": "tiny", "prompt": "a", "max_tokens": 2, **kwargs}
    with pytest.raises(error) as caught:
        sdk(port).completions.create(**request)
    assert says in str(caught.value)


def test_unknown_v1_paths_and_bodies_that_are_not_json_get_the_apis_error_shape(
    server: tuple[int, dict[str, Any]],
) -> None:
    port, _ = server
    code, doc = call(port, "POST", "/v1/embeddings", {"model": "tiny"})
    assert code == 404 and "/v1/completions" in doc["error"]["message"]
    # A tinylm has no chat template: a chat is refused, not answered in a made-up format.
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    code, doc = call(port, "POST", "/v1/chat/completions", chat)
    assert code == 400 and "no chat template" in doc["error"]["message"]
    code, doc = call(port, "POST", "/v1/completions", raw=b"{not json")
    assert code == 400 and "not JSON" in doc["error"]["message"]
    assert call(port, "GET", "/v1/nothing")[0] == 404


def test_a_stop_sequence_ends_the_answer_before_it(tmp_path: Path) -> None:
    make_model(str(tmp_path / "ascii"), 0, config=ASCII)
    model = Model("ascii", str(tmp_path / "ascii"), "cpu")
    model.load()
    model.warm()
    full = model.generate({"prompt": "the lab", "max_tokens": 40})["text"]
    assert full.isascii() and len(full) == 40
    stop = full[10:12]
    first = full.find(stop)
    body = {"model": "ascii", "prompt": "the lab", "max_tokens": 40, "temperature": 0, "stop": [stop]}
    answer = model.complete(parse_completion(body, "ascii", MAX_TOKENS))
    (choice,) = answer["choices"]
    assert choice["text"] == full[:first] and choice["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == first
    with pytest.raises(ApiError) as caught:
        parse_completion(dict(body, stop=["a", "b", "c", "d", "e"]), "ascii", MAX_TOKENS)
    assert caught.value.param == "stop"
