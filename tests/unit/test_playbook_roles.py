"""Selectors shipped for any lab (issue 24): a role this lab has no host for skips the play,
phase or orchestra with that named precondition; a typo stays an error with did-you-mean."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from labctl.documents.validation import DocumentError
from labctl.inventory.load import load_inventory
from labctl.inventory.model import Host, Inventory
from labctl.inventory.select import KNOWN_ROLES, require_role_hosts, select_hosts, select_in_lab
from labctl.orchestra.spec import Orchestra
from labctl.output.errors import InputError
from labctl.provision.playbook import load_playbook, play_members, skipped_plays
from labctl.train.phases import Settings

REPO = Path(__file__).resolve().parents[2]

# The lab: a cache host and a storage host, no trainer, no inference host.
CACHE_AND_STORAGE = """\
lab: two
defaults: {connection: local}
hosts:
  cache:
    address: 127.0.0.1
    roles: [cache]
    model_cache: {path: /mnt/model-cache, size_gb: 1, source: store}
  store:
    address: 127.0.0.1
    roles: [storage]
    storage: {models: /srv/models}
"""

# An inference host and no trainer: the orchestra has every GPU.
SERVE_ONLY = """\
lab: serve
defaults: {connection: local}
hosts:
  serve:
    address: 127.0.0.1
    roles: [inference, cache]
    gpus: [{model: Tesla P40, memory_gb: 24, count: 4}]
    model_cache: {path: /mnt/model-cache, size_gb: 64}
