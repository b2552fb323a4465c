"""`agent --serve` (labctl/agent/core/serve.py), the agent a keeper keeps running on a host: a real
server process here, spoken to over its stdin/stdout as the keeper does over its channel. Test
commands are registered in the server before it serves, so every forked call has them."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import select
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import pid_gone

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Registered in the server before it serves (commands.register), so every forked call has them.
COMMANDS = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from labctl.agent import commands

    def sleeper(args):
        # A grandchild in the call's process group, as a command's own subprocess would be.
        p = subprocess.Popen(["sleep", "60"])
        sys.stderr.write("pids %d %d\\n" % (os.getpid(), p.pid))
        sys.stderr.flush()
        p.wait()
        return {}

    def leak(args):
        seen = {"env": os.environ.get("LEAKED"), "command": "test.injected" in commands.COMMANDS}
        os.environ["LEAKED"] = "yes"
        commands.COMMANDS["test.injected"] = lambda a: {}
        return seen

    def exits(args):
        sys.exit(args["rc"])

    def chatty(args):
        for i in range(args["n"]):
            sys.stderr.write("line %d\\n" % i)
        sys.stderr.flush()
        return {"n": args["n"]}

    for name, fn in (("test.sleeper", sleeper), ("test.leak", leak), ("test.exits", exits), ("test.chatty", chatty)):
        commands.register(name, fn)
    from labctl.agent.__main__ import main
    from labctl.agent.core.serve import Agent, serve
    sys.exit(serve(Agent(main, commands.resolve), os.environ["T_DIGEST"], os.environ["T_HERE"]))
    """
)


class Server:
    def __init__(self, root: Path, env: dict[str, str] | None = None) -> None:
        # The agent's files as BOOT leaves them: the zipapp, and the folder extracted beside it.
        self.folder = root / "agent-x"
        self.folder.mkdir()
        (self.folder / ".complete").touch()
        self.pyz = root / "agent-x.pyz"
        self.pyz.write_bytes(b"the agent's zipapp")
        digest = hashlib.sha256(self.pyz.read_bytes()).hexdigest()[:16]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", COMMANDS],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=REPO,
            env={
                **os.environ,
                "PYTHONPATH": REPO,
                "T_DIGEST": digest,
                "T_HERE": str(self.folder),
                **(env or {}),
            },
        )
        self.pending: dict[int, list[dict[str, Any]]] = {}
        self.buf = bytearray()
        self.ready = self.recv(15)
        assert self.ready is not None and "ready" in self.ready, self.ready

    def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        body = json.dumps(obj).encode()
        self.proc.stdin.write(struct.pack(">I", len(body)) + body)
        self.proc.stdin.flush()

    def recv(self, timeout: float = 15.0) -> dict[str, Any] | None:
        """The next frame (None: the server closed its stdout)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        end = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 4:
                (n,) = struct.unpack(">I", self.buf[:4])
                if len(self.buf) >= 4 + n:
                    frame: dict[str, Any] = json.loads(self.buf[4 : 4 + n])
                    del self.buf[: 4 + n]
                    return frame
            ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
            assert ready, "the server said nothing"
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk

    def start(self, cid: int, command: str, args: dict[str, Any] | None = None) -> int:
        self.send({"id": cid, "argv": [command, json.dumps(args or {})]})
        return cid

    def wait(self, cid: int, timeout: float = 30.0) -> tuple[int, str, str]:
        """(rc, stdout, stderr) of call `cid`, other calls' frames kept for their own wait."""
        end = time.monotonic() + timeout
        while True:
            frames = self.pending.setdefault(cid, [])
            if frames and "rc" in frames[-1]:
                out = b"".join(base64.b64decode(f["d"]) for f in frames if f.get("s") == "o")
                err = b"".join(base64.b64decode(f["d"]) for f in frames if f.get("s") == "e")
                return frames[-1]["rc"], out.decode(), err.decode()
            frame = self.recv(max(0.1, end - time.monotonic()))
            assert frame is not None, "the server closed"
            self.pending.setdefault(int(frame["id"]), []).append(frame)

    def stderr_line(self, cid: int, prefix: str, timeout: float = 15.0, out: bool = False) -> str:
        """The first line of call `cid`'s stderr (stdout: `out`) that starts with `prefix`."""
        end = time.monotonic() + timeout
        stream = "o" if out else "e"
        while True:
            text = b"".join(
                base64.b64decode(f["d"]) for f in self.pending.get(cid, []) if f.get("s") == stream
            ).decode()
            for line in text.splitlines():
                if line.startswith(prefix):
                    return line
            assert time.monotonic() < end, f"no {prefix!r} line from call {cid}"
            frame = self.recv(max(0.1, end - time.monotonic()))
            assert frame is not None
            self.pending.setdefault(int(frame["id"]), []).append(frame)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path)
    yield s
    if s.proc.poll() is None:
        s.proc.kill()
    s.proc.wait()


def test_a_call_answers_as_a_direct_agent_call_does(server: Server) -> None:
    rc, out, _ = server.wait(server.start(1, "ping"))
    direct = subprocess.run(
        [sys.executable, "-m", "labctl.agent", "ping"], capture_output=True, text=True, cwd=REPO, check=True
    )
    served, alone = json.loads(out), json.loads(direct.stdout)
    assert rc == 0 and set(served) == set(alone) and served["agent_version"] == alone["agent_version"]
    # Each call is a child of its own, forked from the server.
    assert served["pid"] != server.ready["ready"]
    rc, out, _ = server.wait(server.start(2, "ping"))
    assert json.loads(out)["pid"] not in (served["pid"], server.ready["ready"])


