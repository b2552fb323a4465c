"""exec, facts, trust and host-key checking against the simulated lab, over real SSH."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.transport.wrap import GRACE_SECONDS
from tests.conftest import REPO, labctl

pytestmark = pytest.mark.integration


def run_json(*args: str) -> tuple[int, dict[str, Any]]:
    proc = labctl("--json", *args)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def by_host(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["host"]: r for r in doc["results"]}


def inv_copy(lab: Any, tmp_path: Path, edit: Any = None) -> Path:
    """A copy of the sim's inventory with absolute key paths, optionally edited."""
    doc = yaml.safe_load(lab.inventory_path.read_text())
    doc["defaults"]["ssh_key"] = str(lab.key_path)
    doc["defaults"]["known_hosts"] = str(lab.known_hosts_path)
    if edit:
        edit(doc)
    out = tmp_path / "inventory.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


def test_exec_runs_on_every_host_with_per_host_output(through: str, lab: Any) -> None:
    rc, doc = run_json(
        "-i", str(lab.inventory_path), "exec", "--", "ip -4 -o addr show dev eth0; echo to-stderr >&2"
    )
    assert rc == 0
    results = by_host(doc)
    assert set(results) == set(lab.hosts)
    for name, address in lab.hosts.items():
        r = results[name]
        assert r["status"] == "ok" and r["rc"] == 0 and r["error"] is None
        assert f"inet {address}/" in r["stdout"]  # it really ran inside that host
        assert r["stderr"].strip() == "to-stderr"
        assert r["seconds"] > 0


def test_exec_human_output_prefixes_lines_with_host(lab: Any) -> None:
    proc = labctl(
        "-i", str(lab.inventory_path), "exec", "-l", "m5,irina", "--", "echo line-one; echo line-two"
    )
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if "line-" in ln]
    assert sorted(ln.split("│")[0].strip() for ln in lines) == ["irina", "irina", "m5", "m5"]
    assert "2 hosts: 2 ok" in proc.stderr


def test_exec_nonzero_exit_is_failed_and_exit_1(lab: Any) -> None:
    rc, doc = run_json(
        "-i", str(lab.inventory_path), "exec", "--", "test $(ip -4 -o addr show eth0 | wc -l) = 1 && exit 3"
    )
    assert rc == 1
    assert {r["status"] for r in doc["results"]} == {"failed"}
    assert {r["rc"] for r in doc["results"]} == {3}


def test_limit_by_name_and_role(lab: Any) -> None:
    _, doc = run_json("-i", str(lab.inventory_path), "exec", "--limit", "irina", "--", "true")
    assert [r["host"] for r in doc["results"]] == ["irina"]
    _, doc = run_json("-i", str(lab.inventory_path), "exec", "--limit", "role:train", "--", "true")
    assert [r["host"] for r in doc["results"]] == ["m5"]
    _, doc = run_json("-i", str(lab.inventory_path), "exec", "--limit", "role:storage,pharaoh", "--", "true")
    assert [r["host"] for r in doc["results"]] == ["irina", "pharaoh"]
    proc = labctl("-i", str(lab.inventory_path), "exec", "--limit", "role:nosuch", "--", "true")
    assert proc.returncode == 2 and "matches no host" in proc.stderr


def test_facts_on_every_host(lab: Any) -> None:
    rc, doc = run_json("-i", str(lab.inventory_path), "facts", "--no-torch")
    results = by_host(doc)
    assert rc == 0, doc
    assert results["workstation"]["status"] == "skipped"  # os: windows, Linux-only agent
    assert "windows" in results["workstation"]["error"]
    mem_total = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    for name in ("m5", "irina", "pharaoh"):
        r = results[name]
        assert r["status"] == "ok", r
        f = r["facts"]
        nics = {n["name"]: n for n in f["nics"]}
        assert set(nics) >= {"eth0", "eth1"}
        assert any(a.startswith(lab.hosts[name] + "/") for a in _addresses(nics["eth0"]))
        assert abs(f["memory"]["total_bytes"] - mem_total) / mem_total < 0.01
        assert f["gpus"] == []
    # The seed lab declares GPUs these simulated hosts do not have: that must be flagged.
    assert any("Tesla P40" in m for m in results["m5"]["mismatches"])
    assert any("Tesla P4" in m for m in results["irina"]["mismatches"])


