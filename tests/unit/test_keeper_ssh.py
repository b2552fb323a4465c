"""The keeper with real SSH: a private sshd on 127.0.0.1 (this machine's /usr/sbin/sshd, a host
key and a client key made for the test, the host key pinned in a known_hosts of its own), and
the keeper opening its connections exactly as a command does (pool.open_connection)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from labctl.hosts.context import Context
from labctl.inventory.load import load_inventory
from labctl.inventory.model import Host
from labctl.keeper import sock as ks
from labctl.keeper.client import KeeperClient, KeptConnection, list_connections, stop
from labctl.keeper.server import Keeper
from labctl.transport.base import HostKeyError
from labctl.transport.ssh import SSHConnection
from tests.conftest import pid_gone

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
pytestmark = pytest.mark.skipif(
    not (os.path.exists(SSHD) and shutil.which("ssh-keygen") and os.geteuid() == 0),
    reason="needs sshd, ssh-keygen and root (to log in as root on 127.0.0.1)",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Lab:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        for name in ("host_key", "client_key", "other_key"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / name)], check=True
            )
        (root / "authorized_keys").write_text((root / "client_key.pub").read_text())
        pub = (root / "host_key.pub").read_text().split()
        self.pin = f"[127.0.0.1]:{self.port} {pub[0]} {pub[1]}\n"
        (root / "known_hosts").write_text(self.pin)
        other = (root / "other_key.pub").read_text().split()
        (root / "wrong_known_hosts").write_text(f"[127.0.0.1]:{self.port} {other[0]} {other[1]}\n")
        (root / "sshd_config").write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {root / 'host_key'}",
                    f"PidFile {root / 'sshd.pid'}",
                    f"AuthorizedKeysFile {root / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "UseDNS no",
                    "MaxSessions 64",
                    "",
                ]
            )
        )
        self.inventory = root / "lab.yaml"
        self.write_inventory()
        self.sshd = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(root / "sshd_config")], stderr=subprocess.DEVNULL
        )
        end = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < end and self.sshd.poll() is None, "sshd did not start"
                time.sleep(0.05)

    def write_inventory(self, **extra: Any) -> None:
        host = {
            "address": "127.0.0.1",
            "port": self.port,
            "user": "root",
            "ssh_key": "client_key",
            "known_hosts": "known_hosts",
            "python": sys.executable,
            **extra,
        }
        self.inventory.write_text(json.dumps({"lab": "k", "hosts": {"m1": host}}))

    def host(self, **extra: Any) -> Host:
        self.write_inventory(**extra)
        return load_inventory(self.inventory).host("m1")

    def sessions(self) -> list[int]:
        """The sshd processes serving a connection (children of the listener)."""
        out = subprocess.run(["pgrep", "-P", str(self.sshd.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def close(self) -> None:
        for pid in self.sessions():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.sshd.kill()
        self.sshd.wait()


@pytest.fixture
def lab() -> Iterator[Lab]:
    root = Path(tempfile.mkdtemp(prefix="ksh", dir="/tmp"))
    os.mkdir(root / "k", 0o700)
    lab = Lab(root)
    yield lab
    lab.close()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def keeper(lab: Lab) -> Iterator[Keeper]:
    k = Keeper(lab.inventory, 60, ks.socket_path(lab.inventory, lab.root / "k"), tick=0.1)
    assert k.bind()
    t = threading.Thread(target=k.serve, daemon=True)
    t.start()
    yield k
    k.stop("test over")
    t.join(10)


def kept(lab: Lab, host: Host) -> KeptConnection:
    conn = KeeperClient(lab.inventory, 60, lab.root / "k").connection(host)
    assert isinstance(conn, KeptConnection)
    return conn


def the_connection(k: Keeper) -> SSHConnection:
    [entry] = [e for e in k.entries.values() if e.conn is not None]
    assert isinstance(entry.conn, SSHConnection)
    return entry.conn


def test_commands_share_one_ssh_connection(lab: Lab, keeper: Keeper) -> None:
    h = lab.host()
    lines: list[tuple[str, str]] = []
    res = kept(lab, h).run("echo out; echo err >&2; exit 4", on_line=lambda s, text: lines.append((s, text)))
    assert (res.rc, res.stdout, res.stderr) == (4, "out\n", "err\n") and sorted(lines) == [
        ("stderr", "err"),
        ("stdout", "out"),
    ]
    first = the_connection(keeper)
    assert kept(lab, h).run("echo $((1+1))").stdout == "2\n"
    assert the_connection(keeper) is first and len(lab.sessions()) == 1
    target = lab.root / "up" / "f.txt"
    kept(lab, h).put_bytes(b"payload", str(target), mode=0o640, dir_mode=0o750)
    assert target.read_bytes() == b"payload" and target.stat().st_mode & 0o777 == 0o640


def test_a_closed_client_ends_the_remote_command(lab: Lab, keeper: Keeper) -> None:
    pidfile = lab.root / "pid"
    client = KeeperClient(lab.inventory, 60, lab.root / "k")
    kept(lab, lab.host())
    s = ks.connect(client.socket_path)
    ks.send_frame(s, client.host_request(lab.host(), "run", command=f"echo $$ > {pidfile}; exec sleep 60"))
    end = time.monotonic() + 15
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < end
        time.sleep(0.05)
    pid = int(pidfile.read_text())
    s.close()
    assert pid_gone(pid, 15), "the remote command outlived its caller"
    assert kept(lab, lab.host()).run("echo still").stdout == "still\n"  # the connection stays


def test_timeout_and_cancel_as_on_a_direct_connection(lab: Lab, keeper: Keeper) -> None:
    conn = kept(lab, lab.host())
    res = conn.run("sleep 30", timeout=1)
    assert res.timed_out and res.rc is None
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    res = conn.run("sleep 30", cancel=cancel)
    assert res.cancelled and res.rc is None and res.seconds < 10


def test_a_dead_connection_is_dropped_and_reopened(lab: Lab, keeper: Keeper) -> None:
    kept(lab, lab.host()).run("true")
    first = the_connection(keeper)
    for pid in lab.sessions():
        os.kill(pid, signal.SIGKILL)  # the host side goes away, as in a reboot
    time.sleep(0.5)
    assert kept(lab, lab.host()).run("echo back").stdout == "back\n"
    assert the_connection(keeper) is not first


def test_changed_settings_or_pins_never_reuse_a_connection(lab: Lab, keeper: Keeper) -> None:
    kept(lab, lab.host()).run("true")
    first = the_connection(keeper)
    # The same pin with a comment added: other bytes in known_hosts, so another connection.
    (lab.root / "known_hosts").write_text("# re-pinned\n" + lab.pin)
    kept(lab, lab.host()).run("true")
    assert len([e for e in keeper.entries.values() if e.conn is not None]) == 2
    assert all(e.conn is not first for e in keeper.entries.values() if e.key != next(iter(keeper.entries)))


def test_the_pinned_host_key_is_checked_by_the_keeper(lab: Lab, keeper: Keeper) -> None:
    with pytest.raises(HostKeyError) as e:
        KeeperClient(lab.inventory, 60, lab.root / "k").connection(lab.host(known_hosts="wrong_known_hosts"))
    assert e.value.offered and e.value.pinned and e.value.offered != e.value.pinned


def test_the_pool_asks_the_keeper_and_starts_one(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LABCTL_KEEPER", "on")
    monkeypatch.setenv("LABCTL_KEEPER_DIR", str(lab.root / "k"))
    first = Context.create(lab.inventory)
    try:
        conn = first.pool.get(first.inventory.host("m1"))
        assert isinstance(conn, SSHConnection)  # no keeper yet: this command connects itself
    finally:
        first.close()
    end = time.monotonic() + 30
    while True:
        try:
            list_connections(lab.inventory, lab.root / "k")
            break
        except ks.KeeperUnavailable:
            assert time.monotonic() < end, "no keeper was started"
            time.sleep(0.1)
    try:
        for n in range(2):
            c = Context.create(lab.inventory)
            try:
                conn = c.pool.get(c.inventory.host("m1"))
                assert isinstance(conn, KeptConnection)
                assert conn.run(f"echo {n}").stdout == f"{n}\n"
            finally:
                c.close()
        listed = list_connections(lab.inventory, lab.root / "k")
        [entry] = listed["connections"]
        assert entry["served"] == 2 and entry["port"] == lab.port, listed
        from labctl.cli.app import app

        res = CliRunner().invoke(app, ["connections", "-i", str(lab.inventory), "--json"])
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        assert [e["host"] for e in doc["connections"]] == ["m1"], doc
    finally:
        assert stop(lab.inventory, lab.root / "k")


def test_keeping_always_sends_even_the_first_command_through_a_keeper_it_starts(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LABCTL_KEEPER", "always")
    monkeypatch.setenv("LABCTL_KEEPER_DIR", str(lab.root / "k"))
    with pytest.raises(ks.KeeperUnavailable):
        list_connections(lab.inventory, lab.root / "k")
    c = Context.create(lab.inventory)
    try:
        conn = c.pool.get(c.inventory.host("m1"))
        assert isinstance(conn, KeptConnection)  # the keeper it started, waited for
        assert conn.run("echo first").stdout == "first\n"
        [entry] = list_connections(lab.inventory, lab.root / "k")["connections"]
        assert entry["served"] == 1
    finally:
        c.close()
        assert stop(lab.inventory, lab.root / "k")
