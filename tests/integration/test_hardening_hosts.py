"""Hosts that are full, minimal or go away, against the simulated lab over real SSH.

Each test that changes a sim host (a tmpfs over a folder, sshd without SFTP, a stopped host,
a command left running on the Windows-marked workstation) puts it back in a `finally`.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, labctl, run_json, sh

pytestmark = pytest.mark.integration
AGENT_DIR = "/var/lib/labctl/agent"


def pids_of(pattern: str) -> list[int]:
    """Processes whose whole command line is `pattern` (a regex): the hosts' commands, not labctl's own."""
    out = subprocess.run(["pgrep", "-f", f"^{pattern}$"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def kill_pids(pattern: str) -> None:
    """End the processes this test left running on purpose, by their ids."""
    import os

    for pid in pids_of(pattern):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for(pattern: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not pids_of(pattern):
        assert time.monotonic() < deadline, f"{pattern!r} never started"
        time.sleep(0.1)


@pytest.fixture
def agent_tmpfs(lab: Any) -> Iterator[Any]:
    """A function mounting a tmpfs (with options) over pharaoh's agent folder; unmounted after."""
    inv = lab.inventory_path

    def mount(options: str) -> None:
        sh(inv, "pharaoh", f"mkdir -p {AGENT_DIR} && mount -t tmpfs -o {options} tmpfs {AGENT_DIR}")

    try:
        yield mount
    finally:
        sh(inv, "pharaoh", f"while mountpoint -q {AGENT_DIR}; do umount {AGENT_DIR}; done; true")


def test_agent_upload_to_a_full_folder_is_named_and_leaves_nothing_to_trust(
    lab: Any, agent_tmpfs: Any
) -> None:
    inv = lab.inventory_path
    agent_tmpfs("size=16k")
    rc, doc = run_json(inv, "facts", "--no-torch", "-l", "pharaoh")
    r = doc["results"][0]
    assert rc == 1 and r["status"] == "failed"
    assert f"disk full on pharaoh:{AGENT_DIR}" in r["error"] and "df -h" in r["hint"]
    assert sh(inv, "pharaoh", f"ls -A {AGENT_DIR}").split() == []  # no half agent, no temp file
    # Space freed: the next run uploads a whole agent and works.
    sh(inv, "pharaoh", f"mount -o remount,size=4m {AGENT_DIR}")
    rc, doc = run_json(inv, "facts", "--no-torch", "-l", "pharaoh")
    assert rc == 0, doc


def test_read_only_agent_folder_is_named(lab: Any, agent_tmpfs: Any) -> None:
    agent_tmpfs("size=1m,ro")
    rc, doc = run_json(lab.inventory_path, "facts", "--no-torch", "-l", "pharaoh")
    r = doc["results"][0]
    assert rc == 1 and "internal error" not in r["error"]
    assert f"pharaoh:{AGENT_DIR} is not writable" in r["error"] and "remount,rw" in r["hint"]


def test_a_damaged_cached_agent_is_replaced_not_run(lab: Any) -> None:
    from labctl.hosts.agent_ship import agent_zip

    inv = lab.inventory_path
    data, digest = agent_zip()
    labctl("-i", str(inv), "facts", "--no-torch", "-l", "pharaoh", check=True)
    path = f"{AGENT_DIR}/agent-{digest}.pyz"
    # Same size, wrong bytes: only the hash can tell.
    sh(inv, "pharaoh", f"head -c {len(data)} /dev/zero > {path}")
    rc, doc = run_json(inv, "facts", "--no-torch", "-l", "pharaoh")
    assert rc == 0, doc
    assert sh(inv, "pharaoh", f"sha256sum {path}").split()[0].startswith(digest)


