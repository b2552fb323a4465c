"""Input that must be refused (issue 11, items 8-13): exit 2 with the file, line and field,
before any host is touched."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from labctl.errors import InputError
from labctl.inventory.load import InventoryError, load_inventory
from labctl.inventory.select import select_hosts
from labctl.provision import playbook

INV = """\
lab: t
hosts:
  a:
    address: 10.0.0.1
    connection: local
    roles: [train, cache]
    model_cache: {path: /mnt/model-cache, size_gb: 2, source: b}
  b:
    address: 10.0.0.2
    connection: local
    roles: [storage]
    storage: {models: /srv/models}
"""


def write(tmp_path: Path, text: str, name: str = "inv.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def run_cli(*args: str) -> tuple[int, str]:
    """The real CLI in a subprocess: its error handler, exit code and output as a user gets them."""
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "250"},
        timeout=120,
    )
    return proc.returncode, proc.stdout + proc.stderr


# -- 13: selections that match nothing or everything ---------------------------------------


@pytest.mark.parametrize("limit", ["", " ", ",", "a,,b", "a,", "!*", "!a,!b", "role:storage,!b"])
def test_a_selection_that_names_or_leaves_no_host_is_refused(tmp_path: Path, limit: str) -> None:
    inv = load_inventory(write(tmp_path, INV))
    with pytest.raises(InputError, match=r"--limit .*(empty host term|leaves no host)"):
        select_hosts(inv, limit)


def test_an_empty_limit_on_the_command_line_exits_2_and_touches_nothing(tmp_path: Path) -> None:
    code, out = run_cli(
        "exec", "-i", str(write(tmp_path, INV)), "--limit", "", "--", "touch", str(tmp_path / "x")
    )
    assert code == 2, out
    assert "empty host term" in out and not (tmp_path / "x").exists()
    code, out = run_cli("exec", "-i", str(write(tmp_path, INV)), "--limit", "!*", "--", "true")
    assert code == 2 and "Traceback" not in out and "leaves no host" in out


def test_the_error_names_the_option_the_selection_came_from(tmp_path: Path) -> None:
    inv_path = str(write(tmp_path, INV))
    code, out = run_cli("cache", "status", "-i", inv_path, "--host", "nosuch")
    assert code == 2, out
    assert "--host 'nosuch' matches no host" in out and "--limit" not in out
    code, out = run_cli("bench", "make-model", "-i", inv_path, "--size-gb", "1", "--host", "nosuch")
    assert code == 2 and "--host 'nosuch' matches no host" in out, out


def test_a_host_name_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    text = INV + '  "c\\n":\n    address: 10.0.0.3\n'
    with pytest.raises(InventoryError, match="a host name must start"):
        load_inventory(write(tmp_path, text))
    text = INV + '  c:\n    address: 10.0.0.3\n    roles: ["train\\n"]\n'
    with pytest.raises(InventoryError, match="role"):
        load_inventory(write(tmp_path, text))


PLAYBOOK = """\
name: t
plays:
  - hosts: all
    resources:
      - file: {path: /tmp/labctl-x, content: "x"}
        tags: [motd]
"""


def test_a_tag_that_matches_no_resource_is_refused(tmp_path: Path) -> None:
    book = playbook.load_playbook(write(tmp_path, PLAYBOOK, "p.yaml"))
    playbook.check_tags(book, {"file", "motd"}, "--tags")
    with pytest.raises(InputError, match=r"--tags 'crom' matches no resource"):
        playbook.check_tags(book, {"crom", "file"}, "--tags")
    for bad in ("", ",", "file,,motd"):
        with pytest.raises(InputError, match="empty term"):
            playbook.parse_tags(bad, "--tags")
    assert playbook.parse_tags(None, "--tags") == set()


def test_provision_with_an_unknown_tag_exits_2(tmp_path: Path) -> None:
    inv_path, book = str(write(tmp_path, INV)), str(write(tmp_path, PLAYBOOK, "p.yaml"))
    code, out = run_cli("provision", "-i", inv_path, "-p", book, "--check", "--tags", "crom")
    assert code == 2 and "--tags 'crom' matches no resource" in out, out
    code, out = run_cli("provision", "-i", inv_path, "-p", book, "--check", "--skip-tags", "nosuch")
    assert code == 2 and "--skip-tags 'nosuch'" in out, out


def test_a_play_whose_hosts_is_empty_is_refused(tmp_path: Path) -> None:
    inv_path = str(write(tmp_path, INV))
    book = write(tmp_path, PLAYBOOK.replace("hosts: all", "hosts: ''"), "p.yaml")
    code, out = run_cli("provision", "-i", inv_path, "-p", str(book), "--check")
    assert code == 2 and "p.yaml:3: plays[0].hosts" in out, out
