"""The provision commands hints name are read off the playbook they would run, so a command that
would do nothing (a host outside every play, a play whose `languages:` leaves the language
out) is never named; the sandbox's hints say which inventory line to change first."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from labctl.inventory.load import load_inventory
from labctl.output.errors import InputError
from labctl.provision.hint import provision_command, provision_fix
from labctl.sandbox.api import PLAYBOOK, build_hint, ready_hosts

REPO = Path(__file__).resolve().parents[2]
HOSTS: dict[str, Any] = {
    "m5": {
        "address": "10.0.0.10",
        "roles": ["train", "cache"],
        "model_cache": {"path": "/mnt/c", "size_gb": 2},
    },
    "irina": {
        "address": "10.0.0.20",
        "roles": ["storage", "sandbox"],
        "storage": {"models": "/srv/models"},
        "sandbox": {"languages": ["python"]},
    },
    "box": {"address": "10.0.0.30", "roles": [], "sandbox": {"languages": ["python", "go"]}},
}


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A lab folder as `labctl init` makes one, and the user in it."""
    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory" / "lab.yaml").write_text(yaml.safe_dump({"lab": "t", "hosts": HOSTS}))
    shutil.copytree(REPO / "playbooks", tmp_path / "playbooks")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def ctx(lab: Path) -> Any:
    path = lab / "inventory" / "lab.yaml"
    return SimpleNamespace(inventory=load_inventory(path), inventory_path=path)


def test_the_default_playbook_needs_no_p_and_a_shipped_one_is_named_from_here(lab: Path) -> None:
    inv = ctx(lab).inventory
    assert provision_command(inv, "m5", "model_cache") == "labctl provision --tags model_cache --limit m5"
    assert provision_command(inv, "irina", "sandbox", PLAYBOOK) == (
        "labctl provision -p playbooks/sandbox.yaml --tags sandbox --limit irina"
    )


def test_a_host_outside_every_play_gets_no_command_but_what_to_change(lab: Path) -> None:
    inv = ctx(lab).inventory
    # box declares sandboxes but not the role the sandbox play selects: provision --limit box
    # would succeed having built nothing
    assert provision_command(inv, "box", "sandbox", PLAYBOOK) is None
    said = provision_fix(inv, "box", "sandbox", PLAYBOOK)
    assert said.startswith("no play of playbooks/sandbox.yaml applies sandbox to box"), said
    assert said.endswith("`labctl provision -p playbooks/sandbox.yaml --tags sandbox --limit box`"), said
    assert provision_command(inv, "irina", "model_cache") is None  # irina is no cache host


def test_a_play_whose_languages_leave_the_language_out_is_not_named(lab: Path) -> None:
    (lab / "playbooks" / "sandbox.yaml").write_text(
        "name: s\nplays:\n  - hosts: role:sandbox\n    resources:\n      - sandbox: {languages: [python]}\n"
    )
    c = ctx(lab)
    irina = c.inventory.hosts["irina"]
    assert (
        build_hint(c, irina, ["python"])
        == "`labctl provision -p playbooks/sandbox.yaml --tags sandbox --limit irina`"
    )
    assert build_hint(c, irina, ["c"]).startswith(
        "no play of playbooks/sandbox.yaml applies sandbox to irina"
    )


def test_without_the_playbook_anywhere_the_hint_says_where_to_get_it(lab: Path) -> None:
    (lab / "playbooks" / "sandbox.yaml").unlink()
    c = ctx(lab)
    said = build_hint(c, c.inventory.hosts["irina"], ["python"])
    assert "`labctl init DIR`" in said and "`labctl provision -p DIR/playbooks/sandbox.yaml" in said, said


def test_a_language_the_host_does_not_declare_names_the_inventory_line_then_the_build(lab: Path) -> None:
    c = ctx(lab)
    irina = c.inventory.hosts["irina"]
    with pytest.raises(InputError) as e:
        ready_hosts(c, [irina], ["go"])
    assert e.value.exit_code == 2
    assert "go is not among irina's sandbox languages (python)" in e.value.message
    assert e.value.hint == (
        "Add go to hosts.irina.sandbox.languages there, then build its image: "
        "`labctl provision -p playbooks/sandbox.yaml --tags sandbox --limit irina`."
    )
    assert str(lab / "inventory" / "lab.yaml") in e.value.message


def test_a_host_without_any_sandbox_languages_is_told_the_whole_key_to_add(lab: Path) -> None:
    c = ctx(lab)
    m5 = c.inventory.hosts["m5"]
    with pytest.raises(InputError) as e:
        ready_hosts(c, [m5], ["python"])
    assert "m5 has no sandbox languages" in e.value.message
    assert e.value.hint.startswith(
        "Add `sandbox: {languages: [python]}` to hosts.m5 there, then build its image:"
    )


def test_hosts_that_declare_the_language_are_the_ones_used(lab: Path) -> None:
    c = ctx(lab)
    hosts = [c.inventory.hosts["irina"], c.inventory.hosts["box"]]
    assert [h.name for h in ready_hosts(c, hosts, ["go"])] == ["box"]
    assert [h.name for h in ready_hosts(c, hosts, ["python"])] == ["irina", "box"]
