"""The orchestra's agent commands (labctl/agent/orchestra/host.py): real agent processes run from
the shipped zipapp, real servers, real HTTP on this machine. labctl's host paths point into
tmp_path (set inside each agent process, see BOOT); nothing touches /var/lib/labctl."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.core import paths, procs
from labctl.agent.modelload.modelgen import make_model
from labctl.agent.models.tinylm import make_config
from labctl.agent.orchestra import host as orch_host
from labctl.hosts.agent_ship import agent_zip

REPO = Path(__file__).resolve().parents[2]
CONFIG = make_config(vocab=256, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq=64)
# The agent as a host runs it (from its zipapp), with labctl's host paths moved under HOME.
BOOT = """
import sys
sys.path.insert(0, sys.argv[1])
from labctl.agent.core import paths
home = sys.argv[2]
paths.ORCHESTRA_DIR = home
paths.WARM_STATE = home + "/warm.json"
paths.ORCHESTRA_HISTORY = home + "/history.jsonl"
paths.ORCHESTRA_LOCK = home + "/rotate.lock"
paths.ORCHESTRA_LOGS = home + "/logs"
paths.TORCH_ENV_RECORD = home + "/torch.json"
from labctl.agent.__main__ import main
sys.exit(main(sys.argv[3:]))
"""
PY = shlex.quote(sys.executable)
# A server that ignores SIGTERM; GET / answers 200 (a folder listing) once the trap is set.
STUBBORN = (
    f"exec {PY} -c 'import signal, sys, http.server as h; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    'h.test(HandlerClass=h.SimpleHTTPRequestHandler, port=int(sys.argv[1]), bind="127.0.0.1")\' {port}'
)
SLEEPER = "exec sleep 300 # {path} {name}"


class Agent:
    def __init__(self, pyz: Path, home: Path) -> None:
        self.pyz = pyz
        self.home = home
        # Host names of this test alone: a test running beside it (another worktree) has its own.
        tag = uuid.uuid4().hex[:8]
        self.host, self.other = f"h1-{tag}", f"h2-{tag}"
        self.lab = f"lab-{tag}"

    def run(
        self, command: str, args: dict[str, Any], ssh_from: str | None = None
    ) -> tuple[int, dict[str, Any], str]:
        args = {"lab": self.lab, **args}  # every orch_ command is asked for one lab's servers
        # labctl comes from the zipapp; SSH_CONNECTION only as a test sets it (sshd's, for a host).
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SSH_CONNECTION")}
        if ssh_from:
            env["SSH_CONNECTION"] = f"{ssh_from} 50000 10.0.0.10 22"
        proc = subprocess.run(
            [sys.executable, "-c", BOOT, str(self.pyz), str(self.home), command, json.dumps(args)],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd="/",
        )
        assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
        return proc.returncode, json.loads(proc.stdout), proc.stderr

    def ok(self, command: str, args: dict[str, Any]) -> dict[str, Any]:
        rc, doc, err = self.run(command, args)
        assert rc == 0, (doc, err)
        return doc

    def fails(self, command: str, args: dict[str, Any]) -> dict[str, Any]:
        rc, doc, _ = self.run(command, args)
        assert rc == 1 and "error" in doc, doc
        return doc


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data, digest = agent_zip()
    path = tmp_path_factory.mktemp("agent") / f"agent-{digest}.pyz"
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("library") / "tiny"
    make_model(str(path), 0, config=CONFIG)
    return path


@pytest.fixture
def agent(pyz: Path, tmp_path: Path) -> Iterator[Agent]:
    a = Agent(pyz, tmp_path / "orchestra")
    yield a
    for host in (a.host, a.other):  # nothing a failed test started may outlive it
        left = orch_host.server_processes(a.lab, host)
        if left:
            procs.terminate(left, lambda host=host: orch_host.server_processes(a.lab, host), 0)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def tagged(pid: int) -> dict[str, str] | None:
    return procs.environ(pid, ("LABCTL_ORCH_MODEL", "LABCTL_HOST", "PYTHONPATH", "CUDA_VISIBLE_DEVICES"))


def test_start_health_state_stop_with_labctls_server_from_the_zipapp(
    agent: Agent, pyz: Path, model_dir: Path
) -> None:
    started = agent.ok(
        "orchestra.start", {"host": agent.host, "model": "tiny", "gpu": None, "path": str(model_dir)}
    )
    assert started["argv"][:3] == [sys.executable, "-m", "labctl.agent.orchestra.server"]
    assert started["log"] == str(agent.home / "logs" / "tiny.log")
    pid, port = started["pid"], started["port"]
    # The server runs from the agent's own zipapp, and sees no GPU when none was placed.
    assert tagged(pid) == {
        "LABCTL_ORCH_MODEL": "tiny",
        "LABCTL_HOST": agent.host,
        "PYTHONPATH": str(pyz),
        "CUDA_VISIBLE_DEVICES": "",
    }
    assert os.getpgid(pid) == pid != os.getpgid(0)  # its own session: the SSH channel can close

    rc, health, err = agent.run(
        "orchestra.health",
        {"host": agent.host, "servers": [{"model": "tiny", "port": port, "pid": pid}], "timeout": 120},
    )
    (result,) = health["results"]
    assert rc == 0 and result["healthy"] and result["state"] == "ready" and result["error"] is None
    assert result["health"]["state"] == "ready" and result["health"]["warmup_s"] > 0
    events = [json.loads(line) for line in err.splitlines()]
    assert events[-1] == {"event": "health", "model": "tiny", "state": "ready"}

    state = agent.ok("orchestra.state", {"host": agent.host, "gpus": True})
    (server,) = state["servers"]
    assert {k: server[k] for k in ("model", "gpu", "port", "pid", "pgid", "healthy")} == {
        "model": "tiny",
        "gpu": None,
        "port": port,
        "pid": pid,
        "pgid": pid,
        "healthy": True,
    }
    assert server["started"] == started["started"] and server["health"]["name"] == "tiny"
    assert state["warm"] is None and state["warm_error"] is None and state["history"] == []
    assert isinstance(state["gpus"], list) and state["gpu_source"]

    # A second server of the same model on the same host is refused, not started beside it.
    again = agent.fails(
        "orchestra.start", {"host": agent.host, "model": "tiny", "gpu": None, "path": str(model_dir)}
    )
    assert again["kind"] == "running" and str(pid) in again["error"]

    stopped = agent.ok("orchestra.stop", {"host": agent.host, "models": ["tiny", "other"], "grace": 30})
    assert stopped == {
        "stopped": [{"model": "tiny", "pid": pid, "killed": False}],
        "remaining": [],
        "absent": ["other"],
    }
    assert not procs.alive(pid) and port_free(port)
    assert agent.ok("orchestra.state", {"host": agent.host})["servers"] == []
    log = (agent.home / "logs" / "tiny.log").read_text()
    assert log.startswith("==== labctl orchestra.start ") and '"event": "stopped"' in log


def test_a_server_that_dies_at_once_fails_its_health_check_at_once_with_the_log_tail(
    agent: Agent, tmp_path: Path
) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(CONFIG))
    (bad / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    started = agent.ok("orchestra.start", {"host": agent.host, "model": "bad", "gpu": None, "path": str(bad)})
    # A timeout that would stall the test for ten minutes had the check waited for it.
    servers = [{"model": "bad", "port": started["port"], "pid": started["pid"]}]
    health = agent.ok("orchestra.health", {"host": agent.host, "servers": servers, "timeout": 600})
    (result,) = health["results"]
    assert result["healthy"] is False and result["state"] == "exited"
    assert "gone before it was healthy" in result["error"]
    assert f"orchestra server bad: cannot load {bad}" in result["log_tail"]
    assert "==== labctl" not in result["log_tail"]  # only this start's lines


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace(agent: Agent, tmp_path: Path) -> None:
    started = agent.ok(
        "orchestra.start",
        {"host": agent.host, "model": "stubborn", "gpu": 1, "path": str(tmp_path), "command": STUBBORN},
    )
    pid, port = started["pid"], started["port"]
    assert tagged(pid)["CUDA_VISIBLE_DEVICES"] == "1"  # type: ignore[index]
    servers = [{"model": "stubborn", "port": port, "pid": pid}]
    health = agent.ok(
        "orchestra.health", {"host": agent.host, "servers": servers, "timeout": 120, "health_path": "/"}
    )
    assert health["results"][0]["healthy"] is True and health["results"][0]["health"] is None
    state = agent.ok("orchestra.state", {"host": agent.host, "health_path": "/"})
    assert [(s["model"], s["gpu"], s["healthy"]) for s in state["servers"]] == [("stubborn", 1, True)]
    stopped = agent.ok("orchestra.stop", {"host": agent.host, "models": None, "grace": 0.5})
    assert stopped["stopped"] == [{"model": "stubborn", "pid": pid, "killed": True}]
    assert stopped["remaining"] == [] and not procs.alive(pid) and port_free(port)


def test_servers_tagged_for_another_host_are_never_listed_or_stopped(agent: Agent, tmp_path: Path) -> None:
    theirs = agent.ok(
        "orchestra.start",
        {"host": agent.other, "model": "m", "gpu": None, "path": str(tmp_path), "command": SLEEPER},
    )
    mine = agent.ok(
        "orchestra.start",
        {"host": agent.host, "model": "m", "gpu": None, "path": str(tmp_path), "command": SLEEPER},
    )
    assert [s["pid"] for s in agent.ok("orchestra.state", {"host": agent.host})["servers"]] == [mine["pid"]]
    stopped = agent.ok("orchestra.stop", {"host": agent.host, "models": None, "grace": 5})
    assert [s["pid"] for s in stopped["stopped"]] == [mine["pid"]]
    assert procs.alive(theirs["pid"]) and not procs.alive(mine["pid"])
    assert agent.ok("orchestra.stop", {"host": agent.host, "models": ["m"], "grace": 5})["absent"] == ["m"]
    assert [s["pid"] for s in agent.ok("orchestra.state", {"host": agent.other})["servers"]] == [
        theirs["pid"]
    ]


def test_a_server_of_another_lab_naming_the_host_alike_is_shown_never_stopped(
    agent: Agent, tmp_path: Path
) -> None:
    """Two inventories name one machine alike: each lab's repair and stop keep to its own servers."""
    start = {"host": agent.host, "model": "m", "gpu": None, "path": str(tmp_path), "command": SLEEPER}
    theirs = agent.ok("orchestra.start", {**start, "lab": agent.lab + "-other"})
    try:
        mine = agent.ok("orchestra.start", start)  # the same model name is no clash across labs
        state = agent.ok("orchestra.state", {"host": agent.host})
        assert [s["pid"] for s in state["servers"]] == [mine["pid"]]
        # Only this test's labs: a simulated lab beside it (its hosts share this machine's /proc
        # when the test runs outside them) has servers of its own.
        others = [o for o in state["others"] if str(o["lab"]).startswith(agent.lab)]
        assert [(o["lab"], o["host"], o["pid"]) for o in others] == [
            (agent.lab + "-other", agent.host, theirs["pid"])
        ]
        stopped = agent.ok("orchestra.stop", {"host": agent.host, "models": None, "grace": 5})
        assert [s["pid"] for s in stopped["stopped"]] == [mine["pid"]]
        assert procs.alive(theirs["pid"]) and not procs.alive(mine["pid"])
    finally:
        agent.ok(
            "orchestra.stop", {"host": agent.host, "lab": agent.lab + "-other", "models": None, "grace": 5}
        )
    assert not procs.alive(theirs["pid"])


