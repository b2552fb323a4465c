"""The network transaction for real on the simulated lab: a change that cuts labctl off is
undone by the host itself, a good one is kept, and killing labctl mid-way changes nothing.

Each test changes pharaoh's network (its own namespace) through `labctl exec --network`,
compares the namespace's links, addresses and routes (read with `ip -n`, from outside, so
no SSH is needed to look) before and after, and leaves it as it found it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, labctl, run_json

pytestmark = pytest.mark.integration
HOST = "pharaoh"
T = 8  # --revert-after in these tests: short, so a revert is seen within the test's time


def live(lab: Any, host: str = HOST) -> dict[str, Any]:
    """A host's addresses, routes and links as `ip` shows them from outside its namespace."""
    ns = lab.namespace(host)

    def ip(*args: str) -> Any:
        return json.loads(
            subprocess.run(["ip", "-j", "-n", ns, *args], capture_output=True, text=True, check=True).stdout
        )

    addrs = {
        a["ifname"]: sorted(f"{i['local']}/{i['prefixlen']}" for i in a.get("addr_info", []))
        for a in ip("addr", "show")
    }
    routes = sorted(json.dumps(r, sort_keys=True) for r in ip("route", "show", "table", "main"))
    links = sorted(link["ifname"] for link in ip("link", "show"))
    return {"addrs": addrs, "routes": routes, "links": links}


def netplan_files(lab: Any) -> dict[str, bytes]:
    folder = Path(lab.dir) / "hosts" / HOST / "root" / "etc" / "netplan"
    return {p.name: p.read_bytes() for p in folder.iterdir()} if folder.is_dir() else {}


def wait_back(lab: Any, before: dict[str, Any], within: float) -> dict[str, Any]:
    end = time.monotonic() + within
    now = live(lab)
    while now != before and time.monotonic() < end:
        time.sleep(0.5)
        now = live(lab)
    return now


def undo(lab: Any, cidr: str, dev: str) -> None:
    subprocess.run(["ip", "-n", lab.namespace(HOST), "addr", "del", cidr, "dev", dev], capture_output=True)