def test_errors_and_exit_codes_are_the_commands_own(server: Server) -> None:
    server.start(1, "no.such")
    rc, out, _ = server.wait(1)
    assert rc == 1 and json.loads(out)["kind"] == "unknown_command"
    server.start(2, "test.exits", {"rc": 3})
    assert server.wait(2)[0] == 3


def test_what_a_call_changes_dies_with_it(server: Server) -> None:
    server.start(1, "test.leak")
    first = json.loads(server.wait(1)[1])
    server.start(2, "test.leak")
    second = json.loads(server.wait(2)[1])
    assert first == second == {"env": None, "command": False}


def test_calls_run_side_by_side_and_output_streams(server: Server) -> None:
    server.start(1, "test.sleeper")
    server.stderr_line(1, "pids ")
    server.start(2, "test.chatty", {"n": 2000})  # more than a pipe holds
    rc, out, err = server.wait(2)
    assert rc == 0 and json.loads(out) == {"n": 2000}
    assert err.splitlines() == [f"line {i}" for i in range(2000)]
    server.send({"id": 1, "cancel": True})
    assert server.wait(1)[0] == 128 + 15  # TERM, as sh reports a killed command


def test_a_cancel_ends_the_calls_whole_process_group(server: Server) -> None:
    server.start(1, "test.sleeper")
    _, child, grandchild = server.stderr_line(1, "pids ").split()
    server.send({"id": 1, "cancel": True})
    server.wait(1)
    assert pid_gone(int(child), 10) and pid_gone(int(grandchild), 10)


def test_stdin_closed_ends_every_call_and_the_server(server: Server) -> None:
    server.start(1, "test.sleeper")
    _, child, grandchild = server.stderr_line(1, "pids ").split()
    assert server.proc.stdin is not None
    server.proc.stdin.close()  # the channel, the connection or the keeper gone
    assert server.proc.wait(15) == 0
    assert pid_gone(int(child), 10) and pid_gone(int(grandchild), 10)


@pytest.mark.parametrize("change", ["removed", "damaged", "folder gone"])
def test_agent_files_changed_on_disk_it_takes_no_new_call_and_leaves_after_the_running_one(
    server: Server, change: str
) -> None:
    assert server.wait(server.start(1, "ping"))[0] == 0
    server.start(2, "test.sleeper")
    server.stderr_line(2, "pids ")
    if change == "removed":
        server.pyz.unlink()  # a disk mounted over the folder looks the same from here
    elif change == "damaged":
        server.pyz.write_bytes(b"the agent's zipapp, cut short or overwritten")
    else:
        (server.folder / ".complete").unlink()
    server.start(3, "ping")
    while not any(f.get("stale") for f in server.pending.get(3, [])):
        frame = server.recv()
        assert frame is not None
        server.pending.setdefault(int(frame["id"]), []).append(frame)
    assert server.proc.poll() is None  # the running call is not cut short
    server.send({"id": 2, "cancel": True})
    assert server.wait(2)[0] == 128 + 15
    assert server.proc.wait(15) == 0


def test_retired_it_leaves_once_its_calls_are_done(server: Server) -> None:
    server.start(1, "test.sleeper")
    server.stderr_line(1, "pids ")
    server.send({"id": 0, "retire": True})
    server.start(2, "ping")
    while not any(f.get("stale") for f in server.pending.get(2, [])):
        frame = server.recv()
        assert frame is not None
        server.pending.setdefault(int(frame["id"]), []).append(frame)
    server.send({"id": 1, "cancel": True})
    assert server.wait(1)[0] == 128 + 15 and server.proc.wait(15) == 0


def test_a_shell_command_runs_as_the_watchdog_runs_one(server: Server) -> None:
    server.send({"id": 1, "sh": "echo out; echo err >&2; exit 3"})
    assert server.wait(1) == (3, "out\n", "err\n")
    # Its own session and group; SIGINT and SIGQUIT ignored as for sh's background command,
    # SIGPIPE not (Python's ignoring it does not leak through exec); stdin is /dev/null.
    server.send(
        {"id": 2, "sh": "ps -o pid=,pgid=,sid= -p $$; grep SigIgn /proc/$$/status; readlink /proc/$$/fd/0"}
    )
    rc, out, _ = server.wait(2)
    ids, ignored, stdin = out.splitlines()
    pid, pgid, sid = ids.split()
    assert rc == 0 and pid == pgid == sid and stdin == "/dev/null"
    mask = int(ignored.split()[1], 16)
    assert mask & (1 << 1) and mask & (1 << 2) and not mask & (1 << 12)  # bits: signal number - 1


def test_a_cancelled_shell_command_is_ended_with_its_children(server: Server) -> None:
    server.send({"id": 1, "sh": "sleep 60 & echo pids $$ $!; wait", "grace": 1})
    _, sh, sleeper = server.stderr_line(1, "pids ", out=True).split()
    server.send({"id": 1, "cancel": True})
    server.wait(1)
    assert pid_gone(int(sh), 10) and pid_gone(int(sleeper), 10)


@pytest.mark.parametrize("login", [None, "de_DE.UTF-8"])
def test_a_shell_command_sees_the_logins_locale_not_pythons(tmp_path: Path, login: str | None) -> None:
    env = {"LABCTL_LC_CTYPE": "" if login is None else f"set:{login}", "LC_CTYPE": "C.UTF-8"}
    s = Server(tmp_path, env)
    try:
        s.send({"id": 1, "sh": 'echo "${LC_CTYPE-unset}"; env | grep -c LABCTL_LC_CTYPE'})
        _, out, _ = s.wait(1)  # grep -c finding none exits 1
        assert out.split() == [login or "unset", "0"]
    finally:
        s.proc.kill()
        s.proc.wait()
