"""The host's side of the engine contract (labctl/agent/orchestra/host.py): orchestra.start finds
the engine's program (a path, PATH, labctl's install root) and refuses a build whose CUDA archs
do not cover the card; orchestra.health reads an engine's "Loading model" 503 as loading and calls
a server ready only once a one-token completion answered. Real agent processes from the zipapp,
a real stand-in engine over HTTP on this machine."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.core.errors import AgentError
from labctl.agent.orchestra import engine_host
from labctl.agent.orchestra import host as orch_host
from labctl.orchestra.engines import engine
from tests.unit import test_orchestra_agent as base
from tests.unit.test_orchestra_agent import Agent

# An engine stand-in: /health says 503 "Loading model" (llama-server's words) for its first
# LOADING health calls, then 200; POST /v1/completions fails FAIL times, then answers one token.
# Every completion body it got is appended to CALLS, so a test reads what readiness asked.
ENGINE = textwrap.dedent(
    """\
    #!{python}
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    LOADING, FAIL, CALLS = {loading}, {fail}, {calls!r}
    seen = {{"health": 0, "done": 0}}
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def send(self, code, doc):
            body = json.dumps(doc).encode()
            self.send_response(code); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
        def do_GET(self):
            seen["health"] += 1
            if seen["health"] <= LOADING:
                self.send(503, {{"error": {{"code": 503, "message": "Loading model", "type": "unavailable_error"}}}})
            else:
                self.send(200, {{"status": "ok"}})
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with open(CALLS, "a") as f:
                f.write(json.dumps(body) + "\\n")
            seen["done"] += 1
            if seen["done"] <= FAIL:
                self.send(500, {{"error": {{"message": "kernel not ready"}}}})
            else:
                self.send(200, {{"choices": [{{"text": "x", "finish_reason": "length"}}], "model": args["--alias"]}})
    HTTPServer(("127.0.0.1", int(args["--port"])), H).serve_forever()
    """
)


# The agent fixtures of the orchestra's agent tests: the shipped zipapp, host paths in tmp_path.
pyz = base.pyz
agent = base.agent


def fake_engine(tmp_path: Path, loading: int, fail: int) -> tuple[Path, Path]:
    calls = tmp_path / "calls.jsonl"
    exe = tmp_path / "bin" / "llama-server"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text(ENGINE.format(python=sys.executable, loading=loading, fail=fail, calls=str(calls)))
    exe.chmod(0o755)
    return exe, calls


def gguf_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "coder-q8"
    folder.mkdir()
    (folder / "model.gguf").write_bytes(b"GGUF")
    return folder


def start(agent: Agent, exe: Path, folder: Path, **extra: Any) -> dict[str, Any]:
    args = engine("llama.cpp").start_args("coder-q8", 512, None)
    return agent.run(
        "orchestra.start",
        {
            "host": agent.host,
            "model": "coder-q8",
            "gpu": None,
            "path": str(folder),
            **args,
            "binary": str(exe),
            **extra,
        },
    )[1]


def test_llama_server_is_started_with_the_gguf_file_every_interface_and_the_alias(
    agent: Agent, tmp_path: Path
) -> None:
    exe, calls = fake_engine(tmp_path, loading=2, fail=1)
    folder = gguf_folder(tmp_path)
    started = start(agent, exe, folder)
    assert "error" not in started, started
    line = started["argv"][2]
    assert line.startswith(
        f"{exe} -m {folder}/model.gguf --host 0.0.0.0 --port {started['port']} --alias coder-q8"
    )
    servers = [
        {"model": "coder-q8", "port": started["port"], "pid": started["pid"], "health_path": "/health",
         "loading_words": ["loading model"], "ready_by_completion": True}
    ]  # fmt: skip
    _, doc, err = agent.run("orchestra.health", {"host": agent.host, "servers": servers, "timeout": 60})
    result = doc["results"][0]
    assert result["healthy"] and result["state"] == "ready", result
    states = [json.loads(x).get("state") for x in err.splitlines() if x.startswith("{")]
    assert "loading" in states  # the 503 "Loading model" is shown as loading
    asked = [json.loads(x) for x in calls.read_text().splitlines()]
    # Health passed before the first completion did: ready came only after one answered.
    assert len(asked) == 2 and all(a["max_tokens"] == 1 and a["model"] == "coder-q8" for a in asked)
    agent.ok("orchestra.stop", {"host": agent.host, "models": ["coder-q8"], "grace": 5})


def test_an_engine_whose_completion_never_answers_is_not_ready(agent: Agent, tmp_path: Path) -> None:
    exe, _ = fake_engine(tmp_path, loading=0, fail=10_000)
    started = start(agent, exe, gguf_folder(tmp_path))
    servers = [
        {"model": "coder-q8", "port": started["port"], "pid": started["pid"], "ready_by_completion": True}
    ]
    result = agent.ok("orchestra.health", {"host": agent.host, "servers": servers, "timeout": 3})["results"][
        0
    ]
    assert not result["healthy"] and result["state"] == "timeout"
    # Without the completion check the same server passes: the check is what held it back.
    loose = [{**servers[0], "ready_by_completion": False}]
    assert agent.ok("orchestra.health", {"host": agent.host, "servers": loose, "timeout": 10})["results"][0][
        "healthy"
    ]
    agent.ok("orchestra.stop", {"host": agent.host, "models": ["coder-q8"], "grace": 5})


def test_a_host_without_the_engines_program_is_refused_naming_how_to_get_it(
    agent: Agent, tmp_path: Path
) -> None:
    doc = start(agent, tmp_path / "nowhere" / "llama-server", gguf_folder(tmp_path))
    assert doc["kind"] == "no_engine"
    assert "labctl provision -p playbooks/engines.yaml" in doc["error"]
    assert "server.binaries" in doc["error"]
    assert orch_host.server_processes(agent.lab, agent.host) == []


def test_a_gguf_folder_must_hold_exactly_one_gguf_file(tmp_path: Path) -> None:
    one = gguf_folder(tmp_path)
    assert engine_host.weights_file(str(one)) == str(one / "model.gguf")
    assert engine_host.weights_file(str(one / "model.gguf")) == str(one / "model.gguf")
    (one / "other.gguf").write_bytes(b"GGUF")
    with pytest.raises(AgentError, match=r"2 \.gguf files"):
        engine_host.weights_file(str(one))


def install(tmp_path: Path, archs: list[Any]) -> str:
    exe = tmp_path / "build" / "bin" / "llama-server"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    (tmp_path / "build" / "build.json").write_text(json.dumps({"version": "0.3.36", "cuda_archs": archs}))
    return str(exe)


@pytest.mark.parametrize(
    ("archs", "cap", "refused"),
    [
        ([], "6.1", "CPU-only build"),
        (["70", "75"], "6.1", "built for sm_70, sm_75"),
        ([61, 70], "6.1", None),
        (["60"], "6.1", None),  # an sm_60 cubin runs on 6.1
        (["sm_86"], "8.0", "built for sm_86"),
    ],
)
def test_a_llama_cpp_build_must_cover_the_placed_card_mock_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, archs: list[Any], cap: str, refused: str | None
) -> None:
    # No GPU on this machine: the card nvidia-smi would report is given (a mock, by name).
    monkeypatch.setattr(
        engine_host,
        "gather_gpus",
        lambda: ("nvidia-smi", [{"index": 1, "name": "Tesla P40", "compute_capability": cap}]),
    )
    exe = install(tmp_path, archs)
    if refused is None:
        engine_host.check_build_covers(exe, 1, "m5", "llama.cpp")
        return
    with pytest.raises(AgentError) as e:
        engine_host.check_build_covers(exe, 1, "m5", "llama.cpp")
    assert refused in e.value.message and "m5 GPU 1, a Tesla P40" in e.value.message.replace(
        "GPU 1 is a", "GPU 1, a"
    )
    assert "labctl provision -p playbooks/engines.yaml" in e.value.message


def test_the_program_is_found_on_path_then_under_labctls_install_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exe = install(tmp_path, [])
    monkeypatch.setenv("PATH", os.path.dirname(exe))
    assert engine_host.find_binary("llama-server", "m5", "llama.cpp") == exe
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setitem(engine_host.ENGINE_ROOTS, "llama-server", str(tmp_path))
    assert engine_host.find_binary("llama-server", "m5", "llama.cpp") == exe