def _addresses(nic: dict[str, Any]) -> list[str]:
    out = []
    for a in nic.get("addresses", []):
        out.append(a if isinstance(a, str) else f"{a.get('address')}/{a.get('prefixlen')}")
    return out


def test_agent_is_cached_by_hash_on_the_host_not_here(lab: Any) -> None:
    from labctl.hosts.agent_ship import agent_zip

    _, digest = agent_zip()
    labctl("-i", str(lab.inventory_path), "facts", "--no-torch", "-l", "pharaoh", check=True)
    _, doc = run_json(
        "-i", str(lab.inventory_path), "exec", "-l", "pharaoh", "--", "ls /var/lib/labctl/agent"
    )
    assert f"agent-{digest}.pyz" in doc["results"][0]["stdout"]
    assert not Path(
        f"/var/lib/labctl/agent/agent-{digest}.pyz"
    ).exists()  # private mount: not on this machine


def test_one_host_down_others_succeed(through: str, lab: Any) -> None:
    lab.stop_host("pharaoh")
    try:
        rc, doc = run_json("-i", str(lab.inventory_path), "exec", "--", "true")
        results = by_host(doc)
        assert rc == 1
        assert results["pharaoh"]["status"] == "unreachable"
        assert "pharaoh" in results["pharaoh"]["error"]
        assert {results[n]["status"] for n in ("m5", "irina", "workstation")} == {"ok"}
        proc = labctl("-i", str(lab.inventory_path), "exec", "--", "true")
        assert proc.returncode == 1 and "unreachable" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        lab.start_host("pharaoh")


def test_changed_host_key_is_refused_and_nothing_runs(through: str, lab: Any, tmp_path: Path) -> None:
    import paramiko

    forged = paramiko.Ed25519Key.generate() if hasattr(paramiko.Ed25519Key, "generate") else None
    if forged is None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519

        pub = (
            ed25519.Ed25519PrivateKey.generate()
            .public_key()
            .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
            .decode()
        )
    else:
        pub = f"{forged.get_name()} {forged.get_base64()}"
    kh = tmp_path / "known_hosts"
    lines = []
    for line in lab.known_hosts_path.read_text().splitlines():
        if line.startswith(lab.hosts["irina"] + " "):
            line = f"{lab.hosts['irina']} {pub}"
        lines.append(line)
    kh.write_text("\n".join(lines) + "\n")
    inv = inv_copy(lab, tmp_path, lambda d: d["defaults"].__setitem__("known_hosts", str(kh)))
    marker = "/var/lib/labctl/hostkey-test-marker"
    rc, doc = run_json("-i", str(inv), "exec", "-l", "irina,m5", "--", f"touch {marker}")
    results = by_host(doc)
    assert rc == 1
    assert results["irina"]["status"] == "hostkey"
    assert (
        "SHA256:" in results["irina"]["error"] and "labctl trust irina --replace" in results["irina"]["hint"]
    )
    assert results["m5"]["status"] == "ok"
    # Through the genuine key: the command never ran on irina.
    _, check = run_json(
        "-i",
        str(lab.inventory_path),
        "exec",
        "-l",
        "irina,m5",
        "--",
        f"test -e {marker}; echo $?; rm -f {marker}",
    )
    assert by_host(check)["irina"]["stdout"].strip() == "1"
    assert by_host(check)["m5"]["stdout"].strip() == "0"


