"""The sim's real sshd behind a bad local key file: the file is named (exit 2), never the host
("Cannot reach", "refused to log in"); a key with a passphrase logs in through a real ssh-agent
that holds it, and is refused by name when no agent does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.integration


def inventory_with_key(lab: Any, tmp_path: Path, key: Path) -> Path:
    doc = yaml.safe_load(lab.inventory_path.read_text())
    doc["defaults"]["ssh_key"] = str(key)
    doc["defaults"]["known_hosts"] = str(lab.known_hosts_path)
    out = tmp_path / "inventory.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


def run(inv: Path, *args: str, agent: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSH_AUTH_SOCK")}
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", "-i", str(inv), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**env, **(agent or {})},
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture
def encrypted_key(lab: Any, tmp_path: Path) -> Path:
    """The sim's own key (the hosts accept it), re-saved under a passphrase."""
    key = tmp_path / "id_ed25519"
    shutil.copy(lab.key_path, key)
    shutil.copy(f"{lab.key_path}.pub", f"{key}.pub")
    key.chmod(0o600)
    subprocess.run(["ssh-keygen", "-q", "-p", "-P", "", "-N", "a passphrase", "-f", str(key)], check=True)
    return key


@pytest.fixture
def ssh_agent() -> Iterator[dict[str, str]]:
    """A real ssh-agent of this test's own, stopped by its pid afterwards."""
    out = subprocess.run(["ssh-agent", "-s"], capture_output=True, text=True, check=True).stdout
    env = dict(part.split("=", 1) for part in out.replace(";", "\n").split() if "=" in part)
    try:
        yield {"SSH_AUTH_SOCK": env["SSH_AUTH_SOCK"]}
    finally:
        os.kill(int(env["SSH_AGENT_PID"]), 15)


def test_public_key_as_ssh_key_names_the_file_not_the_host(lab: Any, tmp_path: Path) -> None:
    inv = inventory_with_key(lab, tmp_path, Path(f"{lab.key_path}.pub"))
    proc = run(inv, "exec", "-l", "m5,irina", "--", "true")
    assert proc.returncode == 2, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "Cannot reach" not in err and "is a public key" in err, err
    assert err.count("(for ") == 1 and ("(for m5, irina)" in err or "(for irina, m5)" in err), err


def test_passphrase_key_without_an_agent_is_named(lab: Any, tmp_path: Path, encrypted_key: Path) -> None:
    proc = run(inventory_with_key(lab, tmp_path, encrypted_key), "exec", "-l", "m5", "--", "true")
    assert proc.returncode == 2, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "refused to log in" not in err
    assert str(encrypted_key) in err and "passphrase" in err and "no ssh-agent" in err and "ssh-add" in err


def test_passphrase_key_logs_in_through_the_agent_that_holds_it(
    lab: Any, tmp_path: Path, encrypted_key: Path, ssh_agent: dict[str, str]
) -> None:
    inv = inventory_with_key(lab, tmp_path, encrypted_key)
    # An agent that holds another key: named, before any host is tried.
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    subprocess.run(["ssh-add", "-q", str(other)], env={**os.environ, **ssh_agent}, check=True)
    proc = run(inv, "exec", "-l", "m5", "--", "true", agent=ssh_agent)
    assert proc.returncode == 2 and "does not hold it" in proc.stderr, proc.stderr
    # The same key unlocked into the agent (ssh-add of the unencrypted original): it logs in.
    subprocess.run(["ssh-add", "-q", str(lab.key_path)], env={**os.environ, **ssh_agent}, check=True)
    proc = run(inv, "--json", "exec", "-l", "m5,irina", "--", "echo via-agent", agent=ssh_agent)
    assert proc.returncode == 0, proc.stderr
    assert [r["stdout"].strip() for r in json.loads(proc.stdout)["results"]] == ["via-agent", "via-agent"]
