"""Runs that race and damaged cache state, against the simulated lab over real SSH."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import REPO, labctl, m5_cache

pytestmark = pytest.mark.integration
SEED = str(REPO / "playbooks" / "provision.yaml")
CACHE = "/mnt/model-cache"


def on(inv: str, host: str, cmd: str) -> str:
    proc = labctl("-i", inv, "--json", "exec", "-l", host, "--", cmd)
    r = json.loads(proc.stdout)["results"][0]
    assert r["status"] == "ok", r
    return str(r["stdout"])


def test_two_provision_runs_at_once_mount_the_cache_once(lab: Any) -> None:
    inv = str(lab.inventory_path)
    if on(inv, "m5", f"grep -c ' {CACHE} ' /proc/mounts; true").strip() != "0":
        pytest.skip("m5's cache is already mounted: another test left it provisioned")
    argv = [
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
    try:
        runs = [
            subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=300) for p in runs]
        for p, (_out, err) in zip(runs, outs, strict=True):
            assert p.returncode == 0, err
            assert "Traceback" not in err
        assert on(inv, "m5", f"grep -c ' {CACHE} ' /proc/mounts; true").strip() == "1"
        assert on(inv, "m5", f"grep -c ' {CACHE} ' /etc/fstab; true").strip() == "1"
        # One applied the change; the other waited for it and found nothing left to do.
        errs = [err for _out, err in outs]
        assert sum("changed" in e.split("provision\n")[0] for e in errs) >= 1
        assert any("waiting for it" in e for e in errs), errs
        assert any("│ m5   │  1 │       0 │" in e for e in errs), errs  # 1 ok, 0 changed
    finally:
        on(inv, "m5", f"rm -rf {CACHE}/* {CACHE}/.labctl; while umount {CACHE} 2>/dev/null; do :; done; true")
        on(
            inv,
            "m5",
            "[ -f /var/lib/labctl/backup/fstab ] && cat /var/lib/labctl/backup/fstab > /etc/fstab; true",
        )


def test_cache_verify_fetches_a_vanished_model_again(lab: Any) -> None:
    inv = str(lab.inventory_path)
    model = "ux-vanish"
    with m5_cache(lab):
        try:
            on(
                inv,
                "irina",
                f"mkdir -p /srv/models/{model} && head -c 3M /dev/urandom > /srv/models/{model}/w.bin",
            )
            want = on(inv, "irina", f"sha256sum /srv/models/{model}/w.bin").split()[0]
            assert labctl("-i", inv, "cache", "sync", model, "--host", "m5").returncode == 0
            on(inv, "m5", f"rm -rf {CACHE}/{model}")
            proc = labctl("-i", inv, "cache", "verify", "--host", "m5")
            assert proc.returncode == 0, proc.stderr
            assert "Traceback" not in proc.stderr
            row = next(line for line in proc.stderr.splitlines() if model in line)
            assert "repaired" in row and "gone from the disk" in row, proc.stderr
            assert on(inv, "m5", f"sha256sum {CACHE}/{model}/w.bin").split()[0] == want
            doc = json.loads(labctl("-i", inv, "--json", "cache", "status", "--host", "m5").stdout)
            assert model in [m["name"] for m in doc["results"][0]["models"]]
            # A manifest with the wrong types: set aside, rebuilt, and said so; the model is synced back.
            on(inv, "m5", f'echo \'{{"version": 1, "models": []}}\' > {CACHE}/.labctl/manifest.json')
            proc = labctl("-i", inv, "cache", "status", "--host", "m5")
            assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
            assert "repaired m5:" in proc.stderr and "manifest.json was damaged" in proc.stderr, proc.stderr
            assert on(inv, "m5", f"ls {CACHE}/.labctl/ | grep -c 'manifest.json.damaged-'").strip() == "1"
            assert labctl("-i", inv, "cache", "sync", model, "--host", "m5").returncode == 0
            assert on(inv, "m5", f"sha256sum {CACHE}/{model}/w.bin").split()[0] == want
        finally:
            on(inv, "irina", f"rm -rf /srv/models/{model}")
