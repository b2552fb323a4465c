"""The trainer's client (labctl/agent/orchestra/client.py) against real model servers on this
machine: tinylm checkpoints on the CPU behind labctl's server, and raw sockets for the failures a
rotation causes (a server gone, a connection cut, one that never answers)."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from labctl.agent.modelload.modelgen import make_model
from labctl.agent.models.tinylm import make_config
from labctl.agent.orchestra.client import Endpoint, ask_all, complete, models, score
from labctl.agent.orchestra.server import Model, Server, open_model
from labctl.hosts.agent_ship import agent_zip
from tests.unit.test_orchestra_server import call, free_port, in_flight, slow_server

REPO = Path(__file__).resolve().parents[2]
CONFIG = make_config(vocab=256, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq=64)


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}/v1"


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    """Three ready servers in this process, three different models: {name: port}."""
    root = tmp_path_factory.mktemp("models")
    ports: dict[str, int] = {}
    servers = []
    for seed, name in enumerate(("m-a", "m-b", "m-c")):
        make_model(str(root / name), 0, seed=seed, config=CONFIG)
        model = Model(name, str(root / name), "cpu")
        model.load()
        model.warm()
        httpd = Server(0, model, address="127.0.0.1")
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        ports[name] = int(httpd.server_address[1])
    try:
        yield ports
    finally:
        for httpd in servers:
            httpd.shutdown()
            httpd.server_close()


@pytest.fixture()
def raw_port() -> Iterator[tuple[int, list[socket.socket], str]]:
    """A port whose behaviour a test sets: "cut" reads the request and closes without answering
    (what the kernel does for a process killed mid-request), "silent" never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    held: list[socket.socket] = []
    mode = ["cut"]

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            conn.recv(65536)
            if mode[0] == "cut":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                conn.close()
            else:
                held.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield int(sock.getsockname()[1]), held, mode  # type: ignore[misc]
    finally:
        sock.close()
        for c in held:
            c.close()


def test_every_model_answers_in_the_order_asked_with_its_own_greedy_text(warm: dict[str, int]) -> None:
    endpoints = [Endpoint(name, url(port)) for name, port in warm.items()]
    answers = ask_all(endpoints, "def add(a, b):", max_tokens=10)
    assert [a.name for a in answers] == ["m-a", "m-b", "m-c"]
    for a, (name, port) in zip(answers, warm.items(), strict=True):
        native = call(port, "POST", "/generate", {"prompt": "def add(a, b):", "max_tokens": 10})[1]
        assert a.ok and a.text == native["text"] and a.answered_by == name and not a.retried
        assert (a.prompt_tokens, a.completion_tokens, a.finish_reason) == (14, 10, "length")
        assert a.latency_s > 0
    assert len({a.text for a in answers}) == 3  # three models, three answers


def test_a_model_gone_or_cut_off_is_asked_of_another_that_answered(
    warm: dict[str, int], raw_port: tuple[int, list[socket.socket], list[str]]
) -> None:
    cut, _, _ = raw_port
    gone = free_port()  # nothing listens: a server a rotation stopped
    endpoints = [
        Endpoint("m-a", url(warm["m-a"])),
        Endpoint("gone", url(gone), model="m-b"),
        Endpoint("cut", url(cut), model="m-c"),
        Endpoint("moved", url(warm["m-b"])),  # its port serves m-b now
    ]
    answers = ask_all(endpoints, "x = ", max_tokens=4)
    assert [a.name for a in answers] == ["m-a", "gone", "cut", "moved"]
    assert all(a.ok for a in answers), answers
    assert [(a.answered_by, a.retried) for a in answers] == [
        ("m-a", False),
        ("m-a", True),
        ("m-a", True),
        ("m-a", True),
    ]
    assert answers[1].text == answers[0].text  # m-a's answer, asked again
    # The time lost on the model that could not answer is the rotation's cost, counted apart.
    assert answers[0].waited_s == 0.0 and all(a.waited_s > 0 for a in answers[1:])
    first = ask_all(endpoints, "x = ", max_tokens=4, retry=False)
    assert [a.kind for a in first] == [None, "refused", "reset", "moved"]
    assert "connection refused" in (first[1].error or "") and "cut mid-request" in (first[2].error or "")
    assert "HTTP 404" in (first[3].error or "") and "holds 'm-b'" in (first[3].error or "")


