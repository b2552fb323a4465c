"""The agent a keeper keeps running on each connection (labctl/keeper/agents.py), over real SSH:
the private sshd of test_keeper_ssh on 127.0.0.1, agent calls made by call_agent as any command
makes them, and the host's processes read from /proc."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from labctl.hosts import agent_ship
from labctl.hosts.agent_ship import agent_zip, call_agent
from labctl.inventory.model import Host
from labctl.keeper import sock as ks
from labctl.keeper.client import KeeperClient, KeptConnection, close_connections, list_connections
from labctl.keeper.server import Keeper
from labctl.transport.base import CommandTimeout, ConnectionLost
from tests.conftest import pid_gone
from tests.unit import test_keeper_ssh as ssh_lab
from tests.unit.test_keeper_ssh import Lab, kept

# The private sshd and the keeper serving it, as test_keeper_ssh has them.
lab = ssh_lab.lab
keeper = ssh_lab.keeper


@pytest.fixture(autouse=True)
def private_agent_dir(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent uploaded under the test's folder: the sshd is this machine, whose own agent
    folder the integration tests find empty."""
    from labctl.hosts import agent_ship

    monkeypatch.setattr(agent_ship, "agent_dir", lambda host: str(lab.root / "agent"))


pytestmark = ssh_lab.pytestmark  # sshd, ssh-keygen and root


class Run:
    """What call_agent reads of fanout.HostRun: the host, its connection, the cancel flag."""

    def __init__(self, conn: KeptConnection, host: Host, cancel: threading.Event | None = None) -> None:
        self.conn = conn
        self.host = host
        self.cancel = cancel or threading.Event()


def agents(lab: Lab) -> list[dict[str, Any]]:
    [entry] = list_connections(lab.inventory, lab.root / "k")["connections"]
    return list(entry["agents"])


def kept_agent(lab: Lab, host: Host, within: float = 30.0) -> dict[str, Any]:
    """The agent kept on the lab's one connection, once its background start is done. Agent
    calls go on meanwhile, as a user's would: a start that found the agent not uploaded yet is
    tried again by the next call."""
    end = time.monotonic() + within
    while not agents(lab):
        assert time.monotonic() < end, "no agent was kept on the connection"
        call_agent(Run(kept(lab, host), host), "ping")
        time.sleep(0.05)
    [agent] = agents(lab)
    return agent


def served(conn: KeptConnection, ask: dict[str, Any], within: float = 30.0) -> Any:
    """run_agent's result once the kept agent serves it (None until its start is done)."""
    end = time.monotonic() + within
    while (res := conn.run_agent(**ask)) is None:
        assert time.monotonic() < end, "no kept agent served the call"
        time.sleep(0.05)
    return res


def settled(keeper: Keeper, within: float = 30.0) -> None:
    """No kept agent being started (a start that fails is declined for a while)."""
    end = time.monotonic() + within
    while any(e.starting for e in list(keeper.entries.values())):
        assert time.monotonic() < end
        time.sleep(0.05)


def fresh_agent_path(lab: Lab, h: Host) -> tuple[bytes, str, KeptConnection, dict[str, Any]]:
    """The agent's bytes, a path on the host where it is not yet, a kept connection, and the
    run_agent arguments (all but argv) for an agent at that path."""
    data, digest = agent_zip()
    path = str(lab.root / "agents" / f"agent-{digest}.pyz")
    ask = dict(
        python=h.python, path=path, digest=digest, read_only=False, timeout=30.0, cancel=None, on_line=None
    )
    return data, path, kept(lab, h), ask


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def the_child(pid: int, within: float = 15.0) -> int:
    end = time.monotonic() + within
    while not children(pid):
        assert time.monotonic() < end, "the kept agent started no call"
        time.sleep(0.05)
    [child] = children(pid)
    return child


def sink_call(host: Host) -> dict[str, Any]:
    """netbench.sink: an agent call that waits (for a sender, up to a minute) until stopped."""
    _, digest = agent_zip()
    return {
        "python": host.python,
        "path": f"{agent_ship.agent_dir(host)}/agent-{digest}.pyz",
        "digest": digest,
        "argv": ["netbench.sink", json.dumps({"bind": "127.0.0.1", "idle_timeout": 60})],
        "read_only": False,
    }


def sink(conn: KeptConnection, host: Host, **kw: Any) -> Any:
    return conn.run_agent(**sink_call(host), on_line=None, **kw)


