"""Phase 3's loop end to end on this machine's real parts: the reference trainer (tinylm on the
CPU) asks three real model servers and runs their code in the real sandbox service (Docker),
while the warm set rotates under it and a server is killed mid-request."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.sandbox.service import Server, Service
from labctl.sandbox.api import lang_spec
from labctl.sandbox.limits import Limits
from tests.conftest import ON_THIS_MACHINE, REPO

pytestmark = [pytest.mark.integration, ON_THIS_MACHINE]

ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def health(port: int) -> dict[str, Any]:
    """The server's /health document; a 503 (loading, warming, draining) is {"state": ...} too."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return json.load(r)  # type: ignore[no-any-return]
    except urllib.error.HTTPError as e:
        return json.load(e)  # type: ignore[no-any-return]


def healthy(port: int) -> bool:
    try:
        return health(port).get("state") == "ready"
    except (OSError, ValueError):
        return False


class Orchestra:
    """Model servers on this machine and the endpoints file a rotation would keep current."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.servers: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
        self.file = folder / "endpoints.json"

    def start(self, name: str, seed: int) -> None:
        from labctl.agent.modelload.modelgen import make_model
        from labctl.agent.models.tinylm import make_config

        config = make_config(vocab=256, d_model=64, n_layers=2, n_heads=2, d_ff=128, max_seq=512)
        make_model(str(self.folder / name), 0, seed=seed, config=config)
        port = free_port()
        argv = [sys.executable, "-m", "labctl.agent.orchestra.server", "--model-dir", str(self.folder / name),
                "--port", str(port), "--name", name, "--device", "cpu"]  # fmt: skip
        self.servers[name] = (subprocess.Popen(argv, env=ENV, stderr=subprocess.DEVNULL), port)
        deadline = time.monotonic() + 120
        while not healthy(port):
            assert time.monotonic() < deadline, f"{name} never became ready"
            time.sleep(0.1)

    def publish(self, names: list[str]) -> None:
        models = [
            {"name": n, "model": n, "base_url": f"http://127.0.0.1:{self.servers[n][1]}/v1", "host": "here"}
            for n in names
        ]
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"lab": "t", "models": models, "remote": []}))
        tmp.replace(self.file)  # as orchestra.publish does: a reader never sees half a file

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        proc, _ = self.servers.pop(name)
        proc.send_signal(sig)
        proc.wait(60)

    def kill_mid_request(self, name: str) -> None:
        """SIGKILL `name` once it is answering a request (its /health counts it in flight): not
        before the request, nor after the answer, whatever the machine's load."""
        port = self.servers[name][1]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if health(port).get("in_flight", 0) >= 1:
                self.stop(name, signal.SIGKILL)
                return
            time.sleep(0.005)

    def close(self) -> None:
        for proc, _ in self.servers.values():
            proc.kill()
            proc.wait()


@pytest.fixture
def lab(docker_images: dict[str, Any], tmp_path: Path) -> Iterator[tuple[Orchestra, Path]]:
    """Three warm servers and the sandbox service, with the files a training host holds."""
    orch = Orchestra(tmp_path)
    limits = Limits()
    token = "phase3-loop-test-token-0123456789"
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "token").chmod(0o600)
    svc = Service(
        {"python": lang_spec("python", limits)},
        limits.as_dict(),
        token.encode(),
        pool=3,
        concurrency=4,
        lab="phase3-loop-test",
    )
    httpd = Server("127.0.0.1", 0, svc)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    svc.warm()
    client = {"url": f"http://127.0.0.1:{httpd.server_address[1]}", "token_file": str(tmp_path / "token")}
    (tmp_path / "client.json").write_text(json.dumps(client))
    try:
        for i, name in enumerate(("m-a", "m-b", "m-c")):
            orch.start(name, i)
        orch.publish(["m-a", "m-b", "m-c"])
        yield orch, tmp_path
    finally:
        orch.close()
        httpd.shutdown()
        httpd.server_close()
        svc.close()


