"""`labctl cron install|list|remove` against the simulated lab: the schedule lives on pharaoh
(role orchestrator) and its job runs labctl from there, over SSH, with pharaoh's own key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.core import paths
from tests.conftest import run_json, sh

pytestmark = pytest.mark.integration

KEY = paths.CONTROLLER_DIR + "/lab/keys/id_ed25519"
MARK = "labctl-orchestrator@pharaoh"


def cron_entry_line(inv: Any, host: str, name: str) -> str:
    """The shell line the cron entry of job `name` runs on `host`, as cron would run it: the
    marked file's entry without its five schedule fields and user, `\\%` unescaped."""
    text = sh(inv, host, f"cat /etc/cron.d/labctl-{name}")
    from labctl.agent.cron.cronjobs import parse_job_file

    return str(parse_job_file(text)["line"])


def run_cron_entry(inv: Any, host: str, name: str) -> dict[str, Any]:
    """Run job `name`'s entry by hand on `host` (sh -c, as cron does): its exec result."""
    line = cron_entry_line(inv, host, name)
    _, doc = run_json(inv, "exec", "-l", host, "--timeout", "600", "--", line, timeout=700)
    return dict(doc["results"][0])


def test_install_twice_one_entry_key_only_on_pharaoh_then_run_list_remove(lab: Any) -> None:
    inv = lab.inventory_path
    try:
        rc, first = run_json(inv, "cron", "install", "facts", "--every", "30m", timeout=600)
        assert rc == 0, first
        assert first["host"] == "pharaoh" and first["schedule"] == "*/30 * * * *"
        assert first["changed"] is True
        assert any("workstation" in n for n in first["notes"])  # Windows: not authorised, said so
        rc, second = run_json(inv, "cron", "install", "facts", "--every", "30m", timeout=600)
        assert rc == 0, second
        assert second["changed"] is False, [r for r in second["results"] if r["changed"]]
        assert sh(inv, "pharaoh", "ls /etc/cron.d | grep -c '^labctl-facts$'").strip() == "1"
        # Another version recorded there is replaced by this one, whole.
        record = f"{paths.CONTROLLER_DIR}/current/install.json"
        sh(inv, "pharaoh", f"""sed -i 's/"labctl": "[^"]*"/"labctl": "0.0.0"/' {record}""")
        rc, third = run_json(inv, "cron", "install", "facts", "--every", "30m", timeout=600)
        assert rc == 0, third
        (swap,) = [r for r in third["results"] if r["changed"]]
        assert swap["type"] == "controller_install" and "replacing 0.0.0-" in swap["summary"][0]
        assert sh(inv, "pharaoh", f"ls {paths.CONTROLLER_DIR}/releases | wc -l").strip() == "1"
        assert sh(inv, "pharaoh", "grep -vc '^#' /etc/cron.d/labctl-facts | head -1").strip() == "3"

        # The private half is on pharaoh only, 0600; its public half is authorised on m5 and irina.
        assert sh(inv, "pharaoh", f"stat -c %a {KEY}").strip() == "600"
        for h in ("m5", "irina", "workstation"):
            assert sh(inv, h, f"test -e {KEY} && echo yes || echo no").strip() == "no"
        pub = sh(inv, "pharaoh", f"cat {KEY}.pub").split()[1]
        for h in ("m5", "irina"):
            keys = sh(inv, h, "cat /root/.ssh/authorized_keys")
            assert [line.split()[1] for line in keys.splitlines() if line.endswith(MARK)] == [pub]
        # Each sim host's own /root/.ssh took it; this machine's was never touched.
        assert MARK in (lab.dir / "hosts" / "m5" / "root" / "root" / ".ssh" / "authorized_keys").read_text()
        mine = Path("/root/.ssh/authorized_keys")
        assert not mine.exists() or MARK not in mine.read_text()

        # The entry, run by hand on pharaoh, is labctl facts over SSH from there.
        ran = run_cron_entry(inv, "pharaoh", "facts")
        assert ran["rc"] == 0, (ran, sh(inv, "pharaoh", "tail -20 /var/log/labctl/facts.log"))
        snap = json.loads(sh(inv, "pharaoh", f"cat {paths.CONTROLLER_DIR}/facts.json"))
        by = {r["host"]: r for r in snap["results"]}
        assert by["m5"]["status"] == "ok" and by["irina"]["status"] == "ok", by
        assert by["m5"]["facts"]["memory"]["total_bytes"] > 0

        rc, listed = run_json(inv, "cron", "list")
        assert rc == 0, listed
        jobs = [j for j in listed["jobs"] if j["host"] == "pharaoh" and j["name"] == "facts"]
        assert len(jobs) == 1 and jobs[0]["last"]["rc"] == 0 and jobs[0]["last"]["end"] > 0
        assert jobs[0]["schedule"] == "*/30 * * * *" and "facts --no-torch --json" in jobs[0]["command"]
        assert not [j for j in listed["jobs"] if j["host"] != "pharaoh"]

        # --purge would pull labctl from under another job: refused while one is left.
        rc, _ = run_json(inv, "cron", "install", "rotate", "--every", "4h", timeout=600)
        assert rc == 0
        rc, refused = run_json(inv, "cron", "remove", "facts", "--purge")
        assert rc == 2 and "rotate" in refused["error"], refused
        assert "labctl-facts" in sh(inv, "pharaoh", "ls /etc/cron.d")
        rc, _ = run_json(inv, "cron", "remove", "rotate")
        assert rc == 0 and "labctl-rotate" not in sh(inv, "pharaoh", "ls /etc/cron.d")

        rc, gone = run_json(inv, "cron", "remove", "facts", "--purge")
        assert rc == 0, gone
        assert sh(inv, "pharaoh", "ls /etc/cron.d | grep -c labctl-facts || true").strip() == "0"
        assert sh(inv, "pharaoh", f"test -e {paths.CONTROLLER_DIR} && echo yes || echo no").strip() == "no"
        assert MARK not in sh(inv, "m5", "cat /root/.ssh/authorized_keys")
    finally:
        clean(inv)