def test_orchestra_commands_refuse_a_call_that_names_no_lab(agent: Agent, tmp_path: Path) -> None:
    doc = agent.fails("orchestra.state", {"host": agent.host, "lab": ""})
    assert "lab is required" in doc["error"]


def test_commit_replaces_warm_json_atomically_appends_history_and_state_returns_both(agent: Agent) -> None:
    warm = {
        "models": [{"name": "tiny", "gpu": 0, "gpu_model": "P40", "port": 1, "pid": 2, "state": "loaded"}],
        "warm_size": 1,
        "hosts": ["h1"],
        "cursor": "tiny",
    }
    first = agent.ok(
        "orchestra.commit", {"host": agent.host, "warm": warm, "history": {"in": ["tiny"], "out": []}}
    )
    path = agent.home / "warm.json"
    assert first["path"] == str(path)
    assert json.loads(path.read_text()) == {**warm, "updated": first["updated"]}
    inode = path.stat().st_ino
    second = agent.ok(
        "orchestra.commit", {"host": agent.host, "warm": {**warm, "cursor": "x"}, "history": {"in": ["x"]}}
    )
    # Replaced by a rename (a new inode), never rewritten in place where a reader could see half.
    assert path.stat().st_ino != inode and sorted(p.name for p in agent.home.iterdir()) == [
        "history.jsonl",
        "warm.json",
    ]
    agent.ok("orchestra.commit", {"host": agent.host, "warm": warm, "history": None})
    state = agent.ok("orchestra.state", {"host": agent.host})
    assert state["warm"]["cursor"] == "tiny" and state["warm"]["updated"] > 0 and state["warm_error"] is None
    assert state["history"] == [
        {"in": ["tiny"], "out": [], "updated": first["updated"]},
        {"in": ["x"], "updated": second["updated"]},
    ]


