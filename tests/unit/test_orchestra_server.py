"""labctl's own model server (labctl/agent/orchestra/server.py): a real tinylm checkpoint, real
HTTP on this machine, torch on the CPU; one server in this process (its stages stepped by hand)
and one as a real process."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.modelload.modelgen import make_model
from labctl.agent.models.tinylm import make_config
from labctl.agent.orchestra.server import Model, Server

REPO = Path(__file__).resolve().parents[2]
CONFIG = make_config(vocab=256, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq=64)


def call(port: int, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        conn.request(method, path, body=data)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def wait_ready(port: int, proc: subprocess.Popen[str] | None = None) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc is None or proc.poll() is None, proc.communicate()
        try:
            code, doc = call(port, "GET", "/health")
        except OSError:
            code, doc = 0, None
        if code == 200:
            return dict(doc)
        time.sleep(0.1)
    raise AssertionError(f"port {port} never became healthy")


def server_argv(model_dir: Path, port: int, name: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "labctl.agent.orchestra.server",
        "--model-dir",
        str(model_dir),
        "--port",
        str(port),
        "--name",
        name,
        *extra,
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Big enough that 64 tokens take seconds on the CPU (no KV cache): a signal lands mid-request.
SLOW = make_config(vocab=256, d_model=256, n_layers=4, n_heads=4, d_ff=1024, max_seq=256)


@contextmanager
def slow_server(folder: Path, seed: int, **popen: Any) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A ready server process holding a SLOW model: (the process, its port); killed after."""
    make_model(str(folder / "slow"), 0, seed=seed, config=SLOW)
    port = free_port()
    proc = subprocess.Popen(server_argv(folder / "slow", port, "slow", "--device", "cpu"), cwd=REPO, **popen)
    try:
        wait_ready(port)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def in_flight(port: int, request: Callable[[], None]) -> threading.Thread:
    """`request` started in a thread; returns once the server counts it in flight (its /health's
    `in_flight`: past the state check, being worked on), so a signal sent next lands mid-request,
    never before it or after. A thread seen in /proc was not enough: a stop that lands between the
    accept and the state check is rightly answered 503."""
    asking = threading.Thread(target=request)
    asking.start()
    deadline = time.monotonic() + 30
    while call(port, "GET", "/health")[1].get("in_flight", 0) < 1:
        assert time.monotonic() < deadline and asking.is_alive(), "the request never reached the server"
        time.sleep(0.002)
    return asking


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny"
    make_model(str(path), 0, config=CONFIG)
    return path


class InProcess:
    def __init__(self, port: int, steps: list[tuple[str, int, Any]]) -> None:
        self.port = port
        self.steps = steps


@pytest.fixture(scope="module")
def served(model_dir: Path) -> Iterator[InProcess]:
    """A server in this process; its health (and a /generate) recorded before each stage."""
    model = Model("tiny", str(model_dir), "cpu")
    httpd = Server(0, model, address="127.0.0.1")
    port = int(httpd.server_address[1])
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    steps: list[tuple[str, int, Any]] = []
    try:
        steps.append(("bound", *call(port, "GET", "/health")))
        steps.append(("bound /generate", *call(port, "POST", "/generate", {"prompt": "a"})))
        model.check()
        model.load()
        steps.append(("loaded", *call(port, "GET", "/health")))
        model.warm()
        steps.append(("warmed", *call(port, "GET", "/health")))
        yield InProcess(port, steps)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_health_is_503_until_loaded_and_warmed_then_200_with_the_stage_times(served: InProcess) -> None:
    (_, c0, d0), (_, g0, gd0), (_, c1, d1), (_, c2, d2) = served.steps
    assert (c0, d0["state"]) == (503, "loading")
    assert (g0, gd0["state"]) == (503, "loading")  # no answers before the model is ready either
    assert (c1, d1["state"]) == (503, "warming")
    assert c2 == 200 and d2["state"] == "ready" and d2["name"] == "tiny" and d2["device"] == "cpu"
    assert d2["load_s"] > 0 and d2["warmup_s"] > 0
    assert d2["params"] > 0 and d2["memory_bytes"] == 2 * d2["params"]  # bf16 weights on the CPU
    assert d2["in_flight"] == 0  # nothing asked yet


def test_generate_and_score_answer_from_the_model_and_repeat_exactly(served: InProcess) -> None:
    code, gen = call(served.port, "POST", "/generate", {"prompt": "the lab", "max_tokens": 12})
    assert code == 200 and len(gen["tokens"]) == 12 and all(0 <= t < 256 for t in gen["tokens"])
    assert (
        call(served.port, "POST", "/generate", {"prompt": "the lab", "max_tokens": 12})[1]["tokens"]
        == gen["tokens"]
    )
    code, score = call(served.port, "POST", "/score", {"text": "hello orchestra"})
    assert code == 200 and score["tokens"] == len("hello orchestra") - 1 and score["mean_logprob"] < 0
    again = call(served.port, "POST", "/score", {"text": "hello orchestra"})[1]
    assert again["mean_logprob"] == score["mean_logprob"]
    other = call(served.port, "POST", "/score", {"text": "something else"})[1]
    assert other["mean_logprob"] != score["mean_logprob"]
    # Longer than max_seq in all: the context slides, the answer is still bounded.
    code, long = call(served.port, "POST", "/generate", {"prompt": "x" * 64, "max_tokens": 256})
    assert code == 200 and len(long["tokens"]) == 256