def test_agent_calls_go_to_one_agent_kept_on_the_connection(lab: Lab, keeper: Keeper) -> None:
    h = lab.host()
    first = call_agent(Run(kept(lab, h), h), "ping")  # direct: it uploads the agent
    agent = kept_agent(lab, h)  # started in the background meanwhile
    second = call_agent(Run(kept(lab, h), h), "ping")
    third = call_agent(Run(kept(lab, h), h), "ping")
    # Two calls, each a child of its own forked from the one agent kept there.
    assert len({first["pid"], second["pid"], third["pid"], agent["pid"]}) == 4
    assert second["agent_version"] == first["agent_version"]
    assert agents(lab) == [{"pid": agent["pid"], "calls": agent["calls"] + 2}]


def test_a_timed_out_or_cancelled_call_ends_on_the_host(lab: Lab, keeper: Keeper) -> None:
    h = lab.host()
    call_agent(Run(kept(lab, h), h), "ping")  # the agent in place, and kept
    agent = kept_agent(lab, h)
    results: list[Any] = []
    t = threading.Thread(target=lambda: results.append(sink(kept(lab, h), h, timeout=3.0, cancel=None)))
    t.start()
    child = the_child(agent["pid"])  # served by the kept agent, not a login of its own
    t.join(30)
    assert results[0].timed_out and results[0].rc is None
    assert pid_gone(child, 10), "a timed-out call outlived its caller"

    cancel = threading.Event()
    t = threading.Thread(target=lambda: results.append(sink(kept(lab, h), h, timeout=None, cancel=cancel)))
    t.start()
    child = the_child(agent["pid"])
    cancel.set()
    t.join(30)
    assert results[1].cancelled and pid_gone(child, 10)
    with pytest.raises(CommandTimeout):  # as call_agent reports it on a direct connection
        call_agent(
            Run(kept(lab, h), h),
            "netbench.sink",
            {"bind": "127.0.0.1", "idle_timeout": 60},
            timeout=1.0,
        )
    assert agents(lab)[0]["pid"] == agent["pid"]  # the agent itself stays


@pytest.mark.parametrize("op", ["agent", "run"])
def test_a_closed_client_ends_its_call(lab: Lab, keeper: Keeper, op: str) -> None:
    """An agent call, or a shell command run in the kept agent: Ctrl-C or a killed labctl ends it."""
    h = lab.host()
    call_agent(Run(kept(lab, h), h), "ping")
    agent = kept_agent(lab, h)
    client = KeeperClient(lab.inventory, 60, lab.root / "k")
    fields = sink_call(h) if op == "agent" else {"command": "exec sleep 60"}
    s = ks.connect(client.socket_path)
    ks.send_frame(s, client.host_request(h, op, timeout=None, **fields))
    child = the_child(agent["pid"])
    s.close()  # Ctrl-C, or the command killed
    assert pid_gone(child, 10), "the call outlived its caller"


def test_closing_the_connection_ends_the_agent_and_stopping_the_keeper_its_calls(
    lab: Lab, keeper: Keeper
) -> None:
    h = lab.host()
    call_agent(Run(kept(lab, h), h), "ping")
    agent = kept_agent(lab, h)
    assert close_connections(lab.inventory, None, lab.root / "k") == ["m1"]
    assert pid_gone(agent["pid"], 15), "the kept agent outlived its connection"

    call_agent(Run(kept(lab, h), h), "ping")
    agent = kept_agent(lab, h)
    results: list[Any] = []
    t = threading.Thread(
        target=lambda: results.append(_quietly(sink, kept(lab, h), h, timeout=None, cancel=None))
    )
    t.start()
    child = the_child(agent["pid"])
    keeper.stop("test")  # as on idle, SIGTERM or `labctl connections stop`
    assert pid_gone(agent["pid"], 15) and pid_gone(child, 15)
    t.join(30)
    assert isinstance(results[0], ConnectionLost)  # the caller is told, as when a session drops


def _quietly(fn: Any, *args: Any, **kw: Any) -> Any:
    try:
        return fn(*args, **kw)
    except Exception as e:
        return e


