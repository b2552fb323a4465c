"""The `file` resource plans what the agent applies, at any size: one comparison on both sides."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from labctl.agent.core.fsutil import MAX_CONTENT
from labctl.agent.provision.commands import apply_command, probe_command
from labctl.documents.validation import DocumentError
from labctl.inventory.model import Host
from labctl.provision.playbook import load_playbook
from labctl.provision.resource import Resource
from labctl.provision.resources.files import File, plan_file


def host() -> Host:
    return Host(name="m5", address="10.0.0.1")


def converge(res: Resource) -> int:
    """Plan from the agent's real probe, apply through the agent's real ops, until nothing is
    planned: how many applies that took."""
    for applied in range(3):
        change = res.plan(probe_command({"probes": res.probes()})["results"])
        if not change.changed:
            return applied
        apply_command({"ops": change.ops})
    raise AssertionError(f"{res.label()} still plans after 3 applies: {change.summary}")


BIG = "".join(f"row {i:07d} of a generated table\n" for i in range(40_000))


def test_a_file_over_1_mib_is_applied_once_then_plans_nothing(tmp_path: Path) -> None:
    assert len(BIG.encode()) > MAX_CONTENT
    path = tmp_path / "table.txt"
    res = File.from_playbook(host(), {"path": str(path), "content": BIG, "mode": "0640"})
    assert converge(res) == 1
    assert path.read_text() == BIG

    path.write_text(BIG.replace("row 0000007", "row 7777777"))
    assert converge(res) == 1
    assert path.read_text() == BIG


def test_a_templated_file_over_1_mib_converges(tmp_path: Path) -> None:
    path = tmp_path / "hosts.txt"
    res = File.from_playbook(host(), {"path": str(path), "content": "host $name\n" + BIG, "template": True})
    assert converge(res) == 1
    assert path.read_text().startswith("host m5\nrow 0000000")


def test_the_diff_of_a_large_file_says_it_differs_without_printing_it(tmp_path: Path) -> None:
    path = tmp_path / "table.txt"
    path.write_text(BIG[:-10])
    st = probe_command({"probes": {"f": {"kind": "file", "path": str(path)}}})["results"]["f"]
    assert "text" not in st and st["sha256"]
    change = plan_file(str(path), BIG, st)
    assert change.summary == [f"update {path}"]
    (diff,) = change.diffs
    assert len(diff) < 500 and "content differs" in diff and f"{len(BIG)} bytes planned" in diff

    # Same bytes: nothing planned, whatever the size (the probe's sha256 is what is compared).
    assert not plan_file(str(path), BIG[:-10], st).changed
    assert st["sha256"] == hashlib.sha256(BIG[:-10].encode()).hexdigest()


def test_a_small_file_still_shows_its_diff(tmp_path: Path) -> None:
    path = tmp_path / "motd"
    path.write_text("hello\u2028world\nbye\n")
    st = probe_command({"probes": {"f": {"kind": "file", "path": str(path)}}})["results"]["f"]
    (diff,) = plan_file(str(path), "hello\u2028world\nsee you\n", st).diffs
    # A line holding U+2028 is one line in the diff, as in the file.
    assert "\n hello\u2028world\n-bye\n+see you\n" in diff


@pytest.mark.parametrize(
    ("resource", "field"),
    [
        ('file: {path: /etc/motd, content: "hi \\ud800"}', "content"),
        ('line: {path: /etc/x, line: "a\\udfff"}', "line"),
    ],
)
def test_text_no_utf8_file_can_hold_is_refused_in_the_playbook(
    tmp_path: Path, resource: str, field: str
) -> None:
    book = tmp_path / "book.yaml"
    book.write_text(f"plays:\n  - hosts: all\n    resources:\n      - {resource}\n")
    with pytest.raises(DocumentError) as err:
        load_playbook(book)
    assert err.value.exit_code == 2
    assert f"{field} holds" in err.value.message and "UTF-16" in err.value.message, err.value.message