def test_a_model_still_loading_is_unavailable_and_asked_of_another(
    warm: dict[str, int], tmp_path: Path
) -> None:
    make_model(str(tmp_path / "late"), 0, seed=9, config=CONFIG)
    loading = Server(0, Model("late", str(tmp_path / "late"), "cpu"), address="127.0.0.1")
    threading.Thread(target=loading.serve_forever, daemon=True).start()
    try:
        late = Endpoint("late", url(int(loading.server_address[1])))
        alone = complete(late, "x")
        assert alone.kind == "unavailable" and "HTTP 503" in (alone.error or "") and "loading" in alone.error
        answers = ask_all([late, Endpoint("m-b", url(warm["m-b"]))], "x", max_tokens=3)
        assert answers[0].ok and answers[0].answered_by == "m-b" and answers[0].retried
    finally:
        loading.shutdown()
        loading.server_close()


def test_a_refusal_is_the_models_own_answer_and_a_timeout_is_asked_of_another_model(
    warm: dict[str, int], raw_port: tuple[int, list[socket.socket], list[str]]
) -> None:
    port, held, mode = raw_port
    mode[0] = "silent"
    endpoints = [
        Endpoint("m-a", url(warm["m-a"])),
        Endpoint("wrong", f"http://127.0.0.1:{warm['m-b']}/v2"),  # no such path: a 404 of its own
        Endpoint("silent", url(port), timeout_s=0.5),
    ]
    answers = ask_all(endpoints, "x", max_tokens=2)
    assert answers[0].ok
    assert answers[1].kind == "http" and "HTTP 404" in (answers[1].error or "") and not answers[1].retried
    silent = answers[2]
    assert silent.ok and silent.retried and silent.answered_by == "m-a" and silent.text == answers[0].text
    assert silent.waited_s >= 0.5  # the timeout, counted apart from m-a's own latency
    assert held  # the silent port really took the request
    (alone,) = ask_all(endpoints[2:], "x", max_tokens=2)  # no model answered: nobody to ask instead
    assert alone.kind == "timeout" and not alone.retried and alone.answered_by == "silent"


def test_a_server_sigkilled_mid_request_is_answered_by_another_model(
    warm: dict[str, int], tmp_path: Path
) -> None:
    """A real server process killed while it generates (never before or after)."""
    result: list[Any] = []
    with slow_server(tmp_path, 3, stderr=subprocess.DEVNULL) as (proc, port):
        endpoints = [Endpoint("slow", url(port)), Endpoint("m-c", url(warm["m-c"]))]
        asking = in_flight(port, lambda: result.append(ask_all(endpoints, "y", max_tokens=64)))
        os.kill(proc.pid, signal.SIGKILL)
        asking.join(60)
    slow_answer, other = result[0]
    assert other.ok and slow_answer.ok, slow_answer
    assert slow_answer.name == "slow" and slow_answer.answered_by == "m-c" and slow_answer.retried
    assert slow_answer.text == other.text  # m-c's greedy answer to the same prompt


def test_scores_match_the_servers_own_and_models_are_listed(warm: dict[str, int]) -> None:
    ep = Endpoint("m-a", url(warm["m-a"]))
    got = score(ep, "hello orchestra")
    native = call(warm["m-a"], "POST", "/score", {"text": "hello orchestra"})[1]
    assert got.ok and got.tokens == native["tokens"]
    assert got.mean_logprob is not None and math.isclose(
        got.mean_logprob, native["mean_logprob"], rel_tol=1e-6
    )
    assert not score(ep, "h").ok  # one token: nothing to score
    assert models(ep) == ["m-a"]
    down = score(Endpoint("gone", url(free_port())), "hello")
    assert not down.ok and "connection refused" in (down.error or "")


