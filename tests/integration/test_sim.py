"""The simulated lab itself: real namespaces, a real bridge, real sshd and the system ssh client.

It runs on its own bridge, prefix and subnet so it never collides with the session lab the other
integration tests share.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from labctl import sim
from labctl.output.errors import HostError, InputError
from labctl.sim.sshd import probe

pytestmark = pytest.mark.integration

BRIDGE, PREFIX, SUBNET = "lcit0", "lci-", "10.252.0.0/24"
HOSTS = ["m5", "irina", "pharaoh"]


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if not Path("/usr/sbin/sshd").exists():
        return "needs openssh-server (/usr/sbin/sshd)"
    for tool in ("ip", "tc", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    return None


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sim.SimLab]:
    reason = _why_not()
    if reason:
        pytest.skip(f"simulated lab unavailable: {reason}")
    d = tmp_path_factory.mktemp("simlab")
    lab = sim.up(d, hosts=HOSTS, bridge=BRIDGE, prefix=PREFIX, subnet=SUBNET)
    try:
        yield lab
    finally:
        sim.down(d)


def ssh(
    lab: sim.SimLab, name: str, command: str, known_hosts: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(lab.key_path),
            "-o",
            f"UserKnownHostsFile={known_hosts or lab.known_hosts_path}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
            f"root@{lab.hosts[name]}",
            command,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )


def in_ns(lab: sim.SimLab, name: str, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", lab.namespace(name), *cmd], capture_output=True, text=True, timeout=timeout
    )


def test_every_host_answers_ssh_with_its_pinned_key(lab: sim.SimLab) -> None:
    assert list(lab.hosts) == HOSTS
    for name in HOSTS:
        r = ssh(lab, name, "hostname; ip -o -4 addr show dev eth0; ip -o link show dev eth1")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == name
        assert f" {lab.hosts[name]}/24 " in lines[1]
        assert "eth1" in lines[2]


def test_a_wrong_host_key_is_refused(lab: sim.SimLab, tmp_path: Path) -> None:
    lines = lab.known_hosts_path.read_text().splitlines()
    # m5's address paired with irina's key: strict checking must refuse the connection.
    swapped = tmp_path / "known_hosts"
    swapped.write_text(f"{lab.hosts['m5']} {lines[1].split(' ', 1)[1]}\n")
    r = ssh(lab, "m5", "true", known_hosts=swapped)
    assert r.returncode != 0
    assert "HOST IDENTIFICATION HAS CHANGED" in r.stderr or "verification failed" in r.stderr


def test_inventory_follows_the_contract(lab: sim.SimLab) -> None:
    doc = yaml.safe_load(lab.inventory_path.read_text())
    assert doc["lab"] == f"sim-{BRIDGE}"  # a lab beside the default one is named after its bridge
    assert doc["defaults"]["ssh_key"] == "keys/id_ed25519"
    assert doc["defaults"]["known_hosts"] == "keys/known_hosts"
    assert Path(doc["defaults"]["python"]).exists()
    assert {n: h["address"] for n, h in doc["hosts"].items()} == lab.hosts
    assert (lab.inventory_path.parent / "keys/id_ed25519").stat().st_mode & 0o077 == 0
    m5 = doc["hosts"]["m5"]
    if "bond" in m5:  # present when the seed lab file declares it
        assert m5["bond"]["interfaces"] == ["eth0", "eth1"]
        assert m5["bond"]["address"] == f"{lab.hosts['m5']}/24"
        assert m5["bond"]["gateway"] == lab.bridge_address


def test_managed_paths_are_private_to_each_host(lab: sim.SimLab) -> None:
    mine = Path("/etc/fstab").read_bytes()
    marker = f"labctl-sim-test-{os.getpid()}"
    r = ssh(
        lab,
        "m5",
        f"echo '# {marker}' >> /etc/fstab && echo {marker} > /var/lib/labctl/marker && cat /etc/fstab",
    )
    assert r.returncode == 0, r.stderr
    assert marker in r.stdout
    other = ssh(lab, "irina", "cat /etc/fstab; ls /var/lib/labctl")
    assert other.returncode == 0, other.stderr
    assert marker not in other.stdout
    assert Path("/etc/fstab").read_bytes() == mine
    assert not Path("/var/lib/labctl/marker").exists()
    assert marker in (lab.dir / "hosts/m5/root/etc/fstab").read_text()


def test_each_host_runs_its_own_shell_start_up_file_never_this_machines(lab: sim.SimLab) -> None:
    """bash sources ~/.bashrc for every command sshd runs. This machine's (pyenv, conda, cargo) must
    not run on the hosts: a session killed mid-`pyenv rehash` once left a lock that stalled every
    later SSH command of the whole sim for a minute."""
    rc = lab.dir / "hosts/m5/root/root/.bashrc"
    original = rc.read_text()
    rc.write_text(original + f"export LABCTL_SIM_RC=m5-{os.getpid()}\n")
    try:
        m5 = ssh(lab, "m5", 'echo "rc=${LABCTL_SIM_RC-}"; cat /root/.bashrc')
        irina = ssh(lab, "irina", 'echo "rc=${LABCTL_SIM_RC-}"; echo "pyenv=${PYENV_ROOT-}"')
    finally:
        rc.write_text(original)
    assert m5.returncode == 0 and irina.returncode == 0, m5.stderr + irina.stderr
    assert m5.stdout.splitlines()[0] == f"rc=m5-{os.getpid()}"
    mine = Path("/root/.bashrc")
    if mine.exists():
        assert mine.read_text() not in m5.stdout.split("\n", 1)[1]
    assert irina.stdout.splitlines() == ["rc=", "pyenv="]


def test_each_host_sees_only_its_own_processes(lab: sim.SimLab) -> None:
    """A PID namespace per host: what runs on m5 is not in irina's /proc, as on two machines."""
    marker = f"sleep {4000 + os.getpid() % 1000}"
    r = ssh(lab, "m5", f"setsid {marker} </dev/null >/dev/null 2>&1 &")
    assert r.returncode == 0, r.stderr
    try:
        seen_m5 = ssh(lab, "m5", "cat /proc/1/comm; ps -eo args")
        seen_irina = ssh(lab, "irina", "cat /proc/1/comm; ps -eo args")
        assert seen_m5.returncode == 0 and seen_irina.returncode == 0, seen_m5.stderr + seen_irina.stderr
        assert seen_m5.stdout.splitlines()[0] == "sshd"  # each host's init is its sshd
        assert seen_irina.stdout.splitlines()[0] == "sshd"
        assert marker in seen_m5.stdout
        assert marker not in seen_irina.stdout
    finally:
        ssh(lab, "m5", f"pkill -f '{marker}'")


