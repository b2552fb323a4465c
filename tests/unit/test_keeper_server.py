"""The connection keeper (labctl.keeper) over real Unix sockets: a keeper serving in a thread of
this process, with a connection factory that counts what it opens (local connections stand in
for SSH ones: what is kept, reused or dropped is the keeper's doing, not the transport's)."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from labctl.inventory.model import Host
from labctl.keeper import sock as ks
from labctl.keeper.client import KeeperClient, KeptConnection, close_connections, list_connections, stop
from labctl.keeper.server import Keeper
from labctl.keeper.wire import connection_key, host_to_wire
from labctl.transport.base import Connection, TransportError, Unreachable
from labctl.transport.local import LocalConnection
from tests.conftest import keeper_folder, pid_gone


class Factory:
    """Opens LocalConnections and remembers each; `dead` makes alive() answer False."""

    def __init__(self) -> None:
        self.opened: list[Host] = []
        self.conns: list[Any] = []
        self.dead = False
        self.fail: Exception | None = None

    def __call__(self, host: Host) -> Connection:
        if self.fail is not None:
            raise self.fail
        self.opened.append(host)
        factory = self

        class Probed(LocalConnection):
            closed = False

            def alive(self, timeout: float) -> bool:
                return not factory.dead

            def close(self) -> None:
                self.closed = True

        conn = Probed(host)
        self.conns.append(conn)
        return conn


@pytest.fixture
def folder() -> Iterator[Path]:
    d = keeper_folder("kp")
    yield d
    shutil.rmtree(d.parent, ignore_errors=True)


@pytest.fixture
def inventory(folder: Path) -> Path:
    p = folder.parent / "lab.yaml"
    p.write_text("lab: t\nhosts: {m1: {address: 127.0.0.1}}\n")
    return p


class Running:
    def __init__(self, keeper: Keeper, thread: threading.Thread, factory: Factory) -> None:
        self.keeper, self.thread, self.factory = keeper, thread, factory
        self.why: list[str] = []


def start(inventory: Path, folder: Path, persist: float = 60.0, tick: float = 0.1) -> Running:
    factory = Factory()
    keeper = Keeper(inventory, persist, ks.socket_path(inventory, folder), factory=factory, tick=tick)
    assert keeper.bind()
    why: list[str] = []
    t = threading.Thread(target=lambda: why.append(keeper.serve()), daemon=True)
    t.start()
    r = Running(keeper, t, factory)
    r.why = why
    return r


@pytest.fixture
def running(inventory: Path, folder: Path) -> Iterator[Running]:
    r = start(inventory, folder)
    yield r
    r.keeper.stop("test over")
    r.thread.join(10)


def host(**kw: Any) -> Host:
    return Host.model_validate({"name": "m1", "address": "127.0.0.1", "python": sys.executable, **kw})


def kept(inventory: Path, folder: Path, h: Host, persist: float = 60.0) -> KeptConnection:
    conn = KeeperClient(inventory, persist, folder).connection(h)
    assert isinstance(conn, KeptConnection)
    return conn


def test_a_command_runs_through_the_keeper_and_its_connection_is_reused(
    running: Running, inventory: Path, folder: Path
) -> None:
    lines: list[tuple[str, str]] = []
    conn = kept(inventory, folder, host())
    res = conn.run(
        "echo one; echo two >&2; printf tail; exit 3", on_line=lambda s, text: lines.append((s, text))
    )
    assert res.rc == 3 and res.stdout == "one\ntail" and res.stderr == "two\n"
    assert sorted(lines) == [("stderr", "two"), ("stdout", "one"), ("stdout", "tail")]
    again = kept(inventory, folder, host())
    assert again.run("echo $((6*7))").stdout == "42\n"
    assert len(running.factory.opened) == 1
    [entry] = list_connections(inventory, folder)["connections"]
    assert entry["host"] == "m1" and entry["served"] == 2 and entry["running"] == 0


def test_env_and_files_go_through(running: Running, inventory: Path, folder: Path) -> None:
    conn = kept(inventory, folder, host())
    assert conn.run('echo "$GREETING"', env={"GREETING": "hi there"}).stdout == "hi there\n"
    target = folder.parent / "sub" / "f.bin"
    conn.put_bytes(b"\x00\x01data", str(target), mode=0o600, dir_mode=0o700)
    assert target.read_bytes() == b"\x00\x01data" and target.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    "change",
    [{"address": "127.0.0.2"}, {"port": 2222}, {"user": "other"}, {"ssh_key": "KEY"}, {"known_hosts": "KH"}],
)
def test_a_changed_inventory_entry_gets_a_new_connection(
    running: Running, inventory: Path, folder: Path, change: dict[str, Any]
) -> None:
    kept(inventory, folder, host())
    for k, v in change.items():
        if v in ("KEY", "KH"):
            f = folder.parent / v
            f.write_text("x")
            change[k] = f
    kept(inventory, folder, host(**change))
    assert len(running.factory.opened) == 2
    assert [h.model_dump(include=set(change)) for h in running.factory.opened][1] == change
    kept(inventory, folder, host(**change))
    assert len(running.factory.opened) == 2  # and the new one is kept in turn


def test_new_bytes_in_the_key_or_known_hosts_file_are_a_new_connection(
    running: Running, inventory: Path, folder: Path
) -> None:
    kh = folder.parent / "known_hosts"
    kh.write_text("old pin\n")
    kept(inventory, folder, host(known_hosts=kh))
    kh.write_text("new pin\n")  # `labctl trust --replace`
    kept(inventory, folder, host(known_hosts=kh))
    assert len(running.factory.opened) == 2


def test_two_inventories_naming_the_same_host_keep_separate_connections(folder: Path) -> None:
    invs = []
    for name in ("a", "b"):
        p = folder.parent / f"{name}.yaml"
        p.write_text("lab: t\n")
        invs.append(p)
    assert connection_key(str(invs[0]), host_to_wire(host())) != connection_key(
        str(invs[1]), host_to_wire(host())
    )
    a, b = start(invs[0], folder), start(invs[1], folder)
    try:
        kept(invs[0], folder, host()).run("true")
        kept(invs[1], folder, host()).run("true")
        assert len(a.factory.opened) == 1 and len(b.factory.opened) == 1
        # A keeper asked about another inventory's host declines: the command connects itself.
        wrong = KeeperClient(invs[0], 60.0, folder)
        answer = wrong.request({**wrong.host_request(host(), "open"), "inventory": str(invs[1])})
        assert answer["t"] == "unwilling"
    finally:
        for r in (a, b):
            r.keeper.stop("test over")
            r.thread.join(10)


def test_a_dead_connection_is_dropped_and_opened_again(
    running: Running, inventory: Path, folder: Path
) -> None:
    kept(inventory, folder, host()).run("true")
    running.factory.dead = True
    conn = kept(inventory, folder, host())
    running.factory.dead = False
    assert conn.run("echo fine").stdout == "fine\n"
    assert len(running.factory.opened) == 2 and running.factory.conns[0].closed


def test_errors_keep_their_class_and_hint(running: Running, inventory: Path, folder: Path) -> None:
    running.factory.fail = Unreachable(
        "m1 (127.0.0.1:22) did not answer within 10 s.", "Check that it is on."
    )
    with pytest.raises(Unreachable) as e:
        KeeperClient(inventory, 60.0, folder).connection(host())
    assert e.value.hint == "Check that it is on." and e.value.status == "unreachable"


def _pid_from(path: Path) -> int:
    for _ in range(100):
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError("the command never started")


def test_a_client_that_goes_away_ends_its_command(running: Running, inventory: Path, folder: Path) -> None:
    pidfile = folder.parent / "pid"
    client = KeeperClient(inventory, 60.0, folder)
    s = ks.connect(client.socket_path)
    ks.send_frame(
        s, client.host_request(host(), "run", command=f"echo $$ > {pidfile}; exec sleep 60", timeout=None)
    )
    pid = _pid_from(pidfile)
    s.close()  # what Ctrl-C or a killed labctl does to the socket
    assert pid_gone(pid)
    deadline = time.monotonic() + 5
    while list_connections(inventory, folder)["connections"][0]["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list_connections(inventory, folder)["connections"][0]["running"] == 0


def test_cancel_and_timeout_come_back_as_on_a_direct_connection(
    running: Running, inventory: Path, folder: Path
) -> None:
    conn = kept(inventory, folder, host())
    res = conn.run("sleep 30", timeout=0.5)
    assert res.timed_out and res.rc is None and not res.ok
    pidfile = folder.parent / "pid2"
    cancel = threading.Event()
    out: list[Any] = []
    t = threading.Thread(
        target=lambda: out.append(conn.run(f"echo $$ > {pidfile}; exec sleep 60", cancel=cancel))
    )
    t.start()
    pid = _pid_from(pidfile)
    cancel.set()
    t.join(10)
    assert out and out[0].cancelled and out[0].rc is None
    assert pid_gone(pid)


def test_close_drops_kept_connections(running: Running, inventory: Path, folder: Path) -> None:
    kept(inventory, folder, host())
    kept(inventory, folder, host(name="m2", address="127.0.0.3"))
    assert close_connections(inventory, "m2", folder) == ["m2"]
    assert [c["host"] for c in list_connections(inventory, folder)["connections"]] == ["m1"]
    assert close_connections(inventory, None, folder) == ["m1"]
    assert list_connections(inventory, folder)["connections"] == []


def test_a_keeper_that_goes_away_mid_command_is_a_lost_connection(
    running: Running, inventory: Path, folder: Path
) -> None:
    conn = kept(inventory, folder, host())
    t = threading.Timer(0.5, lambda: running.keeper.stop("test"))
    t.start()
    with pytest.raises(TransportError):
        # Stopping closes the connection under the command; a LocalConnection has nothing to
        # close, so the keeper's socket closing at exit is what the client sees.
        conn.run("sleep 3; echo late")
        raise TransportError("the command finished", "")


def test_asked_to_stop_it_stops_and_removes_its_socket(
    running: Running, inventory: Path, folder: Path
) -> None:
    path = KeeperClient(inventory, 60.0, folder).socket_path
    assert path.exists()
    assert stop(inventory, folder)
    running.thread.join(10)
    assert running.why == ["asked"] and not path.exists()
    assert not stop(inventory, folder)  # nobody there


def test_idle_it_exits(inventory: Path, folder: Path) -> None:
    r = start(inventory, folder, persist=60)
    # The inventory's persist as the latest command read it wins over the one it started with.
    kept(inventory, folder, host(), persist=0.5).run("true")
    r.thread.join(10)
    assert r.why == ["idle"]
    assert r.factory.conns[0].closed


def test_a_running_command_is_not_idle(inventory: Path, folder: Path) -> None:
    r = start(inventory, folder, persist=0.3)
    try:
        assert kept(inventory, folder, host(), persist=0.3).run("sleep 1.5; echo done").stdout == "done\n"
        assert r.thread.is_alive()
    finally:
        r.keeper.stop("test over")
        r.thread.join(10)


def test_its_inventory_file_removed_it_exits(inventory: Path, folder: Path) -> None:
    r = start(inventory, folder)
    inventory.unlink()
    r.thread.join(10)
    assert r.why == ["inventory file removed"]


def test_a_second_keeper_for_the_same_inventory_leaves(
    running: Running, inventory: Path, folder: Path
) -> None:
    other = Keeper(inventory, 60.0, ks.socket_path(inventory, folder), factory=Factory())
    assert not other.bind()
    assert list_connections(inventory, folder)["pid"] == os.getpid()


def _as_nobody(fn: Any) -> str:
    """Run `fn` in a child process as uid/gid 65534; its return value (a string) comes back."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            out = str(fn())
        except BaseException as e:
            out = f"raised {type(e).__name__}: {e}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


