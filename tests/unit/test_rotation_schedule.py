"""Whether scheduled rotation really runs, without a host: when an installed cron entry fires
next, which cron daemons on this machine read its /etc/cron.d (real processes in /proc), the
orchestra file the rotate job's lab copy gets, and what `orchestra status`, `cron list` and
`doctor` say from the jobs a host reported."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from labctl.agent.core import paths
from labctl.agent.cron import cronjobs
from labctl.cron import plan
from labctl.cron.jobs import JOBS
from labctl.doctor.checks import check_cron, check_host
from labctl.doctor.gather import HostFound
from labctl.doctor.model import FAIL, PASS
from labctl.hosts.fanout import HostResult
from labctl.inventory.model import Host
from labctl.orchestra.render import render_status
from labctl.orchestra.status import scheduled_rotation, summarize
from labctl.provision.resources.cron import CronParams, cron_file

PHARAOH = Host(name="pharaoh", address="10.0.0.3", roles=["orchestrator"])


@pytest.fixture
def utc() -> Iterator[None]:
    """This process on UTC, so cron's local times are known here."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()


def at(text: str) -> float:
    return float(time.mktime(time.strptime(text, "%Y-%m-%d %H:%M")))


def stamp(t: float | None) -> str | None:
    return None if t is None else time.strftime("%a %Y-%m-%d %H:%M", time.localtime(t))


# -- when cron starts an entry ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "after", "expected"),
    [
        ("0 */4 * * *", "2024-09-04 05:30", "Wed 2024-09-04 08:00"),
        ("0 */4 * * *", "2024-09-04 22:00", "Thu 2024-09-05 00:00"),
        # A run on this very minute has started already: the next is tomorrow's.
        ("17 3 * * *", "2024-09-04 03:17", "Thu 2024-09-05 03:17"),
        ("*/30 * * * *", "2024-12-31 23:45", "Wed 2025-01-01 00:00"),
        ("0 6 * * 0", "2024-09-04 12:00", "Sun 2024-09-08 06:00"),
        ("0 6 * * 7", "2024-09-04 12:00", "Sun 2024-09-08 06:00"),  # 7 is Sunday too
        ("0 0 1-5/2 * *", "2024-09-02 00:00", "Tue 2024-09-03 00:00"),
        ("5,45 9 * * *", "2024-09-04 09:10", "Wed 2024-09-04 09:45"),
        # Day of month and weekday both restricted: either one (Friday the 6th before the 13th).
        ("0 0 13 * 5", "2024-09-01 00:00", "Fri 2024-09-06 00:00"),
        # One of them `*`: both must match, so the 13th that is a Friday.
        ("0 0 13 * *", "2024-09-01 00:00", "Fri 2024-09-13 00:00"),
        ("0 0 29 2 *", "2025-01-01 00:00", "Tue 2028-02-29 00:00"),
    ],
)
def test_next_run_is_when_cron_starts_the_entry(utc: None, schedule: str, after: str, expected: str) -> None:
    assert stamp(cronjobs.next_run(schedule, at(after))) == expected


@pytest.mark.parametrize(
    "schedule", ["0 0 31 2 *", "0 0 30 2 *", "every 4h", "61 * * * *", "0 */0 * * *", ""]
)
def test_an_entry_that_never_fires_or_cron_would_not_read_has_no_next_run(schedule: str) -> None:
    assert cronjobs.next_run(schedule, time.time()) is None


def test_next_run_is_in_the_hosts_local_time(utc: None) -> None:
    after, expected = at("2024-09-04 00:00"), at("2024-09-04 18:17")
    os.environ["TZ"] = "JST-9"  # UTC+9, no summer time, named without tzdata
    time.tzset()
    # 03:17 in Tokyo is 18:17 UTC the day before: from 09:00 Tokyo the next is the next day's.
    assert cronjobs.next_run("17 3 * * *", after) == expected


# -- which cron daemons run this host's entries ----------------------------------------------