class FakeApi(BaseHTTPRequestHandler):
    """A stand-in for a completions API: subclasses say what each request gets."""

    def answer(self, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


class Recording(FakeApi):
    seen: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Recording.seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        if self.path.endswith("/chat/completions"):
            self.answer(
                {"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}
            )
        else:
            self.answer({"choices": [{"text": "ok", "finish_reason": "stop"}]})


def test_a_remote_tier_gets_its_key_as_a_bearer_token_its_model_id_and_never_shows_the_key() -> None:
    Recording.seen.clear()
    httpd = HTTPServer(("127.0.0.1", 0), Recording)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        ep = Endpoint(
            "hosted",
            f"http://127.0.0.1:{httpd.server_address[1]}/api/v1/",
            model="gpt-x",
            api_key="sk-S3CRET",
        )
        (answer,) = ask_all([ep], "print(", max_tokens=5, seed=3, stop=["\n"])
        assert answer.ok and answer.text == "ok" and answer.prompt_tokens == 0  # no usage: counted as 0
        (seen,) = Recording.seen
        assert seen["path"] == "/api/v1/completions" and seen["auth"] == "Bearer sk-S3CRET"
        assert seen["body"] == {
            "model": "gpt-x", "prompt": "print(", "max_tokens": 5, "temperature": 0.0, "seed": 3, "stop": ["\n"],
        }  # fmt: skip
        assert "S3CRET" not in repr(ep) and "S3CRET" not in json.dumps(answer.as_dict())
    finally:
        httpd.shutdown()
        httpd.server_close()
    with pytest.raises(ValueError, match="not an http"):
        Endpoint("bad", "10.0.0.5:8101/v1")


def test_a_worker_without_labctl_installed_imports_the_client_from_the_agent_zipapp(
    warm: dict[str, int], tmp_path: Path
) -> None:
    data, _ = agent_zip()
    zipapp = tmp_path / "agent.pyz"
    zipapp.write_bytes(data)
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(zipapp)!r})\n"
        "from labctl.agent.orchestra.client import Endpoint, ask_all\n"
        f"a, = ask_all([Endpoint('m-a', {url(warm['m-a'])!r})], 'def f():', max_tokens=6)\n"
        "import labctl\n"
        "print(json.dumps({'text': a.text, 'from': labctl.__file__}))\n"
    )
    # -I: no site-packages, no current folder; labctl can come from the zipapp only.
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    native = call(warm["m-a"], "POST", "/generate", {"prompt": "def f():", "max_tokens": 6})[1]
    assert out["text"] == native["text"] and out["from"].startswith(str(zipapp))


class Held(FakeApi):
    """Holds each request a moment and counts how many are in flight at once; answers with usage."""

    lock = threading.Lock()
    now: ClassVar[list[int]] = [0]
    most: ClassVar[list[int]] = [0]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        with Held.lock:
            Held.now[0] += 1
            Held.most[0] = max(Held.most[0], Held.now[0])
        time.sleep(0.3)
        with Held.lock:
            Held.now[0] -= 1
        usage = {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}
        self.answer({"choices": [{"text": "x", "finish_reason": "length"}], "usage": usage})