def test_unknown_host_key_refused_then_trust_pins_it(through: str, lab: Any, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"  # empty: nothing pinned
    inv = inv_copy(lab, tmp_path, lambda d: d["defaults"].__setitem__("known_hosts", str(kh)))
    rc, doc = run_json("-i", str(inv), "exec", "-l", "m5", "--", "true")
    r = doc["results"][0]
    assert rc == 1 and r["status"] == "hostkey"
    genuine = subprocess.run(
        ["ssh-keygen", "-lf", str(lab.dir / "hosts" / "m5" / "ssh_host_ed25519_key.pub")],
        capture_output=True,
        text=True,
    ).stdout.split()[1]
    assert genuine in r["error"] and "labctl trust m5" in r["hint"]
    proc = labctl("-i", str(inv), "trust", "m5", "--yes")
    assert proc.returncode == 0, proc.stderr
    assert genuine in proc.stderr
    assert kh.stat().st_mode & 0o077 == 0
    rc, doc = run_json("-i", str(inv), "exec", "-l", "m5", "--", "true")
    assert rc == 0
    # Trusting again changes nothing; a different pinned key needs --replace.
    rc, doc = run_json("-i", str(inv), "trust", "m5", "--yes")
    assert rc == 0 and "already pinned" in doc["results"][0]["error"]


def test_trust_without_yes_and_no_terminal_is_input_error(lab: Any, tmp_path: Path) -> None:
    inv = inv_copy(lab, tmp_path, lambda d: d["defaults"].__setitem__("known_hosts", str(tmp_path / "kh")))
    proc = labctl("-i", str(inv), "trust", "m5")
    assert proc.returncode == 2 and "--yes" in proc.stderr
    assert not (tmp_path / "kh").exists()


def _stray(tag: str) -> str:
    return subprocess.run(["pgrep", "-af", tag], capture_output=True, text=True).stdout.strip()


def _gone_within(tag: str, seconds: float) -> bool:
    """True once no process matching `tag` is left; the watchdog has TERM + its grace period."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not [ln for ln in _stray(tag).splitlines() if "pgrep" not in ln]:
            return True
        time.sleep(0.2)
    print(_stray(tag))
    return False


def test_timeout_stops_the_remote_command(through: str, lab: Any) -> None:
    rc, doc = run_json(
        "-i", str(lab.inventory_path), "exec", "-l", "m5,irina", "--timeout", "1", "--", "sleep 4321"
    )
    assert rc == 1
    assert {r["status"] for r in doc["results"]} == {"timeout"}
    assert _gone_within("sleep 4321", GRACE_SECONDS + 3)


def test_ctrl_c_exits_130_and_leaves_no_remote_process(through: str, lab: Any) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "labctl",
            "-i",
            str(lab.inventory_path),
            "exec",
            "-l",
            "!workstation",  # os: windows gets no process-group watchdog (see transport/wrap.py)
            "--",
            "sleep 4322 & sleep 4323",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    # Wait until the command really runs on the three Linux hosts.
    while sum(ln.split()[1:] == ["sleep", "4323"] for ln in _stray("sleep 4323").splitlines()) < 3:
        assert time.monotonic() < deadline, "the remote commands never started"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "Interrupted (Ctrl-C): `labctl exec` stopped before it finished" in err
    assert _gone_within("sleep 432[23]", GRACE_SECONDS + 3)


def test_local_connection_runs_here_without_ssh(tmp_path: Path) -> None:
    inv = tmp_path / "local.yaml"
    inv.write_text(
        f"lab: l\nhosts:\n  here: {{address: 127.0.0.1, connection: local, python: {sys.executable}}}\n"
    )
    rc, doc = run_json("-i", str(inv), "exec", "--", "echo $$ hello")
    r = doc["results"][0]
    assert rc == 0 and r["stdout"].split()[1] == "hello"
    rc, doc = run_json("-i", str(inv), "facts", "--no-torch")
    assert rc == 0 and doc["results"][0]["facts"]["memory"]["total_bytes"] > 0


def test_unreachable_address_is_classified(through: str, tmp_path: Path) -> None:
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2")
    inv = tmp_path / "dead.yaml"
    # 127.0.0.1 port 9: nothing listens, the kernel refuses at once.
    inv.write_text("lab: d\nhosts:\n  dead: {address: 127.0.0.1, port: 9}\n")
    rc, doc = run_json("-i", str(inv), "exec", "--", "true")
    r = doc["results"][0]
    assert rc == 1 and r["status"] == "unreachable" and "127.0.0.1:9" in r["error"] and r["hint"]


def test_wrong_client_key_is_an_auth_failure(through: str, lab: Any, tmp_path: Path) -> None:
    key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    inv = inv_copy(lab, tmp_path, lambda d: d["defaults"].__setitem__("ssh_key", str(key)))
    rc, doc = run_json("-i", str(inv), "exec", "-l", "m5", "--", "true")
    r = doc["results"][0]
    assert rc == 1 and r["status"] == "auth"
    assert str(key) in r["error"] and "authorized_keys" in r["hint"]
