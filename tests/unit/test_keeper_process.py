"""The keeper as the process a command starts (`client.spawn`): detached, and gone when idle,
when its inventory file is removed, when asked, and on SIGTERM. A `connection: local` host
stands in for an SSH one (the keeper opens it through pool.open_connection, as a command does)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from labctl.inventory.model import Host
from labctl.keeper import sock as ks
from labctl.keeper.client import KeeperClient, KeptConnection, list_connections, spawn, stop
from tests.conftest import keeper_folder, pid_gone


@pytest.fixture
def folder() -> Iterator[Path]:
    d = keeper_folder("kq")
    yield d
    shutil.rmtree(d.parent, ignore_errors=True)


@pytest.fixture
def inventory(folder: Path) -> Path:
    p = folder.parent / "lab.yaml"
    p.write_text("lab: t\nhosts: {m1: {address: 127.0.0.1, connection: local}}\n")
    return p


def started(inventory: Path, folder: Path, persist: float) -> subprocess.Popen[bytes]:
    proc = spawn(inventory, persist, folder)
    path = ks.socket_path(inventory, folder)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            list_connections(inventory, folder)
            return proc
        except ks.KeeperUnavailable:
            assert proc.poll() is None, "the keeper exited before it listened"
            time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"no keeper at {path}")


def ended(proc: subprocess.Popen[bytes], within: float = 15.0) -> int:
    try:
        return proc.wait(within)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("the keeper is still running") from None


def local_host() -> Host:
    return Host.model_validate(
        {"name": "m1", "address": "127.0.0.1", "connection": "local", "python": sys.executable}
    )


def test_it_runs_detached_serves_and_stops_when_asked(inventory: Path, folder: Path) -> None:
    proc = started(inventory, folder, 60)
    try:
        assert os.getsid(proc.pid) == proc.pid != os.getsid(0)
        answer = list_connections(inventory, folder)
        assert answer["pid"] == proc.pid and answer["inventory"] == str(inventory.absolute())
        conn = KeptConnection(KeeperClient(inventory, 60, folder), local_host())
        assert conn.run("echo $PPID; pwd").stdout.splitlines()[1] == "/"
        [entry] = list_connections(inventory, folder)["connections"]
        assert entry["host"] == "m1" and entry["served"] == 1
        assert stop(inventory, folder)
        assert ended(proc) == 0
        assert not ks.socket_path(inventory, folder).exists()
        assert sorted(os.listdir(folder)) == [ks.lock_path(ks.socket_path(inventory, folder)).name]
        assert ks.lock_path(ks.socket_path(inventory, folder)).read_bytes() == b""  # nothing written
    finally:
        if proc.poll() is None:
            proc.kill()


def test_idle_it_exits(inventory: Path, folder: Path) -> None:
    proc = started(inventory, folder, 1)
    assert ended(proc) == 0
    assert not ks.socket_path(inventory, folder).exists()


def test_its_inventory_removed_it_exits(inventory: Path, folder: Path) -> None:
    proc = started(inventory, folder, 600)
    inventory.unlink()
    assert ended(proc) == 0


def test_sigterm_ends_it(inventory: Path, folder: Path) -> None:
    proc = started(inventory, folder, 600)
    proc.send_signal(signal.SIGTERM)
    assert ended(proc) == 0
    assert not ks.socket_path(inventory, folder).exists()


def test_a_killed_client_ends_its_command(inventory: Path, folder: Path) -> None:
    """A labctl killed outright (no Ctrl-C handler runs): its socket closes, and so does the
    command's channel in the keeper."""
    proc = started(inventory, folder, 600)
    pidfile = folder.parent / "pid"
    script = (
        "import sys\n"
        "from labctl.keeper.client import KeeperClient, KeptConnection\n"
        "from labctl.inventory.model import Host\n"
        "from pathlib import Path\n"
        f"h = Host.model_validate({{'name': 'm1', 'address': '127.0.0.1', 'connection': 'local', 'python': sys.executable}})\n"
        f"c = KeptConnection(KeeperClient(Path({str(inventory)!r}), 600, Path({str(folder)!r})), h)\n"
        f"c.run('echo $$ > {pidfile}; exec sleep 120')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    client = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        end = time.monotonic() + 30
        while not (pidfile.exists() and pidfile.read_text().strip()):
            assert time.monotonic() < end and client.poll() is None
            time.sleep(0.05)
        pid = int(pidfile.read_text())
        client.kill()
        client.wait()
        assert pid_gone(pid, 10), "the command outlived its caller"
    finally:
        if client.poll() is None:
            client.kill()
        stop(inventory, folder)
        ended(proc)


def test_the_first_command_connects_itself_and_starts_a_keeper_for_the_next_when_done(
    inventory: Path, folder: Path
) -> None:
    ssh_host = Host.model_validate({"name": "m1", "address": "127.0.0.1"})
    client = KeeperClient(inventory, 60, folder)
    assert client.connection(ssh_host) is None  # nobody there: this command connects itself
    assert client.connection(ssh_host) is None  # and it tries once per run, not per host
    time.sleep(0.5)
    # Not while the command runs: a starting keeper would take CPU from a cold command.
    assert not ks.socket_path(inventory, folder).exists()
    client.close()  # the command is done
    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            pid = list_connections(inventory, folder)["pid"]
            break
        except ks.KeeperUnavailable:
            time.sleep(0.1)
    else:
        raise AssertionError("no keeper was started")
    assert stop(inventory, folder)
    assert pid_gone(pid, 15), "the keeper did not leave when asked"


def test_two_keepers_started_at_once_leave_one(inventory: Path, folder: Path) -> None:
    procs = [spawn(inventory, 60, folder) for _ in range(3)]
    try:
        exits: list[subprocess.Popen[bytes]] = []
        end = time.monotonic() + 30
        while time.monotonic() < end and len(exits) < 2:
            exits = [p for p in procs if p.poll() is not None]
            time.sleep(0.05)
        assert len(exits) == 2 and all(p.returncode == 0 for p in exits)
        [left] = [p for p in procs if p.poll() is None]
        assert list_connections(inventory, folder)["pid"] == left.pid
    finally:
        stop(inventory, folder)
        for p in procs:
            if p.poll() is None:
                ended(p)


def test_no_thread_is_left_behind_by_a_run(inventory: Path, folder: Path) -> None:
    proc = started(inventory, folder, 60)
    try:
        before = threading.active_count()
        conn = KeptConnection(KeeperClient(inventory, 60, folder), local_host())
        for _ in range(3):
            assert conn.run("true").rc == 0
        assert threading.active_count() == before
    finally:
        stop(inventory, folder)
        ended(proc)