@pytest.mark.parametrize(
    ("path", "body", "code", "says"),
    [
        ("/generate", {"prompt": "x" * 65}, 400, "max_seq=64"),
        ("/generate", {"prompt": ""}, 400, "prompt is empty"),
        ("/generate", {"prompt": "a", "max_tokens": 257}, 400, "max_tokens"),
        ("/generate", {"prompt": "a", "max_tokens": "3"}, 400, "max_tokens"),
        ("/generate", {"prompt": 5}, 400, "prompt must be a string"),
        ("/score", {"text": "a"}, 400, "at least 2 tokens"),
        ("/score", [1, 2], 400, "JSON object"),
        ("/nothing", {}, 404, "/generate or /score"),
    ],
)
def test_bad_requests_are_refused_naming_what_to_fix(
    served: InProcess, path: str, body: Any, code: int, says: str
) -> None:
    got, doc = call(served.port, "POST", path, body)
    assert got == code and says in doc["error"]


def test_a_body_that_is_not_json_is_a_400(served: InProcess) -> None:
    code, doc = call(served.port, "POST", "/score", raw=b"{not json")
    assert code == 400 and doc["error"]


def test_a_server_process_answers_like_this_one_and_sigterm_stops_it_with_rc_0_freeing_the_port(
    served: InProcess, model_dir: Path
) -> None:
    port = free_port()
    proc = subprocess.Popen(
        server_argv(model_dir, port, "tiny", "--device", "cpu"),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        health = wait_ready(port, proc)
        assert health["params"] == dict(served.steps[-1][2])["params"]
        for path, body in (
            ("/generate", {"prompt": "the lab", "max_tokens": 12}),
            ("/score", {"text": "abc"}),
        ):
            mine, theirs = call(served.port, "POST", path, body)[1], call(port, "POST", path, body)[1]
            assert {k: v for k, v in mine.items() if k != "seconds"} == {
                k: v for k, v in theirs.items() if k != "seconds"
            }
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        events = [json.loads(line) for line in err.splitlines()]
        assert [e["event"] for e in events] == ["listening", "loaded", "ready", "stopping", "stopped"]
        # The log names who sent the signal: this test's own process.
        stopping = events[3]
        assert stopping["signal"] == "SIGTERM" and stopping["sender_pid"] == os.getpid()
        assert "pytest" in stopping["sender"] or sys.argv[0] in stopping["sender"]
        with socket.socket() as s:  # what a listener still there would refuse
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("0.0.0.0", port))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_model_that_cannot_load_ends_the_server_with_rc_1_and_one_line_why(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(CONFIG))
    (bad / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    proc = subprocess.run(
        server_argv(bad, free_port(), "bad"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    plain = [line for line in proc.stderr.splitlines() if not line.startswith("{")]
    assert len(plain) == 1 and plain[0].startswith(f"orchestra server bad: cannot load {bad}: ")
    assert "model.safetensors" in plain[0] and "Traceback" not in proc.stderr


def test_a_port_already_taken_ends_the_server_with_rc_1_naming_the_port(model_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            server_argv(model_dir, port, "tiny"),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 1
    assert (
        proc.stderr.strip() == f"orchestra server tiny: cannot listen on port {port}: Address already in use"
    )


def test_sigterm_while_loading_still_stops_it_with_rc_0(model_dir: Path) -> None:
    """A rotation that gives up on a joining server stops it mid-load: no traceback, rc 0."""
    proc = subprocess.Popen(
        server_argv(model_dir, free_port(), "tiny"), cwd=REPO, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        assert json.loads(proc.stderr.readline())["event"] == "listening"  # the handler is in place
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        assert proc.wait(60) == 0, rest
        assert [json.loads(line)["event"] for line in rest.splitlines()][-2:] == ["stopping", "stopped"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_completion_whose_client_hung_up_stops_and_frees_the_model(tmp_path: Path) -> None:
    """A trainer that gave up on an answer (its timeout) must not leave the model computing it
    while live requests queue behind: the server sees the closed connection and stops."""
    with slow_server(tmp_path, 7, stderr=subprocess.PIPE, text=True) as (proc, port):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=0.5)
        body = json.dumps({"model": "slow", "prompt": "x", "max_tokens": 250}).encode()
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        with pytest.raises(TimeoutError):
            conn.getresponse()  # 250 tokens of this model take seconds
        conn.close()
        status, doc = call(port, "POST", "/v1/completions", {"model": "slow", "prompt": "y", "max_tokens": 1})
        assert status == 200 and doc["choices"][0]["finish_reason"] == "length"
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert [e["route"] for e in events if e["event"] == "abandoned"] == ["/v1/completions"], err
