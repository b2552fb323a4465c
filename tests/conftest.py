"""Shared fixtures. The simulated lab comes up once per session for the integration tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SIM_HOSTS = ["m5", "irina", "pharaoh", "workstation"]


def can_run_sim() -> str | None:
    """Why the simulated lab cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if not Path("/usr/sbin/sshd").exists():
        return "needs openssh-server (/usr/sbin/sshd)"
    if shutil.which("ip") is None:
        return "needs iproute2"
    return None


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A 4-host simulated lab (the seed lab's hosts) on its own bridge and subnet."""
    reason = can_run_sim()
    if reason:
        pytest.skip(f"simulated lab unavailable: {reason}")
    from labctl.sim import down, up

    sim_dir = tmp_path_factory.mktemp("sim")
    sim = up(sim_dir, hosts=SIM_HOSTS, bridge="lctest0", prefix="lct-", subnet="10.251.0.0/24")
    try:
        yield sim
    finally:
        down(sim_dir)


def labctl(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, as a user would."""
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"labctl {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc
