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
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from labctl.agent.modelload.modelgen import make_model
from labctl.agent.orchestra.client import Endpoint, ask_all, complete, models, score
from labctl.agent.orchestra.server import Model, Server
from labctl.agent.tinylm import make_config
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
    assert answers[0].waited_s == 0.0 and all(0 < a.waited_s < a.latency_s for a in answers[1:])
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


def test_a_refusal_or_a_timeout_is_the_models_own_answer_and_is_not_retried(
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
    assert answers[2].kind == "timeout" and not answers[2].retried and answers[2].answered_by == "silent"
    assert held  # the silent port really took the request


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
