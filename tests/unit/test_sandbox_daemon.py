"""userns-remap and daemon.json's mode in the `sandbox` resource's plan, as data; what the
agent reads as someone else's in Docker's data root, from files laid out as Docker keeps them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.sandbox import daemon, image_name
from labctl.provision.resources.sandbox import (
    Sandbox,
    SandboxParams,
    daemon_settings,
    merged_daemon_json,
    userns_decision,
)
from tests.unit.test_sandbox_images import docker_state, host, ops_of

FOREIGN = {
    "containers": ["web"],
    "images": ["nginx:latest", "labctl-sandbox/python:mine"],
    "source": "daemon",
}
NOTHING: dict[str, Any] = {"containers": [], "images": [], "source": "daemon"}


def plan(params: dict[str, Any] | None = None, **over: Any) -> Any:
    return Sandbox.from_playbook(host(), params or {}).plan(docker_state(**over))


def written(change: Any) -> dict[str, Any]:
    (op,) = ops_of(change, "write_file")
    return dict(json.loads(op["text"]))


def daemon_json(remap: bool, current: str | None = None) -> str:
    """daemon.json as labctl writes it with the playbook's defaults."""
    return merged_daemon_json(None, daemon_settings(SandboxParams.model_validate({}), remap, current))


# --- userns-remap ------------------------------------------------------------------------


def test_auto_leaves_remap_off_on_a_daemon_holding_foreign_things_and_says_why() -> None:
    change = plan(daemon_json={"exists": False}, foreign=FOREIGN)
    assert "userns-remap" not in written(change)
    said = " ".join(change.summary)
    assert "userns-remap left off" in said
    assert "1 container (web)" in said and "2 images (nginx:latest, labctl-sandbox/python:mine)" in said
    assert "userns_remap: force" in said
    # The storage does not move: labctl's current images are not built again.
    assert ops_of(change, "sandbox_image") == []


def test_auto_says_why_remap_stays_off_even_with_nothing_to_write() -> None:
    change = plan(daemon_json={"exists": True, "text": daemon_json(False), "mode": 0o644}, foreign=FOREIGN)
    assert not change.changed
    assert len(change.summary) == 1 and "left off" in change.summary[0] and "web" in change.summary[0]


def test_auto_turns_remap_on_where_docker_holds_only_labctls_things() -> None:
    change = plan(daemon_json={"exists": False}, foreign=NOTHING)
    assert written(change)["userns-remap"] == "default"
    assert not any("left off" in s for s in change.summary)


def test_auto_leaves_remap_off_when_what_docker_holds_cannot_be_read() -> None:
    change = plan(daemon_json={"exists": False}, foreign={"error": "PermissionError: /var/lib/docker"})
    assert "userns-remap" not in written(change)
    assert any("cannot tell what Docker holds (PermissionError" in s for s in change.summary)


def test_force_turns_remap_on_and_names_what_it_hides() -> None:
    change = plan({"userns_remap": "force"}, daemon_json={"exists": False}, foreign=FOREIGN)
    assert written(change)["userns-remap"] == "default"
    assert any("as the playbook forces" in s and "web" in s for s in change.summary)


def test_a_remap_already_on_stays_as_written_whatever_docker_holds() -> None:
    text = daemon_json(True, "builder:builder")
    change = plan(daemon_json={"exists": True, "text": text, "mode": 0o644}, foreign=FOREIGN)
    assert not change.changed and change.summary == []


def test_off_removes_remap_as_the_playbook_says() -> None:
    text = daemon_json(True)
    change = plan({"userns_remap": "off"}, daemon_json={"exists": True, "text": text, "mode": 0o644})
    assert "userns-remap" not in written(change)
    assert any("userns-remap off as the playbook says" in s for s in change.summary)


def test_the_decision_is_data() -> None:
    ok = {"ok": True, "why": ""}
    assert userns_decision("auto", ok, NOTHING, None).on
    assert not userns_decision("auto", ok, FOREIGN, None).on
    assert userns_decision("auto", ok, FOREIGN, None).withheld
    assert userns_decision("auto", ok, FOREIGN, '{"userns-remap": "default"}').on
    assert userns_decision("force", ok, FOREIGN, None).on
    assert not userns_decision("force", {"ok": False, "why": "no"}, NOTHING, None).on
    assert not userns_decision("off", ok, NOTHING, None).on


def test_the_unknown_mode_is_refused_naming_the_three() -> None:
    with pytest.raises(ValueError, match=r"auto.*force.*off"):
        Sandbox.from_playbook(host(), {"userns_remap": "always"})


# --- daemon.json's mode --------------------------------------------------------------------


def test_daemon_json_with_its_content_and_mode_plans_nothing() -> None:
    text = docker_state()["docker"]["daemon_json"]["text"]
    assert not plan(daemon_json={"exists": True, "text": text, "mode": 0o644}).changed


def test_a_wrong_mode_alone_is_fixed_without_restarting_dockerd() -> None:
    text = docker_state()["docker"]["daemon_json"]["text"]
    change = plan(daemon_json={"exists": True, "text": text, "mode": 0o600})
    assert [op["op"] for op in change.ops] == ["chmod"] and change.ops[0]["mode"] == 0o644