def test_no_agent_there_yet_goes_the_direct_way_until_one_is_put_there(lab: Lab, keeper: Keeper) -> None:
    h = lab.host()
    data, path, conn, ask = fresh_agent_path(lab, h)
    assert conn.run_agent(argv=["ping", "{}"], **ask) is None  # none there: the caller runs BOOT itself
    settled(keeper)
    assert agents(lab) == []
    conn.put_bytes(data, path, mode=0o600, dir_mode=0o700)  # the next call tries again at once
    res = served(conn, {**ask, "argv": ["ping", "{}"]})
    assert res.rc == 0 and json.loads(res.stdout)["agent_version"]
    agent = kept_agent(lab, h)
    # Another labctl's agent (another path) replaces this one on the connection.
    other = str(lab.root / "agents2" / f"agent-{ask['digest']}.pyz")
    conn.put_bytes(data, other, mode=0o600, dir_mode=0o700)
    served(conn, {**ask, "path": other, "argv": ["ping", "{}"]})
    assert pid_gone(agent["pid"], 15)
    newer = kept_agent(lab, h)
    assert newer["pid"] != agent["pid"]
    # Its files gone from the disk (removed, a disk mounted over them): that agent takes no
    # new call, and the call goes the direct way, which uploads the agent again.
    Path(other).unlink()
    assert conn.run_agent(argv=["ping", "{}"], **{**ask, "path": other}) is None
    assert pid_gone(newer["pid"], 15)
    settled(keeper)
    assert agents(lab) == []
    conn.put_bytes(data, other, mode=0o600, dir_mode=0o700)
    assert served(conn, {**ask, "path": other, "argv": ["ping", "{}"]}).rc == 0


def test_a_local_host_has_no_kept_agent(tmp_path: Path) -> None:
    from labctl.keeper.server import Entry

    k = Keeper(tmp_path / "lab.yaml", 60, tmp_path / "s")
    local = Host(name="here", address="127.0.0.1", connection="local")
    e = Entry(key="x", host=local)
    from labctl.transport.local import LocalConnection

    e.conn = LocalConnection(local)
    assert (
        k._session(e, {"python": "python3", "path": "/nowhere.pyz", "digest": "0", "read_only": False})
        is None
    )


def test_shell_commands_run_in_the_kept_agent_as_over_their_own_session(lab: Lab, keeper: Keeper) -> None:
    h = lab.host()
    conn = kept(lab, h)
    before = conn.run("env | sort").stdout  # no agent kept yet: a session of its own
    call_agent(Run(kept(lab, h), h), "ping")
    agent = kept_agent(lab, h)
    res = kept(lab, h).run("echo $PPID; echo err >&2; exit 4", env={"LABCTL_T": "a b"})
    assert (res.rc, res.stdout, res.stderr) == (4, f"{agent['pid']}\n", "err\n")
    assert kept(lab, h).run("echo $LABCTL_T", env={"LABCTL_T": "a b"}).stdout == "a b\n"

    def same(env: str) -> list[str]:  # the same login, but another session's client port
        return [line for line in env.splitlines() if not line.startswith(("SSH_CLIENT=", "SSH_CONNECTION="))]

    assert same(kept(lab, h).run("env | sort").stdout) == same(before)
    assert agents(lab)[0]["calls"] == agent["calls"] + 3  # all three ran in it

    res = kept(lab, h).run("sleep 30", timeout=1)
    assert res.timed_out and res.rc is None
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    res = kept(lab, h).run("sleep 30", cancel=cancel)
    assert res.cancelled and res.rc is None and res.seconds < 10
    end = time.monotonic() + 10
    while children(agent["pid"]):  # both sleeps ended on the host
        assert time.monotonic() < end, "a timed-out or cancelled command outlived its caller"
        time.sleep(0.05)


def test_a_command_the_watchdog_would_not_guard_goes_over_its_own_session(lab: Lab, keeper: Keeper) -> None:
    h = lab.host()
    call_agent(Run(kept(lab, h), h), "ping")
    agent = kept_agent(lab, h)
    assert kept(lab, h).run("echo $PPID", watchdog=False).stdout != f"{agent['pid']}\n"


def test_a_start_that_looked_before_the_upload_does_not_hold_back_the_next(
    lab: Lab, keeper: Keeper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first call's background start finds no agent, but says so only after the direct call
    has uploaded it (a loaded host): the next call starts the agent all the same."""
    from labctl.keeper.agents import AgentSession, SessionUnavailable

    looked, uploaded = threading.Event(), threading.Event()
    real = AgentSession.start

    def late_start(self: AgentSession) -> None:
        try:
            real(self)
        except SessionUnavailable:
            looked.set()
            uploaded.wait(30)  # its failure lands after the upload
            raise

    monkeypatch.setattr(AgentSession, "start", late_start)
    h = lab.host()
    data, path, conn, ask = fresh_agent_path(lab, h)
    assert conn.run_agent(argv=["ping", "{}"], **ask) is None
    assert looked.wait(30)  # the start found no agent there
    conn.put_bytes(data, path, mode=0o600, dir_mode=0o700)
    uploaded.set()
    settled(keeper)
    assert served(conn, {**ask, "argv": ["ping", "{}"]}, within=10).rc == 0