def clean(inv: Any) -> None:
    """The lab as it was before `cron install`: no entry, no copy, no authorised key."""
    sh(
        inv,
        "pharaoh",
        f"rm -rf /etc/cron.d/labctl-facts /etc/cron.d/labctl-rotate {paths.CONTROLLER_DIR} {paths.job_status('facts')}",
    )
    for h in ("m5", "irina", "pharaoh"):
        sh(inv, h, f"sed -i '/{MARK}$/d' /root/.ssh/authorized_keys 2>/dev/null; true")


def test_an_install_that_fails_on_a_host_schedules_nothing(lab: Any) -> None:
    inv = lab.inventory_path
    lab.stop_host("irina")
    try:
        rc, doc = run_json(inv, "cron", "install", "facts", "--every", "1h", timeout=600)
        assert rc == 1, doc
        assert {h["host"]: h["status"] for h in doc["hosts"]}["irina"] == "unreachable"
        assert any("entry was not installed on pharaoh" in n for n in doc["notes"]), doc["notes"]
        assert "labctl-facts" not in sh(inv, "pharaoh", "ls /etc/cron.d")
    finally:
        lab.start_host("irina")
        clean(inv)


def test_install_rotate_check_changes_nothing(lab: Any) -> None:
    inv = lab.inventory_path
    before = {h: sh(inv, h, "ls -la /etc/cron.d /root/.ssh /var/lib/labctl") for h in ("pharaoh", "m5")}
    rc, doc = run_json(inv, "cron", "install", "rotate", "--every", "4h", "--check")
    assert rc == 0, doc
    assert doc["check"] is True and doc["schedule"] == "0 */4 * * *"
    assert any(r["changed"] for r in doc["results"])  # it would change ...
    assert {
        h: sh(inv, h, "ls -la /etc/cron.d /root/.ssh /var/lib/labctl") for h in ("pharaoh", "m5")
    } == before