def test_probe_reads_daemon_json_with_its_mode_docker_cli_mocked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "daemon.json"
    path.write_text('{"debug": true}\n')
    os.chmod(path, 0o640)
    monkeypatch.setattr(daemon, "DAEMON_JSON", str(path))
    monkeypatch.setattr(daemon, "DATA_ROOT", str(tmp_path / "no-docker-yet"))
    monkeypatch.setattr(daemon, "daemon_answers", lambda timeout=15: {"answering": False, "error": "down"})
    found = daemon.probe({})
    assert found["daemon_json"]["text"] == '{"debug": true}\n'
    assert found["daemon_json"]["mode"] == 0o640
    assert found["foreign"] == {"containers": [], "images": [], "source": "disk"}


# --- what a stopped daemon's data root holds -----------------------------------------------


def _container(root: Path, cid: str, name: str, labels: dict[str, str]) -> None:
    d = root / "containers" / cid
    d.mkdir(parents=True)
    (d / "config.v2.json").write_text(json.dumps({"Name": "/" + name, "Config": {"Labels": labels}}))


def _image(root: Path, digest: str, labels: dict[str, str] | None) -> None:
    d = root / "image" / "overlay2" / "imagedb" / "content" / "sha256"
    d.mkdir(parents=True, exist_ok=True)
    (d / digest).write_text(json.dumps({"config": {"Labels": labels}}))


def test_data_root_on_disk_names_what_is_not_labctls(tmp_path: Path) -> None:
    root = tmp_path / "docker"
    ours = {"labctl.lang": "python", "labctl.recipe": "d35588b34ce01dab"}
    _container(root, "a" * 64, "labctl-sbx-python-1", {**ours, "labctl.sandbox": "1"})
    _container(root, "b" * 64, "from-our-image", ours)  # inherited labels: still someone's
    _container(root, "c" * 64, "web", {})
    _image(root, "1" * 64, ours)
    _image(root, "2" * 64, None)
    _image(root, "3" * 64, {})
    repos = {
        "labctl-sandbox/python": {image_name("python"): "sha256:" + "1" * 64},
        "mine/py": {"mine/py:1": "sha256:" + "1" * 64},
        "labctl-sandbox/c": {"labctl-sandbox/c:mine": "sha256:" + "1" * 64},  # not the python one's name
        "nginx": {
            "nginx:latest": "sha256:" + "2" * 64,
            "nginx@sha256:" + "9" * 64: "sha256:" + "2" * 64,
        },
    }
    (root / "image" / "overlay2" / "repositories.json").write_text(json.dumps({"Repositories": repos}))
    found = daemon.foreign_on_disk(str(root))
    assert sorted(found["containers"]) == ["from-our-image", "web"]
    assert sorted(found["images"]) == ["333333333333", "labctl-sandbox/c:mine", "mine/py:1", "nginx:latest"]


def test_a_data_root_that_is_not_there_holds_nothing(tmp_path: Path) -> None:
    assert daemon.foreign_on_disk(str(tmp_path / "none")) == {
        "containers": [],
        "images": [],
        "source": "disk",
    }


def test_the_data_root_comes_from_daemon_json(tmp_path: Path) -> None:
    root = tmp_path / "srv-docker"
    _container(root, "c" * 64, "web", {})
    dj = {"exists": True, "text": json.dumps({"data-root": str(root)})}
    assert daemon.foreign(False, dj)["containers"] == ["web"]


def test_an_unreadable_data_root_is_an_error_not_nothing(tmp_path: Path) -> None:
    root = tmp_path / "docker"
    (root / "containers").parent.mkdir()
    (root / "containers").write_text("not a folder")
    (root / "image").mkdir()
    (root / "image" / "overlay2").mkdir()
    (root / "image" / "overlay2" / "repositories.json").write_text("{broken")
    assert "error" in daemon.foreign(False, {"exists": True, "text": json.dumps({"data-root": str(root)})})


def test_a_dockerd_whose_pid_file_is_gone_is_found_in_proc_and_two_are_not_guessed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from labctl.agent.sandbox import daemon

    monkeypatch.setattr(daemon, "PIDFILE", str(tmp_path / "docker.pid"))  # gone
    names = {"1": "init", "42": "dockerd", "43": "containerd", "self": ""}
    monkeypatch.setattr(daemon.os, "listdir", lambda path: list(names) if path == "/proc" else [])
    monkeypatch.setattr(daemon.procs, "comm", lambda pid: names.get(str(pid), ""))
    zombies = {45}
    monkeypatch.setattr(daemon.procs, "alive", lambda pid: pid not in zombies)
    names["45"] = "dockerd"  # a stopped daemon nobody reaped is not the one running
    assert daemon._pid_of_dockerd() == 42
    names["44"] = "dockerd"  # which one to restart is not labctl's guess
    assert daemon._pid_of_dockerd() is None


def test_a_stopped_dockerd_left_a_zombie_by_its_parent_counts_as_stopped() -> None:
    import subprocess

    from labctl.agent.sandbox import daemon

    # This process is the child's parent and does not reap it before the stop returns,
    # as a test session that started dockerd did not: it stays in /proc as a zombie.
    child = subprocess.Popen(["sleep", "60"])
    try:
        daemon._stop_background(child.pid, seconds=10)  # raised "did not stop" before
        assert Path(f"/proc/{child.pid}").exists()  # the zombie is there all along
    finally:
        child.kill()
        child.wait()
