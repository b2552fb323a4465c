"""Runs that race and damaged cache state, against the simulated lab over real SSH."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import REPO, labctl, m5_cache, sh

pytestmark = pytest.mark.integration
SEED = str(REPO / "playbooks" / "provision.yaml")
CACHE = "/mnt/model-cache"


def unprovision_m5(inv: str) -> None:
    """m5 as the provision tests expect it: no cache mounted (however many were), fstab as it was."""
    sh(inv, "m5", f"rm -rf {CACHE}/* {CACHE}/.labctl; while umount {CACHE} 2>/dev/null; do :; done; true")
    sh(
        inv,
        "m5",
        "[ -f /var/lib/labctl/backup/fstab ] && cat /var/lib/labctl/backup/fstab > /etc/fstab; true",
    )


def provision_m5_cache(inv: str) -> list[str]:
    """The command line of a real `labctl provision` of m5's cache, to start as its own process."""
    return [
        sys.executable,
        "-m",
        "labctl",
        "-i",
        inv,
        "provision",
        "-p",
        SEED,
        "--tags",
        "model_cache",
        "-l",
        "m5",
    ]


def test_two_provision_runs_at_once_mount_the_cache_once(lab: Any) -> None:
    inv = str(lab.inventory_path)
    unprovision_m5(inv)  # another test on this lab may have left it provisioned
    assert sh(inv, "m5", f"grep -c ' {CACHE} ' /proc/mounts; true").strip() == "0"
    argv = provision_m5_cache(inv)
    try:
        runs = [
            subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=300) for p in runs]
        for p, (_out, err) in zip(runs, outs, strict=True):
            assert p.returncode == 0, err
            assert "Traceback" not in err
        assert sh(inv, "m5", f"grep -c ' {CACHE} ' /proc/mounts; true").strip() == "1"
        assert sh(inv, "m5", f"grep -c ' {CACHE} ' /etc/fstab; true").strip() == "1"
        # One applied the change; the other waited for it and found nothing left to do.
        errs = [err for _out, err in outs]
        assert sum("changed" in e.split("provision\n")[0] for e in errs) >= 1
        assert any("waiting for it" in e for e in errs), errs
        assert any("│ m5   │  1 │       0 │" in e for e in errs), errs  # 1 ok, 0 changed
    finally:
        unprovision_m5(inv)


def test_cache_verify_fetches_a_vanished_model_again(lab: Any) -> None:
    inv = str(lab.inventory_path)
    model = "ux-vanish"
    with m5_cache(lab):
        try:
            sh(
                inv,
                "irina",
                f"mkdir -p /srv/models/{model} && head -c 3M /dev/urandom > /srv/models/{model}/w.bin",
            )
            want = sh(inv, "irina", f"sha256sum /srv/models/{model}/w.bin").split()[0]
            assert labctl("-i", inv, "cache", "sync", model, "--host", "m5").returncode == 0
            sh(inv, "m5", f"rm -rf {CACHE}/{model}")
            proc = labctl("-i", inv, "cache", "verify", "--host", "m5")
            assert proc.returncode == 0, proc.stderr
            assert "Traceback" not in proc.stderr
            row = next(line for line in proc.stderr.splitlines() if model in line)
            assert "repaired" in row and "gone from the disk" in row, proc.stderr
            assert sh(inv, "m5", f"sha256sum {CACHE}/{model}/w.bin").split()[0] == want
            doc = json.loads(labctl("-i", inv, "--json", "cache", "status", "--host", "m5").stdout)
            assert model in [m["name"] for m in doc["results"][0]["models"]]
            # A manifest with the wrong types: set aside, rebuilt, and said so; the model is synced back.
            sh(inv, "m5", f'echo \'{{"version": 1, "models": []}}\' > {CACHE}/.labctl/manifest.json')
            proc = labctl("-i", inv, "cache", "status", "--host", "m5")
            assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
            assert "repaired m5:" in proc.stderr and "manifest.json was damaged" in proc.stderr, proc.stderr
            assert sh(inv, "m5", f"ls {CACHE}/.labctl/ | grep -c 'manifest.json.damaged-'").strip() == "1"
            assert labctl("-i", inv, "cache", "sync", model, "--host", "m5").returncode == 0
            assert sh(inv, "m5", f"sha256sum {CACHE}/{model}/w.bin").split()[0] == want
        finally:
            sh(inv, "irina", f"rm -rf /srv/models/{model}")


def test_check_takes_no_lock_and_a_changing_run_refuses_naming_the_holder(lab: Any) -> None:
    inv = str(lab.inventory_path)
    unprovision_m5(inv)  # another test on this lab may have left it provisioned
    assert sh(inv, "m5", f"grep -c ' {CACHE} ' /proc/mounts; true").strip() == "0"
    lock = "/var/lib/labctl/provision.lock"
    holder = json.dumps(
        {"command": "labctl provision", "pid": 4242, "controller": "otherbox", "locked_at": 1.0e9}
    )
    # Another run holds m5's lock (as host_lock would: the flock, and who it is in the file).
    hold = subprocess.Popen(
        [sys.executable, "-m", "labctl", "-i", inv, "exec", "-l", "m5", "--",
         f"mkdir -p /var/lib/labctl && flock {lock} sh -c {shlex.quote(f'echo {shlex.quote(holder)} > {lock}; sleep 120')}"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(100):
            if sh(inv, "m5", f"flock -n {lock} true; echo $?").strip() == "1":
                break
        else:
            raise AssertionError("the test's holder never took the lock")
        base = provision_m5_cache(inv)
        check = subprocess.run([*base, "--check"], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert check.returncode == 0 and "waiting" not in check.stderr, check.stderr
        env = {**os.environ, "LABCTL_PROVISION_LOCK_WAIT": "2"}
        change = subprocess.run(base, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
        assert change.returncode == 1, change.stderr
        assert "waiting for it, up to 2 s" in change.stderr
        assert (
            "m5 is being provisioned by another run (labctl provision pid 4242 on otherbox" in change.stderr
        )
        assert sh(inv, "m5", f"grep -c ' {CACHE} ' /proc/mounts; true").strip() == "0"  # nothing done
    finally:
        hold.kill()
        hold.wait()
        unprovision_m5(inv)
