"""`labctl cron install ckpt-backup --daily` on the simulated lab: the nightly backup and its
weekly verify, both entries on pharaoh, both read by Debian's own crontab checker."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from labctl.agent.core import paths
from tests.conftest import labctl, run_json, sh

pytestmark = pytest.mark.integration
MARK = "labctl-orchestrator@pharaoh"


def test_ckpt_backup_daily_installs_backup_and_weekly_verify(lab: Any) -> None:
    inv = lab.inventory_path
    try:
        shown = labctl(
            "-i", str(inv), "cron", "install", "ckpt-backup", "--daily", "--check", "--diff", timeout=600
        )
        assert shown.returncode == 0, shown.stdout + shown.stderr
        text = shown.stderr  # labctl's human output
        assert "cron ckpt-backup" in text and "cron ckpt-verify" in text, text
        assert "with ckpt-verify (0 6 * * 0)" in text
        assert "labctl-ckpt" not in sh(inv, "pharaoh", "ls /etc/cron.d")  # --check changed nothing

        rc, doc = run_json(inv, "cron", "install", "ckpt-backup", "--daily", timeout=600)
        assert rc == 0, doc
        assert doc["schedule"] == "0 0 * * *"
        assert [(c["job"], c["schedule"]) for c in doc["companions"]] == [("ckpt-verify", "0 6 * * 0")]
        files = sh(inv, "pharaoh", "ls /etc/cron.d").split()
        assert "labctl-ckpt-backup" in files and "labctl-ckpt-verify" in files
        # Debian's crontab -n reads each entry (as a user crontab: cron.d's user field left out).
        if shutil.which("crontab"):
            for name in ("ckpt-backup", "ckpt-verify"):
                checked = sh(
                    inv,
                    "pharaoh",
                    f"grep -v '^#' /etc/cron.d/labctl-{name} | "
                    f"awk '/^[0-9*]/ {{$6=\"\"}} {{print}}' > /tmp/labctl-{name}.cron && "
                    f"crontab -n /tmp/labctl-{name}.cron 2>&1; rm -f /tmp/labctl-{name}.cron",
                )
                assert "successfully checked" in checked, checked
        rc, listed = run_json(inv, "cron", "list")
        assert rc == 0, listed
        jobs = {j["name"]: j for j in listed["jobs"] if j["host"] == "pharaoh"}
        assert jobs["ckpt-backup"]["schedule"] == "0 0 * * *"
        assert jobs["ckpt-verify"]["schedule"] == "0 6 * * 0"
        assert (
            "ckpt-backup.lock" in jobs["ckpt-verify"]["command"]
            and "ckpt verify" in jobs["ckpt-verify"]["command"]
        )

        again = run_json(inv, "cron", "install", "ckpt-backup", "--daily", timeout=600)[1]
        assert again["changed"] is False, [r for r in again["results"] if r["changed"]]
        rc, gone = run_json(inv, "cron", "remove", "ckpt-backup", "--purge")
        assert rc == 0, gone
        assert "labctl-ckpt" not in sh(inv, "pharaoh", "ls /etc/cron.d")
    finally:
        sh(
            inv,
            "pharaoh",
            f"rm -rf /etc/cron.d/labctl-ckpt-backup /etc/cron.d/labctl-ckpt-verify {paths.CONTROLLER_DIR}",
        )
        for h in ("m5", "irina", "pharaoh"):
            sh(inv, h, f"sed -i '/{MARK}$/d' /root/.ssh/authorized_keys 2>/dev/null; true")