def start_named(tmp_path: Path, name: str, *wrap: str) -> subprocess.Popen[bytes]:
    """A real process this machine's /proc names `name` (sleep, copied under that name), run
    through `wrap` (e.g. unshare); returned once it carries the name."""
    exe = tmp_path / "bin" / name
    exe.parent.mkdir(exist_ok=True)
    if not exe.exists():
        shutil.copy(shutil.which("sleep") or "/bin/sleep", exe)
    proc = subprocess.Popen([*wrap, str(exe), "300"] if not wrap else [*wrap[:-1], f"{wrap[-1]} {exe} 300"])
    while Path(f"/proc/{proc.pid}/comm").read_text().strip() != name:
        assert proc.poll() is None, f"{wrap} exited {proc.returncode}"
        time.sleep(0.01)
    return proc


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_running_crond_is_found_and_an_exited_one_is_not(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    crond = start_named(tmp_path, "crond")
    procs.append(crond)
    assert crond.pid in cronjobs.cron_daemons()
    crond.kill()
    while Path(f"/proc/{crond.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z":
        time.sleep(0.01)  # a zombie until reaped: it runs nothing
    assert crond.pid not in cronjobs.cron_daemons()


def test_cron_list_says_whether_a_daemon_runs_each_job_and_when_it_runs_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, procs: list[subprocess.Popen[bytes]]
) -> None:
    cron_dir = tmp_path / "cron.d"
    cron_dir.mkdir()
    monkeypatch.setattr(cronjobs, "CRON_DIR", str(cron_dir))
    monkeypatch.setattr(cronjobs, "UNIT_DIR", str(tmp_path / "none"))
    monkeypatch.setattr(paths, "LOCK_DIR", str(tmp_path))
    # A daemon name no other process here has: another test's cron must not count.
    monkeypatch.setattr(cronjobs, "CRON_DAEMONS", ("lbt-crond",))
    (cron_dir / "labctl-rotate").write_text(
        cron_file(CronParams(name="rotate", schedule="0 */4 * * *", command="labctl rotate"))
    )
    answer = cronjobs.list_command({})
    assert answer["daemons"]["cron"] == [] and answer["jobs"][0]["daemon_running"] is False
    crond = start_named(tmp_path, "lbt-crond")
    procs.append(crond)
    before = time.time()
    answer = cronjobs.list_command({})
    (job,) = answer["jobs"]
    assert answer["daemons"]["cron"] == [crond.pid] and job["daemon_running"] is True
    nxt = time.localtime(job["next"])
    assert before < job["next"] <= before + 4 * 3600 and nxt.tm_hour % 4 == 0 and nxt.tm_min == 0


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_cron_that_reads_another_cron_d_runs_none_of_these_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, procs: list[subprocess.Popen[bytes]]
) -> None:
    """A crond in its own mount namespace, where another folder is mounted over this host's
    cron.d (as on another simulated host, or in a container), runs none of its entries."""
    here, other = tmp_path / "cron.d", tmp_path / "other"
    here.mkdir()
    other.mkdir()
    monkeypatch.setattr(cronjobs, "CRON_DIR", str(here))
    monkeypatch.setattr(cronjobs, "CRON_DAEMONS", ("lbt-crond",))
    alike = start_named(tmp_path, "lbt-crond")
    procs.append(alike)
    wrap = (
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        f"mount --bind {other} {here} && exec",
    )
    apart = start_named(tmp_path, "lbt-crond", *wrap)
    procs.append(apart)
    assert cronjobs.cron_daemons() == [alike.pid]


# -- the rotate job's orchestra file ---------------------------------------------------------


def test_the_lab_copy_gets_the_given_orchestra_file_and_other_jobs_leave_it_alone(tmp_path: Path) -> None:
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "orchestra.yaml").write_text("every: 4h  # beside the inventory\n")
    (tmp_path / "playbooks" / "train.yaml").write_text("phases: {}\n")
    mine = tmp_path / "elsewhere" / "big-orchestra.yaml"
    mine.parent.mkdir()
    mine.write_text("every: 6h  # mine\n")
    inv = tmp_path / "lab.yaml"
    rotate = plan.lab_playbooks(inv, mine)
    assert rotate == {"orchestra.yaml": "every: 6h  # mine\n", "train.yaml": "phases: {}\n"}
    assert f"{plan.PLAYBOOKS}/orchestra.yaml" in plan.job_command(JOBS["rotate"])
    # facts installed after rotate: the copy rotate runs by is not replaced by the default one.
    assert plan.lab_playbooks(inv, None) == {"train.yaml": "phases: {}\n"}


# -- what orchestra status says ----------------------------------------------------------------