def test_rotation_schedule_is_read_back_and_needs_a_cron_daemon(lab: Any, tmp_path: Path) -> None:
    """`cron install rotate -f FILE` copies FILE; with no cron daemon on pharaoh `cron list`,
    `orchestra status` and `doctor` say the entry never runs; once Debian's cron runs there,
    status shows the entry's next run and doctor passes."""
    import time

    import yaml

    from labctl.agent.cron.cronjobs import next_run
    from labctl.cron.jobs import ORCHESTRA_COPY
    from tests.conftest import labctl

    inv = lab.inventory_path
    book = tmp_path / "elsewhere.yaml"  # not the playbooks/orchestra.yaml beside the inventory
    models = [{"name": n, "size_gb": 0.004} for n in ("x", "y", "z")]
    doc = {"hosts": "m5", "warm": 2, "rotate": 1, "every": "4h", "models": models}
    book.write_text("# the file this test installs\n" + yaml.safe_dump(doc))
    cron_pid = None
    try:
        proc = labctl("-i", str(inv), "orchestra", "status", "-f", str(book), timeout=120)
        assert "not scheduled" in proc.stderr and f"labctl cron install rotate -f {book}" in proc.stderr
        assert "(in " not in proc.stderr, proc.stderr  # no promise drawn from `every: 4h`
        rc, st = run_json(inv, "orchestra", "status", "-f", str(book))
        assert st["next_rotation_at"] is None and st["schedule"]["installed"] is False, st

        rc, done = run_json(
            inv, "cron", "install", "rotate", "-f", str(book), "--schedule", "17 3 * * *", timeout=600
        )
        assert rc == 0, done
        assert done["orchestra_file"] == str(book) and f"-f {ORCHESTRA_COPY}" in done["command"]
        assert sh(inv, "pharaoh", f"cat {ORCHESTRA_COPY}") == book.read_text()

        # No cron runs on pharaoh: every view says the entry never runs.
        proc = labctl("-i", str(inv), "cron", "list")
        assert "no cron daemon runs on pharaoh" in proc.stderr.replace("\n", " "), proc.stderr
        rc, listed = run_json(inv, "cron", "list")
        (job,) = [j for j in listed["jobs"] if j["host"] == "pharaoh" and j["name"] == "rotate"]
        assert job["daemon_running"] is False and job["last"] is None
        rc, st = run_json(inv, "orchestra", "status", "-f", str(book))
        sch = st["schedule"]
        assert (sch["installed"], sch["host"], sch["schedule"]) == (True, "pharaoh", "17 3 * * *"), sch
        assert sch["daemon_running"] is False and st["next_rotation_at"] is None
        rc, dr = run_json(inv, "doctor", "--limit", "pharaoh", timeout=300)
        (line,) = [x for x in dr["lines"] if x["check"] == "cron"]
        assert line["status"] == "fail" and "no cron daemon" in line["found"] and "cron" in line["fix"], line

        # Debian's cron on pharaoh, with a /run of its own (its pid file must not meet another cron's).
        cron_pid = sh(
            inv,
            "pharaoh",
            "setsid unshare --mount sh -c 'mount -t tmpfs tmpfs /run && exec cron -f' "
            "</dev/null >/dev/null 2>&1 & echo $!",
        ).strip()
        for _ in range(100):  # until the exec: cron's own name in /proc
            if sh(inv, "pharaoh", f"cat /proc/{cron_pid}/comm").strip() == "cron":
                break
            time.sleep(0.1)
        before = time.time()
        rc, st = run_json(inv, "orchestra", "status", "-f", str(book))
        assert st["schedule"]["daemon_running"] is True, st["schedule"]
        assert st["next_rotation_at"] == next_run("17 3 * * *", before)  # this machine's clock and zone
        rc, dr = run_json(inv, "doctor", "--limit", "pharaoh", timeout=300)
        (line,) = [x for x in dr["lines"] if x["check"] == "cron"]
        assert line["status"] == "pass" and f"pid {cron_pid}" in line["found"], line
    finally:
        if cron_pid:
            sh(inv, "pharaoh", f"kill {cron_pid}")
        clean(inv)