def test_a_tiers_concurrency_holds_across_threads_and_each_answer_carries_its_cost() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Held)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        price = {"input": 0.15, "output": 0.6}
        ep = Endpoint("hosted", base, model="m-limited", concurrency=2, price_per_mtok=price)
        # Six trainer threads at once, each with its own Endpoint for the same API and model.
        answers: list[Any] = []
        threads = [
            threading.Thread(
                target=lambda: answers.extend(ask_all([Endpoint("hosted", base, "m-limited")], "q"))
            )
            for _ in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(answers) == 6 and all(a.ok for a in answers)
        assert Held.most[0] == 2  # never more than the tier allows, and not one at a time either
        (priced,) = ask_all([ep], "q")
        assert math.isclose(priced.cost_usd, (1000 * 0.15 + 500 * 0.6) / 1e6)
        assert answers[0].cost_usd == 0.0  # an endpoint without a price costs nothing
        with pytest.raises(ValueError, match="concurrency"):
            Endpoint("bad", base, concurrency=0)
    finally:
        httpd.shutdown()
        httpd.server_close()


class Scripted(FakeApi):
    """A stand-in whose server scripts each path: {path: (status, doc, seconds before answering)};
    a path it does not script gets FastAPI's bare 404. Every request is recorded."""

    server: ScriptedApi

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append({"path": self.path, "body": body})
        status, doc, delay = self.server.script.get(self.path, (404, {"detail": "Not Found"}, 0.0))
        time.sleep(delay)
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class ScriptedApi(ThreadingHTTPServer):
    def __init__(self, script: dict[str, tuple[int, Any, float]]) -> None:
        super().__init__(("127.0.0.1", 0), Scripted)
        self.script = script
        self.seen: list[dict[str, Any]] = []


@contextmanager
def stand_in(script: dict[str, tuple[int, Any, float]]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(its /v1 URL, the requests it got) for a ScriptedApi serving in a thread."""
    httpd = ScriptedApi(script)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", httpd.seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def chat_answer(content: Any, finish: str = "stop") -> dict[str, Any]:
    return {
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    }


TEXT_ANSWER = {"choices": [{"text": "ok", "finish_reason": "stop"}]}
# What OpenAI answers a chat-only model asked for a completion.
CHAT_ONLY_404 = {
    "error": {
        "message": "This is a chat model and not supported in the v1/completions endpoint. "
        "Did you mean to use v1/chat/completions?",
        "type": "invalid_request_error",
        "param": "model",
        "code": None,
    }
}


def test_a_chat_tier_is_asked_on_chat_completions_with_the_prompt_as_the_users_message() -> None:
    script = {
        "/v1/completions": (404, CHAT_ONLY_404, 0.0),
        "/v1/chat/completions": (200, chat_answer("```python\nprint(1)\n```"), 0.0),
    }
    with stand_in(script) as (base, seen):
        price = {"input": 1.0, "output": 2.0}
        as_completion = Endpoint("hosted", base, model="gpt-x", price_per_mtok=price)
        (refused,) = ask_all([as_completion], "def f():", max_tokens=7)
        assert (
            refused.kind == "http" and "HTTP 404" in (refused.error or "") and "chat model" in refused.error
        )
        chat = Endpoint("hosted", base, model="gpt-x", price_per_mtok=price, api="chat")
        (answer,) = ask_all([chat], "def f():", max_tokens=7, stop=["\n\n"])
        assert answer.ok and answer.text == "```python\nprint(1)\n```" and answer.finish_reason == "stop"
        assert (answer.prompt_tokens, answer.completion_tokens) == (12, 3)
        assert math.isclose(answer.cost_usd, (12 * 1.0 + 3 * 2.0) / 1e6)
        assert seen[-1] == {
            "path": "/v1/chat/completions",
            "body": {
                "model": "gpt-x",
                "messages": [{"role": "user", "content": "def f():"}],
                "max_tokens": 7,
                "temperature": 0.0,
                "stop": ["\n\n"],
            },
        }
        # No content (a refusal, or cut off while reasoning): an empty answer, not a broken one.
        script["/v1/chat/completions"] = (200, chat_answer(None, "length"), 0.0)
        (empty,) = ask_all([chat], "q")
        assert empty.ok and empty.text == "" and empty.finish_reason == "length"
        script["/v1/chat/completions"] = (200, TEXT_ANSWER, 0.0)  # a completion's shape on the chat path
        (broken,) = ask_all([chat], "q")
        assert broken.kind == "bad_answer" and "choices[0].message" in (broken.error or "")
    with pytest.raises(ValueError, match="api must be one of completions, chat"):
        Endpoint("bad", base, api="responses")


def test_stop_sequences_go_out_on_both_apis_and_more_than_four_are_refused_before_asking() -> None:
    script = {
        "/v1/completions": (200, TEXT_ANSWER, 0.0),
        "/v1/chat/completions": (200, chat_answer("ok"), 0.0),
    }
    with stand_in(script) as (base, seen):
        endpoints = [Endpoint("base", base, "m1"), Endpoint("instruct", base, "m2", api="chat")]
        stops = ["\n\n", "```", "# Task", "if __name__"]
        answers = ask_all(endpoints, "q", stop=stops)
        assert all(a.ok for a in answers)
        assert sorted((r["path"], r["body"]["stop"]) for r in seen) == [
            ("/v1/chat/completions", stops),
            ("/v1/completions", stops),
        ]
        for bad in ([*stops, "five"], ["\n", ""]):
            with pytest.raises(ValueError, match="at most 4 non-empty texts"):
                ask_all(endpoints, "q", stop=bad)
        assert len(seen) == 2  # a refused list asks nobody


def test_labctls_server_cuts_its_answer_at_a_stop_sequence(warm: dict[str, int]) -> None:
    ep = Endpoint("m-a", url(warm["m-a"]))
    (whole,) = ask_all([ep], "x = ", max_tokens=16)
    text = whole.text or ""
    # A printable character past the first: the answer up to it is what a stop there leaves.
    at = next(i for i, c in enumerate(text) if i > 0 and c.isascii() and c.isprintable())
    (cut,) = ask_all([ep], "x = ", max_tokens=16, stop=[text[at]])
    assert cut.ok and cut.text == text[: text.index(text[at])] and cut.finish_reason == "stop"


VLLM_NO_MODEL = "The model `m-x` does not exist."


def test_vllms_wrong_model_404_is_read_as_moved_and_asked_of_another_model(warm: dict[str, int]) -> None:
    """vLLM words a model its port does not hold as a NotFoundError, nested under "error" (0.6 and
    later) or at the top of the document (before): a rotation's mark, like labctl's own 404."""
    vllm = {"message": VLLM_NO_MODEL, "type": "NotFoundError", "param": None, "code": 404}
    with (
        stand_in({"/v1/completions": (404, {"error": vllm}, 0.0)}) as (nested, _),
        stand_in({"/v1/completions": (404, {"object": "error", **vllm}, 0.0)}) as (flat, _),
        stand_in({}) as (no_route, _),
        stand_in({"/v1/completions": (404, CHAT_ONLY_404, 0.0)}) as (chat_only, _),
    ):
        endpoints = [
            Endpoint("m-a", url(warm["m-a"])),
            Endpoint("vllm-new", nested, model="m-x"),
            Endpoint("vllm-old", flat, model="m-x"),
            Endpoint("no-route", no_route),
            Endpoint("chat-only", chat_only),
        ]
        first = ask_all(endpoints, "x", max_tokens=3, retry=False)
        assert [a.kind for a in first] == [None, "moved", "moved", "http", "http"]
        assert first[1].error == f"HTTP 404: {VLLM_NO_MODEL}" and first[3].error == "HTTP 404: Not Found"
        answers = ask_all(endpoints, "x", max_tokens=3)
    assert [(a.answered_by, a.retried) for a in answers[:3]] == [("m-a", False), ("m-a", True), ("m-a", True)]
    assert answers[1].text == answers[2].text == answers[0].text
    assert not answers[3].ok and not answers[4].ok  # a 404 of its own is the model's answer


def test_a_retried_answers_latency_is_the_answering_models_own_and_the_time_lost_is_waited() -> None:
    draining = {"error": {"message": "draining", "type": "server_error", "param": None, "code": None}}
    with (
        stand_in({"/v1/completions": (503, draining, 0.6)}) as (slow_503, _),
        stand_in({"/v1/completions": (200, TEXT_ANSWER, 0.0)}) as (fast, _),
    ):
        answers = ask_all([Endpoint("leaving", slow_503), Endpoint("fast", fast)], "q")
    leaving, other = answers
    assert leaving.ok and leaving.retried and leaving.answered_by == "fast"
    assert leaving.waited_s >= 0.6 and leaving.latency_s < 0.5  # fast's own time, not the sum
    assert other.latency_s < 0.5


@pytest.fixture(scope="module")
def hf_port(tiny_hf_model: Path) -> Iterator[int]:
    """labctl's server holding the session's tiny Llama (a ChatML template), ready, in this process."""
    model = open_model("tiny-llama", str(tiny_hf_model), "cpu")
    model.load()
    model.warm()
    httpd = Server(0, model, address="127.0.0.1")
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_chat_endpoint_gets_labctls_servers_own_chat_answer_and_a_tinylm_refuses_chat(
    hf_port: int, warm: dict[str, int]
) -> None:
    chat = Endpoint("tiny-llama", url(hf_port), api="chat")
    answer = complete(chat, "def add(a, b):", max_tokens=12)
    body = {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": "def add(a, b):"}],
        "max_tokens": 12,
    }
    code, native = call(hf_port, "POST", "/v1/chat/completions", dict(body, temperature=0.0))
    assert code == 200 and answer.ok, answer
    assert answer.text == native["choices"][0]["message"]["content"]
    assert answer.finish_reason == native["choices"][0]["finish_reason"]
    assert answer.completion_tokens == native["usage"]["completion_tokens"]
    # The same prompt as a completion is another request: the template wraps the chat's.
    assert (
        answer.prompt_tokens
        > complete(Endpoint("tiny-llama", url(hf_port)), "def add(a, b):", 1).prompt_tokens
    )
    text = answer.text or ""
    at = next(i for i, c in enumerate(text) if i > 0 and c.isascii() and c.isalnum())
    cut = complete(chat, "def add(a, b):", max_tokens=12, stop=[text[at]])
    assert cut.ok and cut.text == text[: text.index(text[at])] and cut.finish_reason == "stop"
    (tiny,) = ask_all([Endpoint("m-a", url(warm["m-a"]), api="chat")], "x")
    assert tiny.kind == "http" and "HTTP 400" in (tiny.error or "") and "no chat template" in tiny.error