"""


def inventory(tmp_path: Path, text: str = CACHE_AND_STORAGE) -> Inventory:
    p = tmp_path / "lab.yaml"
    p.write_text(text)
    return load_inventory(p)


def names(hosts: list[Host]) -> list[str]:
    return [h.name for h in hosts]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "labctl", *args], capture_output=True, text=True, timeout=120, cwd=REPO
    )


# --- the selection --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "hosts", "why"),
    [
        ("role:train", [], "no host has role train"),
        ("role:train,role:inference", [], "no host has role train or inference"),
        ("role:train,!cache", [], "no host has role train"),
        ("role:train,cache", ["cache"], None),  # what the lab has still runs
        ("all,!role:train", ["cache", "store"], None),
        ("role:cache", ["cache"], None),
    ],
)
def test_a_known_role_the_lab_lacks_selects_nothing_and_says_why(
    tmp_path: Path, expr: str, hosts: list[str], why: str | None
) -> None:
    chosen = select_in_lab(inventory(tmp_path), expr)
    assert (names(chosen.hosts), chosen.why_empty) == (hosts, why)


@pytest.mark.parametrize(
    ("expr", "term", "guess"),
    [
        ("role:trian", "role:trian", "role:train"),  # a typo of a role labctl knows
        ("role:cahce", "role:cahce", "role:cache"),  # of one the lab has
        ("stor", "stor", "store"),  # of a host name
        ("role:train,m6", "m6", None),  # a host the inventory lacks, beside a lacking role
        ("role:gpubox", "role:gpubox", None),  # a role neither the lab nor labctl has
    ],
)
def test_a_selector_that_is_a_mistake_stays_an_error_with_did_you_mean(
    tmp_path: Path, expr: str, term: str, guess: str | None
) -> None:
    inv = inventory(tmp_path)
    with pytest.raises(InputError) as err:
        select_in_lab(inv, expr)
    assert err.value.message.startswith(f"'{term}' matches no host in {inv.path}.")
    assert (
        (f"Did you mean '{guess}'?" in err.value.message)
        if guess
        else "Did you mean" not in err.value.message
    )


def test_limit_on_the_command_line_is_still_strict(tmp_path: Path) -> None:
    """--limit names hosts for this run: a role no host has selects nothing, so it is refused."""
    with pytest.raises(InputError, match="'role:train' matches no host"):
        select_hosts(inventory(tmp_path), "role:train")


def test_every_role_labctl_selects_by_is_a_known_role() -> None:
    """The roles of the shipped playbooks, the default phase and orchestra hosts and the seed
    inventory: a lab lacking any of them skips, it is not told it made a typo."""
    used = set(re.findall(r"role:(\w+)", Settings.model_fields["hosts"].default))
    used |= set(re.findall(r"role:(\w+)", Orchestra.model_fields["hosts"].default))
    for folder in (REPO / "playbooks", REPO / "labctl" / "data" / "playbooks"):
        for p in folder.glob("*.yaml"):
            used |= set(re.findall(r"hosts:\s*['\"]?[^#\n]*?role:(\w+)", p.read_text()))
    for h in yaml.safe_load((REPO / "labctl" / "data" / "lab.yaml").read_text())["hosts"].values():
        used |= set(h.get("roles") or [])
    assert {"train", "inference", "cache", "sandbox"} <= used
    assert used <= set(KNOWN_ROLES)


# --- provision ------------------------------------------------------------------------------


def test_the_seed_playbook_skips_the_train_play_in_a_lab_without_a_trainer(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    book = load_playbook(REPO / "playbooks" / "provision.yaml")
    assert play_members(book, inv) == [{"cache", "store"}, {"cache"}, set()]
    [skipped] = skipped_plays(book, inv)
    assert (skipped["play"], skipped["hosts"], skipped["reason"]) == (
        2,
        "role:train",
        "no host has role train",
    )
    assert skipped["line"] == book.plays[2].line


def test_a_mistyped_role_in_a_playbook_is_still_an_error_naming_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "book.yaml"
    p.write_text(
        textwrap.dedent(
            """\
            plays:
              - hosts: role:trian
                resources: [{file: {path: /x, content: y}}]
            """
        )
    )
    with pytest.raises(DocumentError) as err:
        skipped_plays(load_playbook(p), inventory(tmp_path))
    assert f"{p}:2: plays[0].hosts: 'role:trian' matches no host" in err.value.message
    assert "Did you mean 'role:train'?" in err.value.message


def test_provision_check_of_a_playbook_whose_only_play_is_skipped_exits_0_and_says_so(tmp_path: Path) -> None:
    """Every play skipped: no host is contacted, and the answer says why."""
    inventory(tmp_path)
    proc = run_cli(
        "--json", "-i", str(tmp_path / "lab.yaml"), "provision", "--check", "-p", "playbooks/sandbox.yaml"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert [p["reason"] for p in doc["skipped_plays"]] == ["no host has role sandbox"]
    assert doc["results"] == [] and doc["hosts"] == []
    human = run_cli("-i", str(tmp_path / "lab.yaml"), "provision", "--check", "-p", "playbooks/sandbox.yaml")
    assert human.returncode == 0 and "skipped play 1" in human.stderr
    assert "(playbooks/sandbox.yaml:7): no host has role sandbox" in human.stderr


# --- train and the orchestra ----------------------------------------------------------------


def test_train_in_a_lab_without_a_trainer_names_the_precondition(tmp_path: Path) -> None:
    inventory(tmp_path)
    proc = run_cli("--json", "-i", str(tmp_path / "lab.yaml"), "train", "--phase", "1", "--dry-run")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert (
        doc["error"]
        == f"Phase 1 trains on 'role:train', and no host has role train in {tmp_path / 'lab.yaml'}."
    )
    assert "roles: [train]" in doc["hint"] and "Traceback" not in proc.stderr


def test_the_orchestra_in_a_lab_without_an_inference_host_names_the_precondition(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    with pytest.raises(InputError) as err:
        require_role_hosts(inv, "role:inference", "The orchestra serves")
    assert (
        err.value.message
        == f"The orchestra serves on 'role:inference', and no host has role inference in {inv.path}."
    )
    proc = run_cli("--json", "-i", str(inv.path), "orchestra", "plan", "--offline")
    assert proc.returncode == 2 and "no host has role inference" in json.loads(proc.stdout)["error"]


def test_the_orchestra_plans_in_a_lab_without_a_trainer(tmp_path: Path) -> None:
    """The shipped train.yaml's `hosts: role:train` matches no host here: training keeps no GPU,
    and the orchestra has all four."""
    inv = inventory(tmp_path, SERVE_ONLY)
    proc = run_cli("--json", "-i", str(inv.path), "orchestra", "plan", "--offline")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    placed = json.loads(proc.stdout)["placement"]
    assert len(placed) == 5 and {p["gpu"] for p in placed} == {0, 1, 2, 3}