def test_a_host_without_sftp_gets_facts_and_provision(lab: Any, tmp_path: Path) -> None:
    inv = lab.inventory_path
    target = "/var/lib/labctl/nosftp-test.txt"
    book = tmp_path / "play.yaml"
    book.write_text(
        "name: no sftp\nplays:\n  - hosts: pharaoh\n    tags: [nosftp]\n    resources:\n"
        f"      - file: {{path: {target}, content: \"hello from labctl\\n\", mode: '0640'}}\n"
    )
    sh(inv, "pharaoh", f"rm -rf {AGENT_DIR}")  # the agent must be uploaded again
    assert lab.set_sftp("pharaoh", False)
    try:
        rc, doc = run_json(inv, "facts", "--no-torch", "-l", "pharaoh")
        assert rc == 0, doc
        rc, doc = run_json(inv, "provision", "-p", str(book), "--tags", "nosftp", "-l", "pharaoh")
        assert rc == 0, doc
        assert sh(inv, "pharaoh", f"stat -c %a {target}; cat {target}").split("\n")[:2] == [
            "640",
            "hello from labctl",
        ]
    finally:
        lab.set_sftp("pharaoh", True)
        sh(inv, "pharaoh", f"rm -f {target}")


def test_a_session_that_drops_mid_command_is_named_as_lost(through: str, lab: Any) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "labctl",
            "--json",
            "-i",
            str(lab.inventory_path),
            "exec",
            "-l",
            "pharaoh",
            "--",
            "sleep 4341",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for("sleep 4341")
        lab.stop_host("pharaoh")  # sshd and every session it had: the connection goes away
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        lab.start_host("pharaoh")
    r = json.loads(out)["results"][0]
    assert proc.returncode == 1 and "Traceback" not in err
    assert r["status"] == "unreachable" and "connection to pharaoh" in r["error"] and "lost" in r["error"]


def test_windows_host_after_timeout_says_the_command_may_still_run(lab: Any) -> None:
    try:
        rc, doc = run_json(
            lab.inventory_path, "exec", "-l", "workstation", "--timeout", "1", "--", "sleep 4342"
        )
        r = doc["results"][0]
        assert rc == 1 and r["status"] == "timeout" and r["may_still_run"] is True
        assert "may still be running" in r["error"] and "taskkill /T" in r["hint"]
        assert pids_of("sleep 4342")  # honest: it does still run there
    finally:
        kill_pids("sleep 4342")


