"""The Docker daemon's version over its unix socket (labctl/agent/core/dockersock.py), and the
facts section that asks it instead of starting the docker CLI on a host whose CLI talks to the
local daemon."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.core import dockersock
from labctl.agent.facts import collect


@pytest.fixture
def folder() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="ds", dir="/tmp"))  # short: a socket path is capped at 107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


class _UnixServer(HTTPServer):
    address_family = socket.AF_UNIX

    def server_bind(self) -> None:
        self.socket.bind(self.server_address)
        self.server_name, self.server_port = "docker", 0


def serve(path: Path, status: int, body: bytes) -> HTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            assert self.path == "/version"
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

        def address_string(self) -> str:
            return "docker"

    server = _UnixServer(str(path), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, json.dumps({"Version": "27.1.0", "ApiVersion": "1.46"}).encode(), ("27.1.0", None)),
        (500, b'{"message": "boom"}', (None, "answered HTTP 500")),
        (200, b"not json", (None, "named no version")),
        (200, b'{"ApiVersion": "1.46"}', (None, "named no version")),
    ],
    ids=["version", "http-500", "not-json", "no-version"],
)
def test_the_daemon_s_answer_is_read_or_named(
    folder: Path, status: int, body: bytes, expected: tuple[str | None, str | None]
) -> None:
    server = serve(folder / "d.sock", status, body)
    try:
        version, error = dockersock.server_version(str(folder / "d.sock"), 3.0)
    finally:
        server.shutdown()
        server.server_close()
    assert version == expected[0]
    assert (error is None) if expected[1] is None else (error is not None and expected[1] in error)


def test_a_socket_nobody_listens_on_or_no_socket_is_a_daemon_not_running(folder: Path) -> None:
    stale = folder / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))
    s.close()  # the file stays, nobody listens: the kernel refuses
    for path in (stale, folder / "missing.sock"):
        assert dockersock.server_version(str(path), 3.0) == (
            None,
            f"Cannot connect to the Docker daemon at unix://{path}. Is the docker daemon running?",
        )


def test_a_daemon_that_never_answers_is_a_timeout(folder: Path) -> None:
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(str(folder / "mute.sock"))
    mute.listen(1)
    try:
        assert dockersock.server_version(str(folder / "mute.sock"), 0.3) == (None, "timeout")
    finally:
        mute.close()


def _cli_version() -> str | None:
    if shutil.which("docker") is None:
        return None
    try:
        p = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=15,
        )
    except subprocess.TimeoutExpired:
        return None
    return p.stdout.strip() if p.returncode == 0 and p.stdout.strip() else None


def test_the_real_daemon_answers_what_the_cli_says() -> None:
    cli = _cli_version()
    if cli is None or os.environ.get("DOCKER_HOST"):
        pytest.skip("no local Docker daemon answering here")
    assert dockersock.server_version() == (cli, None)


def test_facts_ask_the_socket_and_start_no_docker_cli(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = serve(folder / "d.sock", 200, b'{"Version": "26.0.0"}')
    monkeypatch.setattr(collect, "DOCKER_SOCKET", str(folder / "d.sock"))
    monkeypatch.setattr(collect.shutil, "which", lambda name: "/usr/bin/docker")
    for var in ("DOCKER_HOST", "DOCKER_CONTEXT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(folder / "no-config"))

    def no_cli(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the docker CLI was started: {args}")

    monkeypatch.setattr(collect.subprocess, "run", no_cli)
    try:
        facts = collect.docker_facts()
    finally:
        server.shutdown()
        server.server_close()
    assert facts == {"cli": "/usr/bin/docker", "socket": True, "server_version": "26.0.0"}


@pytest.mark.parametrize("elsewhere", ["DOCKER_HOST", "DOCKER_CONTEXT", "config"])
def test_facts_ask_the_cli_when_it_talks_to_another_daemon(
    folder: Path, monkeypatch: pytest.MonkeyPatch, elsewhere: str
) -> None:
    (folder / "d.sock").touch()
    monkeypatch.setattr(collect, "DOCKER_SOCKET", str(folder / "d.sock"))
    monkeypatch.setattr(collect.shutil, "which", lambda name: "/usr/bin/docker")
    for var in ("DOCKER_HOST", "DOCKER_CONTEXT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(folder))
    if elsewhere == "config":
        (folder / "config.json").write_text(json.dumps({"currentContext": "remote"}))
    else:
        monkeypatch.setenv(elsewhere, "ssh://builder" if elsewhere == "DOCKER_HOST" else "remote")
    asked: list[list[str]] = []

    def cli(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        asked.append(argv)
        return subprocess.CompletedProcess(argv, 0, "25.0.3\n", "")

    monkeypatch.setattr(collect.subprocess, "run", cli)
    assert collect.docker_facts()["server_version"] == "25.0.3"
    assert asked == [["/usr/bin/docker", "version", "--format", "{{.Server.Version}}"]]
