"""The host check's comparison on snapshots: what counts as left behind and what does not."""

from __future__ import annotations

import os
import subprocess
from typing import Any

from labctl.agent.commands import resolve
from labctl.agent.sandbox import hostcheck

CID = "a" * 64
OTHER = "b" * 64


def snap(
    containers: list[dict[str, Any]] = (),
    procs: list[dict[str, Any]] = (),
    disk: int = 10 << 30,
    mem: int = 8 << 30,
) -> dict[str, Any]:  # type: ignore[assignment]
    return {
        "hostname": "labhost",
        "labels": ["labctl.sandbox=1"],
        "docker_error": None,
        "containers": list(containers),
        "processes": list(procs),
        "disk": {"/var/lib/docker": disk, "/tmp": disk},
        "mem_available": mem,
    }


def box(cid: str, name: str, state: str = "running") -> dict[str, Any]:
    return {"id": cid, "name": name, "state": state, "labels": {}}


def proc(pid: int, container: str | None, uid: int = 65534) -> dict[str, Any]:
    return {"pid": pid, "start": 100 + pid, "uid": uid, "container": container, "cmd": "sleep 1000"}


def test_a_refilled_idle_pool_container_is_not_left_behind() -> None:
    after = snap([box(CID, "labctl-sbx-python-0123456789ab")], [proc(10, CID)])
    assert hostcheck.compare(snap(), after)["clean"]


def test_a_claimed_container_still_there_and_its_process_are_left_behind() -> None:
    before = snap([box(CID, "labctl-sbx-python-0123456789ab")])
    after = snap([box(CID, "labctl-run-0123456789ab")], [proc(10, CID)])
    report = hostcheck.compare(before, after)
    assert not report["clean"]
    assert [c["name"] for c in report["containers_left"]] == ["labctl-run-0123456789ab"]
    assert [p["pid"] for p in report["processes_left"]] == [10]


def test_a_process_outliving_its_container_or_loose_as_nobody_is_left_behind() -> None:
    before = snap([box(CID, "labctl-run-0123456789ab")])
    after = snap([], [proc(11, CID), proc(12, None)])
    report = hostcheck.compare(before, after)
    assert {p["pid"] for p in report["processes_left"]} == {11, 12}
    assert any("outlived" in p for p in report["problems"])
    assert any("outside any container" in p for p in report["problems"])


def test_what_was_there_before_and_other_peoples_containers_are_not_judged() -> None:
    before = snap([], [proc(12, None)])
    after = snap([], [proc(12, None), proc(13, OTHER, uid=0)])
    assert hostcheck.compare(before, after)["clean"]


def test_disk_and_memory_must_come_back_within_the_tolerance() -> None:
    before = snap(disk=10 << 30, mem=8 << 30)
    assert hostcheck.compare(before, snap(disk=(10 << 30) - (100 << 20), mem=(8 << 30) - (100 << 20)))[
        "clean"
    ]
    report = hostcheck.compare(before, snap(disk=(9 << 30), mem=(6 << 30)))
    assert not report["clean"]
    assert any("/tmp: 1024 MiB less free" in p for p in report["problems"])
    assert any("memory: 2048 MiB less available" in p for p in report["problems"])


def test_snapshot_finds_a_process_running_as_the_sandbox_user() -> None:
    """A real process as uid 65534 on this machine (needs root to switch user)."""
    if os.geteuid() != 0:
        import pytest

        pytest.skip("needs root to start a process as uid 65534")
    child = subprocess.Popen(["sleep", "30"], user=65534, group=65534)
    try:
        before = {
            "hostname": "x",
            "labels": [],
            "containers": [],
            "processes": [],
            "disk": {},
            "mem_available": None,
        }
        report = hostcheck.compare(before, hostcheck.snapshot(sock="/nonexistent/docker.sock"))
        assert child.pid in [p["pid"] for p in report["processes_left"]]
        assert any("Docker could not be asked" in p for p in report["problems"])
    finally:
        child.kill()
        child.wait()


def test_the_agent_command_is_registered() -> None:
    answer = resolve("sandbox.hostcheck")({"action": "snapshot", "socket": "/nonexistent/docker.sock"})
    assert answer["snapshot"]["docker_error"]