def job(name: str = "rotate", running: bool = True, next_at: float | None = 5000.0) -> dict[str, Any]:
    return {
        "name": name,
        "backend": "cron",
        "schedule": "0 */4 * * *",
        "command": "labctl rotate",
        "next": next_at,
        "daemon_running": running,
        "last": None,
    }


def listed(*jobs: dict[str, Any], host: str = "pharaoh", status: str = "ok") -> HostResult:
    return HostResult(host, status, data=list(jobs))


def shown(st: Any) -> str:
    console = Console(record=True, width=300, color_system=None)
    render_status(console, st)
    return console.export_text()


def test_status_with_no_rotate_job_anywhere_says_not_scheduled_and_how_to_schedule() -> None:
    sch = scheduled_rotation([listed(job("facts")), listed(host="m5")], "playbooks/big.yaml")
    assert sch["installed"] is False and sch["next_at"] is None
    assert sch["hint"] == "labctl cron install rotate -f playbooks/big.yaml"
    st = summarize({}, every_s=4 * 3600, warm_size=3, schedule=sch)
    assert st.next_at is None and st.to_json()["next_rotation_at"] is None
    text = shown(st)
    assert "not scheduled" in text and "labctl cron install rotate -f playbooks/big.yaml" in text
    assert "(in " not in text  # no promise of a next rotation


def test_status_shows_the_next_run_of_the_installed_entry() -> None:
    soon = time.time() + 3 * 3600 + 600
    sch = scheduled_rotation([listed(job(next_at=soon)), listed(host="m5")])
    assert (sch["installed"], sch["host"], sch["next_at"], sch["hint"]) == (True, "pharaoh", soon, None)
    st = summarize({}, every_s=4 * 3600, warm_size=3, schedule=sch)
    assert st.next_at == soon and st.to_json()["schedule"]["schedule"] == "0 */4 * * *"
    text = shown(st)
    assert time.strftime("%Y-%m-%d %H:%M", time.localtime(soon)) in text and "(in 3h" in text
    assert "0 */4 * * * on pharaoh" in text and "not scheduled" not in text


def test_status_of_an_entry_no_daemon_runs_says_it_never_runs() -> None:
    sch = scheduled_rotation([listed(job(running=False))])
    assert sch["installed"] is True and sch["next_at"] is None and sch["daemon_running"] is False
    text = shown(summarize({}, every_s=4 * 3600, warm_size=3, schedule=sch))
    assert "never" in text and "systemctl enable --now cron" in text and "(in " not in text


def test_status_names_hosts_it_could_not_ask() -> None:
    sch = scheduled_rotation([listed(host="pharaoh", status="unreachable")])
    assert sch["installed"] is False and sch["unanswered"] == ["pharaoh"]
    assert "could not ask pharaoh" in shown(summarize({}, every_s=60, warm_size=1, schedule=sch))


# -- doctor ------------------------------------------------------------------------------------


def found(jobs: list[dict[str, Any]], pids: list[int]) -> HostFound:
    return HostFound(PHARAOH, facts={}, cron={"jobs": jobs, "daemons": {"cron": pids, "systemd": False}})


def test_doctor_fails_a_host_whose_jobs_no_cron_daemon_runs_with_the_fix() -> None:
    (line,) = check_cron(found([job(running=False), job("facts", running=False)], []))
    assert line.status == FAIL and line.host == "pharaoh"
    assert "no cron daemon" in line.found and "rotate, facts" in line.found
    assert "systemctl enable --now cron" in line.fix
    assert [x.status for x in check_host(found([job(running=False)], [])) if x.check == "cron"] == [FAIL]


def test_doctor_passes_where_cron_runs_and_says_nothing_where_no_job_is_installed() -> None:
    (line,) = check_cron(found([job()], [812]))
    assert line.status == PASS and "cron (pid 812)" in line.found and "rotate" in line.found
    assert check_cron(found([], [])) == []
    assert check_cron(HostFound(PHARAOH, facts={})) == []


def test_f_is_refused_for_a_job_that_reads_no_orchestra_file(tmp_path: Path) -> None:
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "labctl",
            "cron",
            "install",
            "facts",
            "-f",
            str(tmp_path / "o.yaml"),
            "--every",
            "1h",
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert (
        proc.returncode == 2 and "only the rotate job reads" in proc.stderr and "Traceback" not in proc.stderr
    )
