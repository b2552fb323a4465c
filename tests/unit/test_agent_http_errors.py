"""The agent's HTTP servers (httpjson.JsonHandler: the sandbox service, labctl's model server)
answer every request, in each endpoint's own error shape: a body nested too deeply for the JSON
parser is a 400, an error no handler expected is a 500, and the server goes on serving."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from labctl.agent.modelload.modelgen import make_model
from labctl.agent.models.tinylm import make_config
from labctl.agent.orchestra import server as orchestra_server
from labctl.agent.orchestra.server import Model
from labctl.agent.sandbox import service as sandbox_service

TOKEN = "t0ken-for-the-tests-only-0123456789"
CONFIG = make_config(vocab=256, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq=64)


def call(port: int, method: str, path: str, raw: bytes = b"", token: str | None = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        conn.request(method, path, body=raw if method == "POST" else None, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


class FakeService:
    """What the sandbox service's handler asks of its service, without Docker: every program passes."""

    def __init__(self) -> None:
        self.state = "ready"
        self.langs: dict[str, Any] = {"python": {}}

    def authorized(self, header: str | None) -> bool:
        return header == f"Bearer {TOKEN}"

    def batch(self, programs: list[dict[str, Any]]) -> dict[str, Any]:
        results = [{"lang": p["lang"], "passed": len(p["tests"]), "total": len(p["tests"])} for p in programs]
        return {"results": results, "took_ms": 0.0}

    def health(self) -> dict[str, Any]:
        return {"state": self.state}


@pytest.fixture
def sandbox() -> Iterator[int]:
    httpd = sandbox_service.Server("127.0.0.1", 0, FakeService())  # type: ignore[arg-type]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()


GOOD_BATCH = json.dumps({"programs": [{"lang": "python", "source": "print(1)", "tests": [{"stdin": ""}]}]})


def sandbox_answers_a_good_batch(port: int) -> bool:
    code, doc = call(port, "POST", "/v1/batch", GOOD_BATCH.encode(), TOKEN)
    return code == 200 and doc["results"][0]["passed"] == 1


def test_a_deeply_nested_batch_is_a_400_in_the_sandbox_services_shape(sandbox: int) -> None:
    code, doc = call(sandbox, "POST", "/v1/batch", b'{"programs": [' * 5000, TOKEN)
    assert code == 400 and isinstance(doc["error"], str) and "nested" in doc["error"]
    assert sandbox_answers_a_good_batch(sandbox)


def test_an_unexpected_error_in_the_sandbox_service_is_a_500_and_it_goes_on(
    sandbox: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(doc: Any, langs: Any) -> Any:
        raise KeyError("surprise")

    monkeypatch.setattr(sandbox_service, "check_batch", broken)
    code, doc = call(sandbox, "POST", "/v1/batch", GOOD_BATCH.encode(), TOKEN)
    assert code == 500 and isinstance(doc["error"], str) and "KeyError" in doc["error"]
    monkeypatch.undo()
    assert sandbox_answers_a_good_batch(sandbox)


@pytest.fixture(scope="module")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    path = tmp_path_factory.mktemp("model") / "tiny"
    make_model(str(path), 0, config=CONFIG)
    model = Model("tiny", str(path), "cpu")
    model.check()
    model.load()
    model.warm()
    httpd = orchestra_server.Server(0, model, address="127.0.0.1")
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()


def model_answers_a_completion(port: int) -> bool:
    body = json.dumps({"model": "tiny", "prompt": "a", "max_tokens": 2}).encode()
    code, doc = call(port, "POST", "/v1/completions", body)
    return code == 200 and doc["choices"][0]["text"] is not None


def test_a_deeply_nested_completion_is_a_400_in_the_openai_shape(model_server: int) -> None:
    code, doc = call(model_server, "POST", "/v1/completions", b"[" * 100_000)
    assert code == 400 and doc["error"]["type"] == "invalid_request_error"
    assert "nested" in doc["error"]["message"]
    # labctl's own endpoints keep their own shape.
    code, doc = call(model_server, "POST", "/score", b"[" * 100_000)
    assert code == 400 and isinstance(doc["error"], str) and "nested" in doc["error"]
    assert model_answers_a_completion(model_server)


def test_an_unexpected_error_in_the_model_server_is_a_500_in_the_openai_shape_and_it_goes_on(
    model_server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Any) -> Any:
        raise KeyError("surprise")

    # Outside every handler's own try: only the shared dispatch can answer it.
    monkeypatch.setattr(orchestra_server.Handler, "model", property(broken))
    code, doc = call(model_server, "POST", "/v1/completions", b"{}")
    assert code == 500 and doc["error"]["type"] == "server_error" and "KeyError" in doc["error"]["message"]
    code, doc = call(model_server, "GET", "/health")
    assert code == 500 and isinstance(doc["error"], str) and "KeyError" in doc["error"]
    monkeypatch.undo()
    assert model_answers_a_completion(model_server)


def test_the_line_servers_take_a_deeply_nested_line_as_a_malformed_one() -> None:
    """The cache server and the network sink close the connection on a line that is not a JSON
    object (ValueError); one nested too deeply must not kill the handler's thread instead."""
    import io
    import socket

    from labctl.agent.cache.serve import read_line
    from labctl.agent.netbench.transfer import _read_line

    with pytest.raises(ValueError, match="nested"):
        read_line(io.BytesIO(b"[" * 60_000 + b"\n"))
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"[" * 4000 + b"\n")  # within the sink's 4 KiB line
        with pytest.raises(ValueError, match="nested"):
            _read_line(b)