def start_verifying(inv: str, revert_after: float, change: str) -> subprocess.Popen[str]:
    """`labctl exec --network` held inside its transaction (a --verify that sleeps on the
    host keeps it there); returns once labctl has reconnected and is verifying."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [
        "exec",
        "-l",
        HOST,
        "--network",
        "--revert-after",
        f"{revert_after:g}",
        "--verify",
        "sleep 60",
        "--",
        change,
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "labctl", "-i", inv, *argv],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    seen = ""
    while "reconnected over a fresh SSH connection" not in seen:
        line = proc.stderr.readline()
        if not line:
            proc.kill()
            raise AssertionError(f"labctl ended before the transaction was verified: {seen}")
        seen += line
    return proc


def test_a_change_that_cuts_labctl_off_is_reverted_by_the_host(lab: Any) -> None:
    inv = str(lab.inventory_path)
    before, files_before = live(lab), netplan_files(lab)
    address = next(a for a in before["addrs"]["eth0"] if ":" not in a)
    cut = "ip addr flush dev eth0 && ip addr add 10.99.0.5/24 dev eth0"
    rc, doc = run_json(inv, "exec", "-l", HOST, "--network", "--revert-after", str(T), "--", cut, timeout=180)
    r = doc["results"][0]
    txn = r["transaction"]
    assert rc == 1, r
    assert r["status"] == "failed"
    assert txn["outcome"] == "reverted", txn
    assert txn["back_on_old_config"] is True and txn["differences"] == []
    assert "lost contact" in r["error"] and "reverted by itself" in r["error"], r["error"]
    assert txn["revert"]["reason"].startswith("not confirmed within"), txn["revert"]
    assert f"ip addr add {address} dev eth0" in txn["revert"]["ran"]
    # labctl saw the host gone, then back: the order of what it reports.
    seen = " | ".join(txn["seen"])
    assert seen.index("armed") < seen.index("lost contact") < seen.index("back on its old config"), seen
    # Nothing else changed: addresses, routes, links and /etc/netplan are as they were.
    assert live(lab) == before
    assert netplan_files(lab) == files_before


def test_a_good_change_is_committed_and_the_revert_never_fires(lab: Any) -> None:
    inv = str(lab.inventory_path)
    before = live(lab)
    try:
        rc, doc = run_json(
            inv,
            "exec",
            "-l",
            HOST,
            "--network",
            "--revert-after",
            str(T),
            "--",
            "ip addr add 10.77.0.5/24 dev eth1",
        )
        txn = doc["results"][0]["transaction"]
        assert rc == 0, doc
        assert txn["outcome"] == "committed", txn
        assert any("reconnected over a fresh SSH connection" in s for s in txn["seen"]), txn["seen"]
        time.sleep(T + 3)  # past the keeper's deadline: a committed change stays
        after = live(lab)
        assert "10.77.0.5/24" in after["addrs"]["eth1"]
        assert after["addrs"]["eth0"] == before["addrs"]["eth0"]
        # The host's own record agrees, and no transaction is left open.
        rc, doc = run_json(
            inv,
            "exec",
            "-l",
            HOST,
            "--",
            f"cat /var/lib/labctl/net/{txn['id']}/txn.json; echo; ls /var/lib/labctl/net",
        )
        out = doc["results"][0]["stdout"]
        record = json.loads(out.splitlines()[0])
        assert record["state"] == "committed" and "revert" not in record
        assert "current" not in out.split()
    finally:
        undo(lab, "10.77.0.5/24", "eth1")


def test_a_failed_verification_reverts_at_once(lab: Any) -> None:
    inv = str(lab.inventory_path)
    before = live(lab)
    start = time.monotonic()
    rc, doc = run_json(
        inv,
        "exec",
        "-l",
        HOST,
        "--network",
        "--revert-after",
        "60",
        "--verify",
        "false",
        "--",
        "ip addr add 10.78.0.5/24 dev eth1",
    )
    took = time.monotonic() - start
    txn = doc["results"][0]["transaction"]
    assert rc == 1
    assert txn["outcome"] == "reverted" and txn["back_on_old_config"] is True, txn
    assert txn["problems"] == ["--verify `false` exited 1"], txn["problems"]
    assert txn["revert"]["reason"].startswith("labctl asked for it"), txn["revert"]
    # Asked to revert, the keeper did not wait for its 60 s deadline.
    assert took < 60, took
    assert live(lab) == before


def test_a_command_that_fails_on_the_host_is_undone(lab: Any) -> None:
    inv = str(lab.inventory_path)
    before = live(lab)
    line = "ip addr add 10.79.0.5/24 dev eth1 && ip addr add 10.79.0.6/24 dev no-such-nic"
    # A deadline longer than the test may take: the host reverts a failed change at once, and
    # labctl looks at once instead of waiting for a deadline that no longer applies.
    rc, doc = run_json(inv, "exec", "-l", HOST, "--network", "--revert-after", "900", "--", line)
    r = doc["results"][0]
    assert rc == 1
    assert r["transaction"]["outcome"] == "reverted"
    seen = " | ".join(r["transaction"]["seen"])
    assert "the change failed on the host, which reverts it now" in seen, seen
    assert "waiting for the host to revert by itself" not in seen, seen
    assert "the change failed on the host" in r["error"] and "no-such-nic" in r["error"], r["error"]
    assert r["rc"] not in (0, None)
    # Its first half (the address on eth1) did not stay behind.
    assert live(lab) == before


def test_labctl_killed_mid_transaction_the_host_still_reverts_and_refuses_a_second(lab: Any) -> None:
    inv = str(lab.inventory_path)
    before = live(lab)
    proc = start_verifying(inv, T, "ip addr add 10.80.0.5/24 dev eth1")
    try:
        assert "10.80.0.5/24" in live(lab)["addrs"]["eth1"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        # While the keeper waits for its deadline, a second change on the host is refused.
        second = labctl(
            "--json", "-i", inv, "exec", "-l", HOST, "--network", "--", "ip addr add 10.81.0.5/24 dev eth1"
        )
        assert second.returncode == 1, second.stderr
        r = json.loads(second.stdout)["results"][0]
        assert r["transaction"]["outcome"] == "refused"
        assert "another network transaction is open" in r["error"], r["error"]
        assert "10.81.0.5/24" not in live(lab)["addrs"]["eth1"]
        # With labctl dead, nothing confirms: the host goes back by itself.
        assert wait_back(lab, before, T + 15) == before
    finally:
        if proc.poll() is None:
            proc.kill()
        undo(lab, "10.80.0.5/24", "eth1")


def test_network_exec_on_a_host_without_sftp(lab: Any) -> None:
    inv = str(lab.inventory_path)
    assert lab.set_sftp(HOST, False)
    try:
        rc, doc = run_json(
            inv,
            "exec",
            "-l",
            HOST,
            "--network",
            "--revert-after",
            str(T),
            "--",
            "ip addr add 10.82.0.5/24 dev eth1",
        )
        assert rc == 0, doc
        assert doc["results"][0]["transaction"]["outcome"] == "committed"
        assert "10.82.0.5/24" in live(lab)["addrs"]["eth1"]
    finally:
        lab.set_sftp(HOST, True)
        undo(lab, "10.82.0.5/24", "eth1")


def test_verify_without_network_is_an_input_error(lab: Any) -> None:
    proc = labctl("-i", str(lab.inventory_path), "exec", "-l", HOST, "--verify", "true", "--", "true")
    assert proc.returncode == 2
    assert "--verify only goes with --network" in proc.stderr


def test_bond_preflight_refuses_on_a_host_without_a_bonding_driver_and_changes_nothing(lab: Any) -> None:
    """The sim's m5 declares bond0 over eth0+eth1 (as the seed lab's M5 does); this kernel has
    no bonding driver, so provision must refuse before it writes or applies anything."""
    inv = str(lab.inventory_path)
    folder = Path(lab.dir) / "hosts" / "m5" / "root" / "etc" / "netplan"
    files_before = sorted(folder.iterdir()) if folder.is_dir() else []
    live_before = live(lab, "m5")
    book = REPO / "playbooks" / "network.yaml"
    for check in ([], ["--check", "--diff"]):
        rc, doc = run_json(inv, "provision", "-p", str(book), "-l", "m5", *check)
        r = next(x for x in doc["results"] if x["type"] == "bond")
        assert rc == 1, doc
        assert r["status"] == "failed"
        assert "no bonding driver" in r["error"] and "modprobe bonding" in r["error"], r["error"]
        assert "Nothing on the host was changed" in r["hint"]
    assert (sorted(folder.iterdir()) if folder.is_dir() else []) == files_before
    assert live(lab, "m5") == live_before
    # No transaction was even begun: the preflight runs before the host is touched.
    rc, doc = run_json(
        inv, "exec", "-l", "m5", "--", "ls /var/lib/labctl/net 2>/dev/null | grep -v lock || true"
    )
    assert doc["results"][0]["stdout"].strip() == ""


def test_network_changes_go_one_host_at_a_time(lab: Any) -> None:
    """Two hosts in one run: the second host's transaction begins only after the first one's
    was committed (as the hosts' own records say), though exec runs hosts in parallel."""
    inv = str(lab.inventory_path)
    hosts = ["pharaoh", "irina"]
    try:
        rc, doc = run_json(
            inv,
            "exec",
            "-l",
            ",".join(hosts),
            "--network",
            "--revert-after",
            "20",
            "--",
            "ip addr add 10.83.0.5/24 dev eth1",
        )
        assert rc == 0, doc
        records = []
        for r in doc["results"]:
            tid = r["transaction"]["id"]
            _, d = run_json(inv, "exec", "-l", r["host"], "--", f"cat /var/lib/labctl/net/{tid}/txn.json")
            records.append(json.loads(d["results"][0]["stdout"]))
        first, second = sorted(records, key=lambda x: x["created_at"])
        assert first["state"] == second["state"] == "committed"
        assert second["created_at"] > first["committed_at"], (first, second)
    finally:
        for h in hosts:
            subprocess.run(
                ["ip", "-n", lab.namespace(h), "addr", "del", "10.83.0.5/24", "dev", "eth1"],
                capture_output=True,
            )


def test_a_slow_change_is_waited_for_and_a_passing_verify_commits_it(lab: Any) -> None:
    inv = str(lab.inventory_path)
    try:
        rc, doc = run_json(
            inv,
            "exec",
            "-l",
            HOST,
            "--network",
            "--revert-after",
            "20",
            "--verify",
            "ip -4 addr show dev eth1 | grep -q 10.84.0.5/24",
            "--",
            "sleep 4; ip addr add 10.84.0.5/24 dev eth1; echo done",
        )
        r = doc["results"][0]
        assert rc == 0, r
        assert r["transaction"]["outcome"] == "committed"
        assert r["stdout"].strip() == "done"  # the detached command's output comes back
        assert "10.84.0.5/24" in live(lab)["addrs"]["eth1"]
    finally:
        undo(lab, "10.84.0.5/24", "eth1")


def test_ctrl_c_mid_transaction_asks_the_host_to_revert_now(lab: Any) -> None:
    inv = str(lab.inventory_path)
    before = live(lab)
    proc = start_verifying(inv, 120, "ip addr add 10.85.0.5/24 dev eth1")
    try:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "asked the host to revert now" in err, err
        # Back long before the 120 s deadline: labctl asked for the revert on its way out.
        assert wait_back(lab, before, 30) == before
    finally:
        if proc.poll() is None:
            proc.kill()
        undo(lab, "10.85.0.5/24", "eth1")