def _interrupt(args: list[str], started: str, count: int = 1) -> tuple[int, str, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "labctl", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while len(pids_of(started)) < count:
            assert time.monotonic() < deadline, f"{started!r} never started"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


def test_ctrl_c_says_what_was_interrupted_and_that_windows_may_still_run(through: str, lab: Any) -> None:
    inv = str(lab.inventory_path)
    try:
        rc, out, err = _interrupt(
            ["-i", inv, "exec", "-l", "m5,workstation", "--", "sleep 4343"], "sleep 4343", 2
        )
        assert rc == 130 and "Traceback" not in err
        assert "Interrupted (Ctrl-C): `labctl exec`" in err
        assert "On workstation" in err and "may still be running" in err and "taskkill /T" in err
        rc, out, _ = _interrupt(
            ["--json", "-i", inv, "exec", "-l", "workstation", "--", "sleep 4344"], "sleep 4344"
        )
        doc = json.loads(out)
        assert rc == 130 and doc["exit_code"] == 130 and doc["may_still_run"] == ["workstation"]
    finally:
        kill_pids("sleep 434[34]")


def test_a_port_that_is_not_ssh_gives_one_clean_row(through: str, tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    inv = tmp_path / "web.yaml"
    inv.write_text(yaml.safe_dump({"lab": "w", "hosts": {"web": {"address": "127.0.0.1", "port": port}}}))
    try:
        proc = labctl("-i", str(inv), "exec", "--", "true")
    finally:
        server.close()
    assert proc.returncode == 1 and "unreachable" in proc.stderr
    assert "Traceback" not in proc.stderr and "Exception" not in proc.stderr, proc.stderr


HARD = "/mnt/hard-cache"
MODEL = "hardening-8m.bin"


@pytest.fixture
def hard_cache(lab: Any, tmp_path: Path) -> Iterator[Path]:
    """m5 caching into a 16 MiB tmpfs at HARD from irina, which stores an 8 MiB model; undone after."""
    doc = yaml.safe_load(lab.inventory_path.read_text())
    doc["defaults"]["ssh_key"] = str(lab.key_path)
    doc["defaults"]["known_hosts"] = str(lab.known_hosts_path)
    doc["hosts"]["m5"]["model_cache"] = {"path": HARD, "size_gb": 0.015625, "source": "irina"}
    inv = tmp_path / "hard.yaml"
    inv.write_text(yaml.safe_dump(doc))
    sh(inv, "irina", f"mkdir -p /srv/models && head -c 8M /dev/urandom > /srv/models/{MODEL}")
    sh(inv, "m5", f"mkdir -p {HARD} && mount -t tmpfs -o size=16m tmpfs {HARD}")
    try:
        yield inv
    finally:
        sh(
            inv,
            "m5",
            f"umount {HARD}; rmdir {HARD}; while mountpoint -q {AGENT_DIR}; do umount {AGENT_DIR}; done; true",
        )
        sh(inv, "irina", f"rm -f /srv/models/{MODEL}")


def test_a_cache_disk_that_fills_during_sync_is_named_not_the_network(hard_cache: Path) -> None:
    inv = hard_cache
    # The copy's progress records get one page: the first chunk's record finds the disk full.
    state = f"{HARD}/.labctl/state"
    sh(inv, "m5", f"mkdir -p {state} && mount -t tmpfs -o size=4k tmpfs {state}")
    try:
        rc, doc = run_json(inv, "cache", "sync", MODEL, "--host", "m5")
    finally:
        sh(inv, "m5", f"umount {state}")
    r = doc["results"][0]
    assert rc == 1 and "broke" not in r["error"], r
    assert f"disk full on m5:{HARD}" in r["error"] and "df -h" in r["hint"] and "again" in r["hint"]


def test_a_sync_token_that_does_not_fit_is_named_not_written_empty(hard_cache: Path) -> None:
    inv = hard_cache
    labctl("-i", str(inv), "facts", "--no-torch", "-l", "m5", check=True)  # the agent is cached
    sh(
        inv,
        "m5",
        # Room for the agent's zipapp (about 310 KB) and little more.
        f"mount -t tmpfs -o size=1m tmpfs {AGENT_DIR} && cp {AGENT_DIR}/../agent/*.pyz {AGENT_DIR}/ 2>/dev/null; true",
    )
    labctl("-i", str(inv), "facts", "--no-torch", "-l", "m5", check=True)  # uploaded into the small folder
    sh(inv, "m5", f"head -c 2M /dev/zero > {AGENT_DIR}/fill 2>/dev/null; true")  # now full
    rc, doc = run_json(inv, "cache", "sync", MODEL, "--host", "m5")
    r = doc["results"][0]
    assert rc == 1 and "token" not in r["error"], r
    assert f"disk full on m5:{AGENT_DIR}" in r["error"]


def test_an_agent_write_to_a_full_cache_names_the_disk_and_file(hard_cache: Path) -> None:
    inv = hard_cache
    rc, doc = run_json(inv, "cache", "sync", MODEL, "--host", "m5")
    assert rc == 0, doc
    sh(inv, "m5", f"head -c 16M /dev/zero > {HARD}/not-labctls 2>/dev/null; true")  # the disk is now full
    rc, doc = run_json(inv, "cache", "pin", MODEL, "--host", "m5")
    r = doc["results"][0]
    assert rc == 1 and "Errno" not in r["error"], r
    assert f"disk full on m5:{HARD}/.labctl/" in r["error"], r