def trainer(folder: Path, steps: int, **rl: Any) -> subprocess.Popen[str]:
    settings = {
        "steps": steps,
        "batch_size": 4,
        "seq_len": 288,
        "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64},
        "log_every": 1,
        "checkpoint_dir": None,
        "metrics_path": str(folder / "metrics.jsonl"),
        "rl": {"tasks_per_step": 2, "answer_tokens": 16, **rl},
    }
    env = dict(
        ENV,
        LABCTL_ORCHESTRA_ENDPOINTS=str(folder / "endpoints.json"),
        LABCTL_SANDBOX_SERVICE=str(folder / "client.json"),
    )
    argv = [sys.executable, "-m", "labctl.agent.train.trainer", "--settings", json.dumps(settings)]
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
    )


def events(proc: subprocess.Popen[str], on_step: Any = None) -> list[dict[str, Any]]:
    """The trainer's events as they come; `on_step(step)` runs after each step event."""
    out = []
    assert proc.stdout is not None
    for line in proc.stdout:
        e = json.loads(line)
        out.append(e)
        if e["event"] == "step" and on_step is not None:
            on_step(e["step"])
    proc.wait(120)
    return out


def test_each_step_asks_the_warm_set_runs_the_code_and_logs_the_reward(lab: tuple[Orchestra, Path]) -> None:
    _, folder = lab
    proc = trainer(folder, 4)
    got = events(proc)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    start, steps, done = got[0], [e for e in got if e["event"] == "step"], got[-1]
    assert start["rl"]["tasks"] >= 50 and start["rl"]["tasks_per_step"] == 2 and done["event"] == "done"
    assert [e["step"] for e in steps] == [1, 2, 3, 4]
    for e in steps:
        # Random tiny models write bytes, not programs: the sandbox ran them and they failed, so
        # the reward is 0.0, judged, not missing.
        assert e["reward"] == 0.0 and e["answers_failed"] == 0 and e["executions"] > 0, e
        assert e["exec_success_rate"] is not None and 0.0 <= e["exec_success_rate"] <= 1.0
        assert sorted(e["orchestra_ms"]) == ["m-a", "m-b", "m-c"]
        assert all(m["n"] == 2 and 0 < m["p50"] <= m["p95"] for m in e["orchestra_ms"].values())
    # metrics.jsonl holds what stdout said, line for line.
    logged = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [e for e in logged if e["event"] == "step"] == steps


def test_a_rotation_and_a_killed_server_mid_run_fail_no_step(lab: tuple[Orchestra, Path]) -> None:
    orch, folder = lab

    # m-d is loaded before the run: this test reads the trainer's events in the thread that
    # rotates, and a load there would let the run go on unread, maybe to its end.
    orch.start("m-d", 3)

    def rotate(step: int) -> None:
        if step == 2:
            # A rotation as labctl does it: m-b leaves the file first, then drains and stops;
            # m-d joins once healthy.
            orch.publish(["m-a", "m-c"])
            orch.stop("m-b")
            orch.publish(["m-a", "m-c", "m-d"])
        if step == 4:
            # m-c dies without warning while still listed: its request is cut off mid-way.
            threading.Thread(target=orch.kill_mid_request, args=("m-c",), daemon=True).start()

    proc = trainer(folder, 7, answer_tokens=64)
    got = events(proc, rotate)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    steps = [e for e in got if e["event"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 8)) and got[-1]["event"] == "done"
    # Zero failed steps and zero lost answers: every request a rotation cut off was answered by
    # another model, and the time that cost is the step's rotation wait.
    assert all(e["answers_failed"] == 0 and e["reward"] is not None for e in steps), steps
    retried = sum(e["answers_retried"] for e in steps)
    assert retried >= 1 and sum(e["rotation_wait_s"] for e in steps) > 0, steps
    assert "m-d" in steps[-1]["orchestra_ms"] and "m-b" not in steps[-1]["orchestra_ms"]
    # m-c really was killed (stop() takes it off the list): kill_mid_request gives up without a
    # word if no request ever reached it, and the rotation alone would account for the retries.
    assert "m-c" not in orch.servers
