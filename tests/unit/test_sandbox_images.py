"""Sandbox recipes and the `sandbox` resource's plan, as data: no host, no Docker needed."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.sandbox import image_name, languages
from labctl.agent.sandbox.image import remove_root
from labctl.agent.sandbox.languages import RECIPES, recipe, recipe_hash
from labctl.documents.validation import DocumentError
from labctl.hosts.agent_ship import agent_blob
from labctl.inventory.load import load_inventory
from labctl.inventory.model import Host
from labctl.inventory.model import Sandbox as SandboxSpec
from labctl.output.errors import InputError
from labctl.provision.playbook import load_playbook
from labctl.provision.resource import NotApplicable, PlanError, load_registry
from labctl.provision.resources.sandbox import Sandbox, merged_daemon_json

REPO = Path(__file__).resolve().parents[2]
FIRST_EIGHT = ["python", "javascript", "bash", "c", "cpp", "go", "rust", "java"]


# --- recipes -------------------------------------------------------------------------------


def test_recipes_cover_the_issue_languages_and_the_seeds_fifteen() -> None:
    assert set(FIRST_EIGHT) <= set(RECIPES)
    assert len(RECIPES) >= 15


@pytest.mark.parametrize("lang", sorted(RECIPES))
def test_each_recipe_is_complete_data(lang: str) -> None:
    r = RECIPES[lang]
    assert r.name == lang and r.image == f"labctl-sandbox/{lang}:latest"
    assert r.packages and all(p == p.strip() and " " not in p for p in r.packages)
    assert "/" not in r.file and r.file.count(".") == 1
    assert r.run and all(isinstance(a, str) for a in r.run)
    if r.compile is not None:
        assert r.file in r.compile  # the compiler reads the file the program was written to
    else:
        assert r.file in r.run
    assert "hello" in r.hello


def test_compiled_languages_compile_in_the_work_folder() -> None:
    assert RECIPES["c"].compile == ("gcc", "-O1", "-o", "main", "main.c")
    assert RECIPES["c"].run == ("./main",)
    assert set(RECIPES["c"].packages) == {"gcc", "libc6-dev"}
    assert RECIPES["python"].compile is None and RECIPES["python"].run == ("python3", "main.py")


def test_recipe_hash_is_16_hex_stable_and_distinct_per_language() -> None:
    hashes = {lang: recipe_hash(r) for lang, r in RECIPES.items()}
    assert all(len(h) == 16 and int(h, 16) >= 0 for h in hashes.values())
    assert len(set(hashes.values())) == len(hashes)
    assert recipe_hash(RECIPES["python"]) == recipe_hash(dataclasses.replace(RECIPES["python"]))


def test_recipe_hash_changes_with_the_packages_and_the_base(monkeypatch: pytest.MonkeyPatch) -> None:
    py = RECIPES["python"]
    before = recipe_hash(py)
    assert recipe_hash(dataclasses.replace(py, packages=(*py.packages, "python3-numpy"))) != before
    assert recipe_hash(dataclasses.replace(py, run=("python3", "-I", "main.py"))) != before
    monkeypatch.setattr(languages, "BASE_VERSION", languages.BASE_VERSION + "-next")
    assert recipe_hash(py) != before


def test_unknown_language_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match=r"known: .*python"):
        recipe("cobol")


def test_inventory_refuses_an_unknown_sandbox_language(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("lab: l\nhosts:\n  irina: {address: 10.0.0.2, sandbox: {languages: [python, cobol]}}\n")
    with pytest.raises((DocumentError, InputError), match=r"cobol.*known: .*python"):
        load_inventory(inv)


def test_the_seed_lab_inventory_languages_all_have_recipes() -> None:
    inv = load_inventory(REPO / "labctl/data/lab.yaml")
    spec = inv.host("irina").sandbox
    assert spec is not None and set(spec.languages) <= set(RECIPES)


# --- the resource's plan -------------------------------------------------------------------


def host(languages: list[str] | None = None) -> Host:
    return Host(
        name="irina",
        address="10.0.0.2",
        sandbox=SandboxSpec(languages=languages or ["python", "c"]),
    )


def docker_state(**over: Any) -> dict[str, dict[str, Any]]:
    """A host with Docker installed, running and configured as planned, both images current."""
    res = Sandbox.from_playbook(host(), {})
    want = merged_daemon_json(None, _settings(res, userns_ok=True))
    st: dict[str, Any] = {
        "uid": 0,
        "apt": True,
        "docker": "/usr/bin/docker",
        "dockerd": "/usr/sbin/dockerd",
        "debootstrap": "/usr/sbin/debootstrap",
        "systemd": False,
        "dockerd_pid": 1757,
        "userns": {"ok": True, "why": ""},
        "daemon_json": {"exists": True, "text": want, "mode": 0o644},
        "daemon": {"answering": True, "version": "20.10.24"},
        "images": {
            lang: {"image": image_name(lang), "lang": lang, "recipe": recipe_hash(RECIPES[lang])}
            for lang in ("python", "c")
        },
    }
    st.update(over)
    return {"docker": st}


def _settings(res: Any, userns_ok: bool) -> dict[str, Any]:
    from labctl.provision.resources.sandbox import daemon_settings

    return daemon_settings(res.params, userns_ok)


def ops_of(change: Any, kind: str) -> list[dict[str, Any]]:
    return [op for op in change.ops if op["op"] == kind]


def test_sandbox_is_registered_and_reads_languages_from_the_inventory() -> None:
    assert load_registry()["sandbox"] is Sandbox
    res = Sandbox.from_playbook(host(["go", "python"]), {})
    assert res.label() == "sandbox go,python"
    assert Sandbox.from_playbook(host(), {"languages": ["rust"]}).label() == "sandbox rust"


def test_sandbox_without_inventory_entry_is_not_applicable() -> None:
    with pytest.raises(NotApplicable, match="no sandbox in the inventory"):
        Sandbox.from_playbook(Host(name="m5", address="10.0.0.1"), {})


def test_sandbox_params_refuse_an_unknown_language() -> None:
    with pytest.raises(ValueError, match=r"cobol.*known"):
        Sandbox.from_playbook(host(), {"languages": ["cobol"]})


def test_converged_host_plans_nothing() -> None:
    assert not Sandbox.from_playbook(host(), {}).plan(docker_state()).changed


def test_no_docker_plans_install_config_start_and_every_image() -> None:
    st = docker_state(
        docker=None,
        dockerd=None,
        debootstrap=None,
        dockerd_pid=None,
        daemon_json={"exists": False},
        daemon={"answering": False, "error": "docker is not installed"},
        images={},
    )
    change = Sandbox.from_playbook(host(), {}).plan(st)
    kinds = [op["op"] for op in change.ops]
    install = ops_of(change, "run")[-1]["argv"]
    assert install[-2:] == ["docker.io", "debootstrap"]
    # apt first, then the config, then the daemon, then the images it needs running
    assert (
        kinds.index("run") < kinds.index("write_file") < kinds.index("dockerd") < kinds.index("sandbox_image")
    )
    written = json.loads(ops_of(change, "write_file")[0]["text"])
    assert written["log-opts"] == {"max-size": "10m", "max-file": "3"}
    assert written["no-new-privileges"] is True and written["live-restore"] is True
    assert written["userns-remap"] == "default"
    (start,) = ops_of(change, "dockerd")
    assert (start["action"], start["systemd"]) == ("start", False)
    assert start["rollback"]["existed"] is False  # a failed first start removes the new file again
    built = {op["lang"]: op for op in ops_of(change, "sandbox_image")}
    assert set(built) == {"python", "c"}
    assert built["c"]["packages"] == ["gcc", "libc6-dev"] and built["c"]["recipe"] == recipe_hash(
        RECIPES["c"]
    )


def test_no_docker_and_no_apt_is_refused_with_the_fix() -> None:
    st = docker_state(docker=None, dockerd=None, apt=False, daemon={"answering": False, "error": "x"})
    with pytest.raises(PlanError, match=r"lacks docker\.io") as e:
        Sandbox.from_playbook(host(), {}).plan(st)
    assert "package manager" in e.value.hint


def test_not_root_is_refused_naming_the_fix() -> None:
    with pytest.raises(PlanError, match="needs root") as e:
        Sandbox.from_playbook(host(), {}).plan(docker_state(uid=1000))
    assert "user: root" in e.value.hint


def test_docker_without_daemon_plans_a_start_then_builds_checked_at_run_time() -> None:
    st = docker_state(dockerd_pid=None, daemon={"answering": False, "error": "Cannot connect"}, images={})
    change = Sandbox.from_playbook(host(), {}).plan(st)
    assert ops_of(change, "write_file") == [] and ops_of(change, "run") == []
    assert [op["action"] for op in ops_of(change, "dockerd")] == ["start"]
    assert any("Cannot connect" in s for s in change.summary)
    assert {op["lang"] for op in ops_of(change, "sandbox_image")} == {"python", "c"}


def test_systemd_host_starts_docker_service() -> None:
    st = docker_state(systemd=True, dockerd_pid=None, daemon={"answering": False, "error": "down"})
    change = Sandbox.from_playbook(host(), {}).plan(st)
    assert ops_of(change, "dockerd")[0]["systemd"] is True
    assert any("docker.service" in s for s in change.summary)


def test_outdated_image_label_plans_a_rebuild_of_that_image_only() -> None:
    st = docker_state()
    st["docker"]["images"]["c"]["recipe"] = "0123456789abcdef"
    change = Sandbox.from_playbook(host(), {}).plan(st)
    assert [op["lang"] for op in change.ops] == ["c"]
    assert change.summary == [
        f"rebuild labctl-sandbox/c:latest (recipe 0123456789abcdef -> {recipe_hash(RECIPES['c'])})"
    ]


def test_missing_image_plans_a_build() -> None:
    st = docker_state()
    del st["docker"]["images"]["python"]
    change = Sandbox.from_playbook(host(), {}).plan(st)
    assert [op["lang"] for op in ops_of(change, "sandbox_image")] == ["python"]
    assert ops_of(change, "dockerd") == []


def test_daemon_json_change_plans_a_restart_and_keeps_other_keys() -> None:
    st = docker_state()
    st["docker"]["daemon_json"] = {
        "exists": True,
        "text": json.dumps({"data-root": "/srv/docker", "log-opts": {"labels": "x", "max-size": "1g"}}),
    }
    change = Sandbox.from_playbook(host(), {}).plan(st)
    assert [op["action"] for op in ops_of(change, "dockerd")] == ["restart"]
    # a daemon that does not come back with the new file gets the old one back
    backup = "/var/lib/labctl/backup/daemon.json"
    assert ops_of(change, "write_file")[0]["backup"] == backup
    assert ops_of(change, "dockerd")[0]["rollback"] == {
        "path": "/etc/docker/daemon.json",
        "backup": backup,
        "existed": True,
    }
    written = json.loads(ops_of(change, "write_file")[0]["text"])
    assert written["data-root"] == "/srv/docker"
    assert written["log-opts"] == {"labels": "x", "max-size": "10m", "max-file": "3"}
    assert change.diffs and "/etc/docker/daemon.json" in change.diffs[0]
    # userns-remap turned on moves Docker's storage: every image is built (checked at run time)
    assert {op["lang"] for op in ops_of(change, "sandbox_image")} == {"python", "c"}


def test_unchanged_daemon_json_never_restarts_a_running_daemon() -> None:
    change = Sandbox.from_playbook(host(), {"log_max_size": "10m"}).plan(docker_state())
    assert ops_of(change, "dockerd") == []


def test_configure_daemon_false_leaves_daemon_json_and_the_daemon_alone() -> None:
    st = docker_state(daemon_json={"exists": False})
    assert not Sandbox.from_playbook(host(), {"configure_daemon": False}).plan(st).changed


def test_userns_remap_skipped_where_the_kernel_does_not_allow_it_says_why() -> None:
    why = "this host already runs inside a user namespace (uid_map [['0', '1000', '1']])"
    st = docker_state(userns={"ok": False, "why": why}, daemon_json={"exists": False})
    change = Sandbox.from_playbook(host(), {}).plan(st)
    written = json.loads(ops_of(change, "write_file")[0]["text"])
    assert "userns-remap" not in written
    assert any(f"userns-remap skipped: {why}" in s for s in change.summary)


def test_invalid_daemon_json_is_refused_not_overwritten() -> None:
    st = docker_state(daemon_json={"exists": True, "text": "{not json"})
    with pytest.raises(PlanError, match=r"daemon\.json on irina is not valid JSON"):
        Sandbox.from_playbook(host(), {}).plan(st)


def test_log_limits_come_from_the_playbook() -> None:
    st = docker_state(daemon_json={"exists": False})
    change = Sandbox.from_playbook(host(), {"log_max_size": "50m", "log_max_file": 5}).plan(st)
    assert json.loads(ops_of(change, "write_file")[0]["text"])["log-opts"] == {
        "max-size": "50m",
        "max-file": "5",
    }


def test_sandbox_playbook_parses(tmp_path: Path) -> None:
    pb = load_playbook(REPO / "playbooks/sandbox.yaml")
    assert [e.type_name for p in pb.plays for e in p.entries] == ["sandbox"]


def test_provision_probe_blob_carries_the_sandbox_probe() -> None:
    import base64
    import io
    import zipfile
    import zlib

    names = zipfile.ZipFile(
        io.BytesIO(zlib.decompress(base64.b64decode(agent_blob("provision.probe"))))
    ).namelist()
    assert "labctl/agent/sandbox/daemon.py" in names and "labctl/agent/sandbox/image.py" in names


# --- the build folder's removal --------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount")
def test_build_folder_removal_unmounts_first_and_never_deletes_through_a_mount(tmp_path: Path) -> None:
    """debootstrap killed mid-way leaves /proc (or a bind-mounted /dev) mounted in its root:
    removing that folder file by file would delete the host's files through the mount."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("host file")
    root = tmp_path / "build" / "c-abc123"
    (root / "dev").mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(outside), str(root / "dev")], check=True)
    try:
        remove_root(str(root))
    finally:
        subprocess.run(["umount", "-l", str(root / "dev")], capture_output=True)
    assert not root.exists()
    assert (outside / "keep").read_text() == "host file"


def test_init_writes_the_sandbox_playbook_and_it_is_a_valid_playbook(tmp_path: Path) -> None:
    from labctl.documents.starter import write_starter
    from labctl.provision.playbook import load_playbook

    repo = Path(__file__).resolve().parents[2]
    written = write_starter(tmp_path / "mylab")
    book = tmp_path / "mylab/playbooks/sandbox.yaml"
    assert book in written and book.read_bytes() == (repo / "playbooks/sandbox.yaml").read_bytes()
    assert load_playbook(book).plays[0].hosts == "role:sandbox"
