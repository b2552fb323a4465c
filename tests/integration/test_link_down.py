"""A host that goes silent in the middle of a command (its link cut, or every process on it
frozen) sends no reset: TCP alone would keep labctl waiting for minutes. SSH keepalives with a
dead-peer limit give up on it, name it, and the other host's result still comes back.

Real sim hosts over real SSH; the link is really taken down (`ip link set eth0 down` in the
host's namespace) and the hung host is really frozen (SIGSTOP on its sshd and sessions).
The 90 s bound is a guard against a hang, not a speed measurement.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from labctl.sim import netns
from labctl.transport.ssh import DEAD_AFTER
from tests.conftest import REPO, run_json

pytestmark = pytest.mark.integration
TAG = "sleep 4751"  # m5's command, found and cleaned up by this exact command line


def pids_of(cmdline: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"^{cmdline}$"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def link_down(lab: Any) -> Callable[[], None]:
    ns = lab.namespace("m5")
    subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "down"], check=True)
    return lambda: subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "up"], check=True)


def host_hung(lab: Any) -> Callable[[], None]:
    """Every process on m5 stopped: its kernel still acknowledges TCP, but nothing answers."""
    pids = netns.namespace_pids(lab.namespace("m5"))
    for pid in pids:
        netns.send_signal(pid, signal.SIGSTOP)

    def resume() -> None:
        for pid in pids:
            netns.send_signal(pid, signal.SIGCONT)

    return resume


@pytest.mark.parametrize(
    ("cut", "timeout"),
    [(link_down, None), (host_hung, "600")],
    ids=["link-down-no-timeout", "host-hung-with-timeout"],
)
def test_silent_host_is_given_up_on_and_named_while_the_other_reports(
    through: str, lab: Any, cut: Callable[[Any], Callable[[], None]], timeout: str | None
) -> None:
    m5 = lab.hosts["m5"]
    # m5 runs long; irina finishes in a few seconds and its output must still be reported.
    command = f'echo started; case "$(ip -4 -o addr show dev eth0)" in *" {m5}/"*) {TAG};; *) sleep 3;; esac; echo done'
    args = ["--json", "-i", str(lab.inventory_path), "exec", "-l", "m5,irina"]
    args += ["--timeout", timeout] if timeout else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "labctl", *args, "--", command],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    restore: Callable[[], None] | None = None
    try:
        deadline = time.monotonic() + 30
        while not pids_of(TAG):
            assert time.monotonic() < deadline and proc.poll() is None, "m5's command never started"
            time.sleep(0.1)
        time.sleep(1)
        restore = cut(lab)
        try:
            out, err = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail(f"labctl still waited on m5 90 s after it went silent (limit {DEAD_AFTER} s)")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if restore is not None:
            restore()
        for pid in pids_of(TAG):
            with contextlib.suppress(ProcessLookupError):  # it may end between the listing and the kill
                os.kill(pid, signal.SIGKILL)
    assert "Traceback" not in err, err
    assert proc.returncode == 1, err
    results = {r["host"]: r for r in json.loads(out)["results"]}
    r = results["m5"]
    assert r["status"] == "unreachable", r
    assert r["error"].startswith("m5 (") and f"stopped answering for {DEAD_AFTER} s" in r["error"], r
    assert "link down or host hung" in r["error"] and r["hint"]
    assert results["irina"]["status"] == "ok" and results["irina"]["stdout"].split() == ["started", "done"]
    # m5 is back: the next run reaches it (its link or processes restored above).
    deadline = time.monotonic() + 30
    while True:
        rc, doc = run_json(lab.inventory_path, "exec", "-l", "m5", "--", "echo back")
        if rc == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert rc == 0 and doc["results"][0]["stdout"].strip() == "back", doc