def test_a_damaged_warm_json_or_history_line_is_reported_not_a_crash(agent: Agent) -> None:
    agent.home.mkdir()
    (agent.home / "warm.json").write_text('{"models": [')
    (agent.home / "history.jsonl").write_text('{"in": ["a"]}\n{"in": [\n')
    state = agent.ok("orchestra.state", {"host": agent.host})
    assert state["warm"] is None and "damaged" in state["warm_error"] and "warm.json" in state["warm_error"]
    assert state["history"] == [{"in": ["a"]}]


@pytest.mark.parametrize(
    ("args", "kind", "says"),
    [
        ({"model": "tiny", "path": "/nonexistent/model"}, "no_model", "does not exist"),
        ({"model": "tiny", "path": "/"}, "no_model", "no config.json"),
        ({"model": "../x", "path": "/"}, "bad_args", "model must be"),
        ({"model": "tiny", "path": "/", "gpu": "0"}, "bad_args", "gpu must be"),
        (
            {"model": "tiny", "path": "/", "command": "serve {model}"},
            "bad_args",
            "{path} {port} {gpu} {name}",
        ),
        (
            {"model": "tiny", "python": "/nonexistent/python"},
            "start_failed",
            "cannot run /nonexistent/python",
        ),
    ],
)
def test_start_refuses_with_a_kind_the_controller_can_branch_on(
    agent: Agent, model_dir: Path, args: dict[str, Any], kind: str, says: str
) -> None:
    doc = agent.fails("orchestra.start", {"host": agent.host, "gpu": None, "path": str(model_dir), **args})
    assert doc["kind"] == kind and says in doc["error"]