def test_another_user_cannot_reach_the_socket(running: Running, inventory: Path, folder: Path) -> None:
    path = KeeperClient(inventory, 60.0, folder).socket_path

    def attempt() -> str:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(path))
        return "connected"

    assert _as_nobody(attempt).startswith("raised PermissionError")


def test_another_user_who_reaches_the_socket_is_refused(
    running: Running, inventory: Path, folder: Path
) -> None:
    # Open the folder and the socket to everyone: only the peer check stands in the way.
    path = KeeperClient(inventory, 60.0, folder).socket_path
    os.chmod(folder.parent, 0o711)
    os.chmod(folder, 0o711)
    os.chmod(path, 0o666)

    def attempt() -> str:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(str(path))
        ks.send_frame(s, {"op": "list"})
        answer = ks.recv_frame(s)
        return f"answered {answer}"

    out = _as_nobody(attempt)
    # Not a word back: the keeper closes on it, before or while its request is sent (which the
    # sender sees as a reset or a broken pipe) or after (an end of file where an answer would be).
    assert out == "answered None" or out.startswith(
        ("raised ConnectionResetError", "raised BrokenPipeError")
    ), out
    # Its own user's commands stay away from a folder others may enter...
    assert KeeperClient(inventory, 60.0, folder).connection(host()) is None
    os.chmod(folder, 0o700)
    kept(inventory, folder, host())  # ...and are served again once it is private


