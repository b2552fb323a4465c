"""The scheduled checkpoint jobs planned without a host: `cron install ckpt-backup` brings the
weekly verify, whose run waits for a running backup; `cron remove` takes both away."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from labctl.agent.core import paths
from labctl.cron import plan
from labctl.cron.jobs import JOBS, companions, get_job
from labctl.inventory.model import Host
from labctl.provision.resource import load_registry
from labctl.provision.resources.cron import CronParams, cron_file

ORCH = Host(name="pharaoh", address="10.0.0.3", roles=["orchestrator"])


def test_ckpt_backup_brings_a_weekly_verify_in_the_same_cron_playbook() -> None:
    (play,) = plan.cron_playbook(get_job("ckpt-backup"), "0 0 * * *", ORCH).plays
    crons = {e.params["name"]: e.params for e in play.entries}
    assert list(crons) == ["ckpt-backup", "ckpt-verify"]
    assert crons["ckpt-backup"]["schedule"] == "0 0 * * *"
    assert crons["ckpt-backup"]["command"].endswith("inventory.yaml ckpt backup")
    verify = crons["ckpt-verify"]
    assert verify["schedule"] == "0 6 * * 0"  # weekly, Sunday
    # The verify waits (blocking flock) for a backup still running, then runs labctl ckpt verify.
    assert verify["command"] == (
        f"flock {paths.LOCK_DIR}/ckpt-backup.lock {plan.BIN} -i {plan.INVENTORY} ckpt verify"
    )
    for e in play.entries:
        load_registry()[e.type_name].from_playbook(ORCH, e.params)
    # A job without companions is one entry, as before.
    assert len(plan.cron_playbook(get_job("facts"), "0 * * * *", ORCH).plays[0].entries) == 1


def test_every_companion_is_a_known_job_on_a_schedule_cron_can_say() -> None:
    for job in JOBS.values():
        for comp, when in companions(job):
            assert comp.name in JOBS
            CronParams(name=comp.name, schedule=when, command=plan.job_command(comp))


def test_removing_ckpt_backup_removes_its_verify_too() -> None:
    book = plan.remove_playbook("ckpt-backup", ORCH, [], purge=False)
    assert [(e.params["name"], e.params["state"]) for e in book.plays[0].entries] == [
        ("ckpt-backup", "absent"),
        ("ckpt-verify", "absent"),
    ]
    alone = plan.remove_playbook("ckpt-verify", ORCH, [], purge=False)
    assert [e.params["name"] for e in alone.plays[0].entries] == ["ckpt-verify"]


@pytest.mark.skipif(shutil.which("crontab") is None, reason="needs Debian's cron (apt-get install cron)")
def test_debians_crontab_accepts_both_entries(tmp_path: Path) -> None:
    (play,) = plan.cron_playbook(get_job("ckpt-backup"), "0 0 * * *", ORCH).plays
    for e in play.entries:
        text = cron_file(CronParams(**e.params, backend="cron"))
        # crontab -n checks a user crontab: the same line without cron.d's user field.
        lines = []
        for line in text.splitlines():
            fields = line.split(None, 6)
            lines.append(" ".join(fields[:5] + fields[6:]) if line[:1].isdigit() else line)
        f = tmp_path / f"{e.params['name']}.cron"
        f.write_text("\n".join(lines) + "\n")
        proc = subprocess.run(["crontab", "-n", str(f)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