def test_start_uses_the_provisioned_torch_env_python_and_refuses_a_taken_port(
    agent: Agent, model_dir: Path
) -> None:
    agent.home.mkdir()
    (agent.home / "torch.json").write_text(json.dumps({"python": "/opt/torch-env/bin/python"}))
    doc = agent.fails(
        "orchestra.start", {"host": agent.host, "model": "tiny", "gpu": None, "path": str(model_dir)}
    )
    assert doc["kind"] == "start_failed" and "/opt/torch-env/bin/python" in doc["error"]
    assert "cannot run /opt/torch-env/bin/python" in (agent.home / "logs" / "tiny.log").read_text()
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = {"host": agent.host, "model": "tiny", "gpu": None, "path": str(model_dir), "port": port}
        assert agent.fails("orchestra.start", {**args, "python": sys.executable})["kind"] == "port"


def test_host_lock_on_the_rotation_lock_creates_the_orchestra_folder(tmp_path: Path) -> None:
    assert os.path.dirname(paths.ORCHESTRA_LOCK) == paths.ORCHESTRA_DIR
    lock = tmp_path / "orchestra" / "rotate.lock"  # the folder does not exist yet
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "labctl.agent",
            "provision.host_lock",
            json.dumps({"path": str(lock), "wait": 5}),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert proc.stderr is not None
        assert json.loads(proc.stderr.readline())["event"] == "locked"
        assert lock.exists()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_a_zombie_nobody_reaped_counts_as_gone() -> None:
    """A server that died under an init that does not reap (a container's) is still in /proc."""
    child = subprocess.Popen(
        ["sleep", "0"], env={**os.environ, "LABCTL_ORCH_MODEL": "z", "LABCTL_HOST": "z", "LABCTL_LAB": "z"}
    )
    try:
        while True:  # exited, not yet reaped: a zombie
            with open(f"/proc/{child.pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    break
            time.sleep(0.01)
        assert not procs.alive(child.pid)
        assert child.pid not in [p["pid"] for p in orch_host.server_processes("z", "z")]
    finally:
        child.wait()
    assert not procs.alive(child.pid)


def test_stop_by_pid_stops_only_those_servers(agent: Agent, tmp_path: Path) -> None:
    """A repair names the orphans by pid: the servers warm.json records stay up."""
    one = agent.ok(
        "orchestra.start",
        {"host": agent.host, "model": "one", "gpu": None, "path": str(tmp_path), "command": SLEEPER},
    )
    two = agent.ok(
        "orchestra.start",
        {"host": agent.host, "model": "two", "gpu": None, "path": str(tmp_path), "command": SLEEPER},
    )
    stopped = agent.ok(
        "orchestra.stop", {"host": agent.host, "models": None, "pids": [one["pid"]], "grace": 5}
    )
    assert [s["pid"] for s in stopped["stopped"]] == [one["pid"]]
    assert not procs.alive(one["pid"]) and procs.alive(two["pid"])
    agent.ok("orchestra.stop", {"host": agent.host, "models": None, "grace": 5})
    assert not procs.alive(two["pid"])


def test_a_history_entry_records_the_address_the_controller_came_from_over_ssh(agent: Agent) -> None:
    warm = {"models": [], "warm_size": 1, "hosts": [agent.host]}
    rc, _, err = agent.run(
        "orchestra.commit",
        {"host": agent.host, "warm": warm, "history": {"kind": "rotate"}},
        ssh_from="10.0.0.30",
    )
    assert rc == 0, err
    agent.ok("orchestra.commit", {"host": agent.host, "warm": warm, "history": {"kind": "start"}})
    history = agent.ok("orchestra.state", {"host": agent.host})["history"]
    assert [(h["kind"], h.get("client")) for h in history] == [("rotate", "10.0.0.30"), ("start", None)]