def test_the_folder_must_be_private(folder: Path) -> None:
    assert ks.ensure_dir(folder) == folder
    os.chmod(folder, 0o755)
    with pytest.raises(ks.KeeperUnavailable, match="mode 755"):
        ks.ensure_dir(folder)
    os.chmod(folder, 0o700)
    link = folder.parent / "link"
    link.symlink_to(folder)
    with pytest.raises(ks.KeeperUnavailable, match="not a folder"):
        ks.ensure_dir(link)
    fresh = folder.parent / "new" / "keeper"
    assert ks.ensure_dir(fresh) == fresh and fresh.stat().st_mode & 0o777 == 0o700
    if os.geteuid() == 0:
        os.chown(folder, 65534, 65534)
        with pytest.raises(ks.KeeperUnavailable, match="belongs to uid 65534"):
            ks.ensure_dir(folder)


def test_a_keeper_of_another_version_declines_and_leaves(
    running: Running, inventory: Path, folder: Path
) -> None:
    client = KeeperClient(inventory, 60.0, folder)
    s = ks.connect(client.socket_path)
    ks.send_frame(s, {**client.host_request(host(), "open"), "v": ks.PROTOCOL + 1})
    answer = ks.recv_frame(s)
    assert answer is not None and answer["t"] == "unwilling"
    s.close()
    running.thread.join(10)
    assert running.why == ["another labctl version"]