def test_hosts_reach_each_other_over_the_bridge(lab: sim.SimLab) -> None:
    code = "import socket,sys; s=socket.create_connection((sys.argv[1],22),5); print(s.recv(4).decode())"
    r = in_ns(lab, "m5", sys.executable, "-c", code, lab.hosts["irina"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "SSH-"
    r = in_ns(lab, "irina", "bash", "-c", f"</dev/tcp/{lab.hosts['pharaoh']}/22")
    assert r.returncode == 0, r.stderr


def test_links_are_shaped_both_ways(lab: sim.SimLab) -> None:
    for nic in ("eth0", "eth1"):
        r = in_ns(lab, "m5", "tc", "qdisc", "show", "dev", nic)
        assert "tbf" in r.stdout and "rate 1Gbit" in r.stdout, r.stdout
    state = json.loads((lab.dir / "state.json").read_text())
    for veth in state["hosts"]["m5"]["veths"]:
        out = subprocess.run(["tc", "qdisc", "show", "dev", veth], capture_output=True, text=True).stdout
        assert "tbf" in out and "rate 1Gbit" in out, out


def test_up_again_changes_nothing_and_a_new_rate_reshapes(lab: sim.SimLab) -> None:
    again = sim.up(lab.dir, hosts=HOSTS, bridge=BRIDGE, prefix=PREFIX, subnet=SUBNET)
    assert again.changes == []
    assert again.hosts == lab.hosts
    slower = sim.up(lab.dir, hosts=HOSTS, rate="100mbit")
    assert sorted(slower.changes) == sorted(f"re-shaped {n} to 100mbit" for n in HOSTS)
    assert "rate 100Mbit" in in_ns(lab, "irina", "tc", "qdisc", "show", "dev", "eth0").stdout
    assert sim.up(lab.dir).changes == []  # options left out keep what the lab has
    back = sim.up(lab.dir, rate="1gbit")
    assert len(back.changes) == len(HOSTS)
    assert "rate 1Gbit" in in_ns(lab, "irina", "tc", "qdisc", "show", "dev", "eth0").stdout


def test_stop_makes_a_host_dead_and_start_or_up_revives_it(lab: sim.SimLab) -> None:
    address = lab.hosts["pharaoh"]
    assert lab.stop_host("pharaoh") is True
    assert not probe(address, timeout=2)
    assert ssh(lab, "pharaoh", "true").returncode != 0
    assert lab.start_host("pharaoh") is True
    assert lab.start_host("pharaoh") is False
    assert ssh(lab, "pharaoh", "hostname").stdout.strip() == "pharaoh"
    lab.stop_host("pharaoh")
    revived = sim.up(lab.dir)
    assert revived.changes == ["restarted sshd on pharaoh"]
    assert probe(address)


def test_cli_status_and_stop_start(lab: sim.SimLab) -> None:
    from labctl.cli.sim_cmd import app

    runner = CliRunner()
    r = runner.invoke(app, ["status", "--dir", str(lab.dir), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [h["name"] for h in doc["hosts"]] == HOSTS
    assert all(h["alive"] and h["reachable"] and h["sshd_pid"] for h in doc["hosts"])
    assert runner.invoke(app, ["stop", "irina", "--dir", str(lab.dir)]).exit_code == 0
    r = runner.invoke(app, ["status", "--dir", str(lab.dir), "--json"])
    assert r.exit_code == 1
    irina = next(h for h in json.loads(r.stdout)["hosts"] if h["name"] == "irina")
    assert not irina["alive"] and not irina["reachable"]
    assert runner.invoke(app, ["start", "irina", "--dir", str(lab.dir)]).exit_code == 0
    assert probe(lab.hosts["irina"])
    r = runner.invoke(app, ["stop", "nohost", "--dir", str(lab.dir)])
    assert isinstance(r.exception, InputError)


def test_link_rate_between_two_hosts(lab: sim.SimLab) -> None:
    """Measure a TCP stream m5 -> irina; shaping may only ever make it slower than 1 Gbit/s."""
    receiver = textwrap.dedent(
        """
        import socket, sys, time
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((sys.argv[1], 5201)); s.listen(1); print("ready", flush=True)
        c, _ = s.accept(); buf = bytearray(1 << 20); n = 0; t0 = None
        while True:
            k = c.recv_into(buf)
            if not k: break
            if t0 is None: t0 = time.monotonic()
            n += k
        print(n, time.monotonic() - t0)
        """
    )
    sender = textwrap.dedent(
        """
        import socket, sys, time
        c = socket.create_connection((sys.argv[1], 5201)); data = bytes(1 << 20)
        end = time.monotonic() + float(sys.argv[2])
        while time.monotonic() < end: c.sendall(data)
        c.close()
        """
    )
    rx = subprocess.Popen(
        ["ip", "netns", "exec", lab.namespace("irina"), sys.executable, "-c", receiver, lab.hosts["irina"]],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert rx.stdout is not None
        assert rx.stdout.readline().strip() == "ready"
        r = in_ns(lab, "m5", sys.executable, "-c", sender, lab.hosts["irina"], "2")
        assert r.returncode == 0, r.stderr
        out, _ = rx.communicate(timeout=30)
    finally:
        if rx.poll() is None:
            rx.kill()
    n, seconds = out.split()
    mbit = int(n) * 8 / float(seconds) / 1e6
    print(f"\nsim link m5 -> irina at 1gbit: {mbit:.0f} Mbit/s over {float(seconds):.1f} s")
    assert 0 < mbit < 1000 * 1.05


def test_down_removes_exactly_what_up_created(tmp_path: Path) -> None:
    reason = _why_not()
    if reason:
        pytest.skip(f"simulated lab unavailable: {reason}")
    bridge, prefix = "lcit1", "lcj-"
    d = tmp_path / "sim"
    small = sim.up(d, hosts=["a"], count=2, bridge=bridge, prefix=prefix, subnet="10.253.0.0/24")
    assert list(small.hosts) == ["a", "node01"]
    # A session left running on a host must not keep its namespace alive.
    assert ssh(small, "a", "nohup sleep 300 >/dev/null 2>&1 &").returncode == 0
    pid = json.loads((d / "state.json").read_text())["hosts"]["a"]["sshd_pid"]
    assert sim.status(d)[0].reachable
    removed = sim.down(d)
    assert "bridge lcit1" in removed
    assert not d.exists()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert prefix not in netns
    assert subprocess.run(["ip", "link", "show", bridge], capture_output=True).returncode != 0
    if shutil.which("iptables"):
        rule = ["iptables", "-w", "5", "-C", "FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]
        assert subprocess.run(rule, capture_output=True).returncode != 0
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]:
        assert time.monotonic() < deadline, "sshd survived sim down"
        time.sleep(0.05)
    assert sim.down(d) == []


def test_a_failure_part_way_leaves_state_that_down_cleans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reason = _why_not()
    if reason:
        pytest.skip(f"simulated lab unavailable: {reason}")
    from labctl.sim import lab as sim_lab

    real_start = sim_lab.sshd.start

    def failing_start(plan: sim_lab.HostPlan, files: sim_lab.sshd.HostFiles, timeout: float = 10.0) -> int:
        if plan.name == "b":
            raise HostError("injected failure")
        return real_start(plan, files, timeout)

    monkeypatch.setattr(sim_lab.sshd, "start", failing_start)
    d = tmp_path / "sim"
    with pytest.raises(HostError, match=r"b: injected failure") as err:
        sim.up(d, hosts=["a", "b"], bridge="lcit2", prefix="lck-", subnet="10.254.0.0/24")
    assert "sim down" in err.value.hint
    state = json.loads((d / "state.json").read_text())
    assert set(state["hosts"]) == {"a", "b"} and state["bridge_created"]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "lck-a" in netns and "lck-b" in netns
    monkeypatch.undo()
    sim.down(d)
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "lck-" not in netns
    assert subprocess.run(["ip", "link", "show", "lcit2"], capture_output=True).returncode != 0


def test_a_bridge_that_is_not_ours_is_never_adopted(tmp_path: Path) -> None:
    reason = _why_not()
    if reason:
        pytest.skip(f"simulated lab unavailable: {reason}")
    subprocess.run(["ip", "link", "add", "lcit3", "type", "bridge"], check=True)
    try:
        with pytest.raises(HostError, match="lcit3 already exists"):
            sim.up(tmp_path / "sim", hosts=["a"], bridge="lcit3", prefix="lcl-", subnet="10.254.1.0/24")
        assert not (tmp_path / "sim").exists()
        assert subprocess.run(["ip", "link", "show", "lcit3"], capture_output=True).returncode == 0
    finally:
        subprocess.run(["ip", "link", "del", "lcit3"], check=False)


def test_a_bridge_left_by_another_sim_names_the_folder_that_frees_it(tmp_path: Path) -> None:
    reason = _why_not()
    if reason:
        pytest.skip(f"simulated lab unavailable: {reason}")
    first = tmp_path / "first"
    sim.up(first, hosts=["a"], bridge="lcit5", prefix="lcn-", subnet="10.254.2.0/24")
    try:
        with pytest.raises(HostError, match=f"belongs to the sim in {first}") as err:
            sim.up(tmp_path / "second", hosts=["a"], bridge="lcit5", prefix="lco-", subnet="10.254.3.0/24")
        assert f"labctl sim down --dir {first}" in err.value.hint
        assert not (tmp_path / "second").exists()
        assert sim.status(first)[0].reachable
    finally:
        sim.down(first)
