"""Input that must be refused (issue 11, items 8-13): exit 2 with the file, line and field,
before any host is touched."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from labctl.cli.app import app
from labctl.documents.validation import DocumentError
from labctl.inventory.load import InventoryError, load_inventory
from labctl.inventory.model import Host, ModelCache
from labctl.inventory.select import select_hosts
from labctl.output.errors import InputError
from labctl.provision import playbook
from labctl.provision.resources import model_cache
from labctl.provision.resources.cron import CronParams, cron_file, systemd_units
from labctl.provision.resources.files import FileParams
from labctl.provision.resources.model_cache import GIB, edit_fstab, fstab_entry
from labctl.provision.resources.model_cache import ModelCache as ModelCacheRes
from labctl.train.phases import load_phases

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
    code, out = run_cli("cache", "sync", "tinylm-1g", "-i", inv_path, "--host", "nosuch")
    assert code == 2 and "--host 'nosuch' matches no host" in out and "--limit" not in out, out


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


# -- 8: paths that end up in system files --------------------------------------------------

INJECT = "/mnt/c\\ntmpfs /etc tmpfs size=1G 0 0\\n#"  # a YAML double-quoted newline


@pytest.mark.parametrize(
    ("path", "words"),
    [
        (f'"{INJECT}"', "control character"),
        ("mnt/model-cache", "not an absolute path"),
        ("/mnt/../etc", "goes up with '..'"),
        ("/usr/share", "system folder"),
        ("/", "system folder"),
        ("/mnt", "system folder"),
        ("/var/lib/labctl/cache", "system folder"),
    ],
)
def test_a_cache_path_that_would_break_fstab_or_hide_a_system_folder_is_refused(
    tmp_path: Path, path: str, words: str
) -> None:
    with pytest.raises(InventoryError, match=words) as err:
        load_inventory(write(tmp_path, INV.replace("path: /mnt/model-cache", f"path: {path}")))
    assert "inv.yaml:7: hosts.a.model_cache.path" in err.value.message
    book = write(
        tmp_path, f"plays:\n  - hosts: a\n    resources:\n      - model_cache: {{path: {path}}}\n", "p.yaml"
    )
    with pytest.raises(DocumentError, match=words) as doc_err:
        playbook.load_playbook(book)
    assert "p.yaml:4: plays[0].resources[0].model_cache.path" in doc_err.value.message


@pytest.mark.parametrize(
    ("resource", "field"),
    [
        ('file: {path: "/etc/x\\ny", content: x}', "file.path"),
        ('line: {path: "/etc/x\\ny", line: x}', "line.path"),
        ("file: {path: etc/motd, content: x}", "file.path"),
        ('line: {path: /etc/x, line: "a\\rb"}', "line"),
        ("torch_env: {path: venvs/torch}", "torch_env.path"),
        ('package: {names: ["rsync\\n"]}', "package.names"),  # goes into the dpkg-query probe's shell line
        ('cron: {name: "x\\n", state: absent}', "cron.name"),
        ('torch_env: {path: "/opt/t\\n"}', "torch_env.path"),
    ],
)
def test_every_path_a_playbook_writes_is_checked(tmp_path: Path, resource: str, field: str) -> None:
    book = write(tmp_path, f"plays:\n  - hosts: all\n    resources:\n      - {resource}\n", "p.yaml")
    with pytest.raises(DocumentError) as err:
        playbook.load_playbook(book)
    assert f"p.yaml:4: plays[0].resources[0].{field}" in err.value.message


def test_inventory_storage_and_disk_paths_are_checked(tmp_path: Path) -> None:
    text = INV.replace("storage: {models: /srv/models}", 'storage: {models: "srv/models"}')
    with pytest.raises(
        InventoryError, match=re.escape("hosts.b.storage.models: 'srv/models' is not an absolute path")
    ):
        load_inventory(write(tmp_path, text))


@pytest.mark.parametrize("name", ['"eno1\\nmtu: 9000"', '"eth 0"', "an-interface-name-too-long", "'..'"])
def test_an_interface_name_netplan_would_misread_is_refused(tmp_path: Path, name: str) -> None:
    text = INV.replace(
        "    roles: [storage]\n", f"    roles: [storage]\n    nics: [{{name: {name}}}, {{name: eno2}}]\n"
    )
    with pytest.raises(InventoryError, match="is not an interface name") as err:
        load_inventory(write(tmp_path, text))
    assert "inv.yaml:12: hosts.b.nics[0].name" in err.value.message


def test_a_path_is_normalised_and_a_space_is_escaped_in_fstab() -> None:
    mc = ModelCache(path="/mnt/model cache//", size_gb=2)
    assert mc.path == "/mnt/model cache"
    res = ModelCacheRes.from_playbook(Host(name="a", address="10.0.0.1", model_cache=mc), {})
    state = {
        "mount": {"mounted": False},
        "mem": {"total_bytes": 32 * GIB},
        "fstab": {"exists": True, "text": "UUID=abc / ext4 defaults 0 1\n", "mode": 0o644},
        "manifest": {"exists": False},
    }
    change = res.plan(state)
    fstab = next(op["text"] for op in change.ops if op.get("path") == "/etc/fstab")
    assert "tmpfs /mnt/model\\040cache tmpfs size=2G,mode=0755,nosuid,nodev 0 0" in fstab.splitlines()
    assert model_cache.fstab_unescape("/mnt/model\\040cache") == "/mnt/model cache"
    # The escaped entry is recognised as ours: planning again over it changes nothing in fstab.
    assert edit_fstab(fstab, "/mnt/model cache", fstab.splitlines()[-1]) == fstab


# -- 9: cron entries ------------------------------------------------------------------------


def test_a_percent_sign_is_escaped_for_cron_and_for_systemd() -> None:
    p = CronParams(name="stamp", schedule="* * * * *", command="date +%F > /tmp/$USER")
    line = cron_file(p).splitlines()[-1]
    assert "date +\\%F" in line and "%" not in line.replace("\\%", "")
    service, _ = systemd_units(p)
    assert "date +%%F" in service and "$$USER" in service


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ({"command": "true\n* * * * * root rm -rf /"}, "control character"),
        ({"command": "   "}, "empty"),
        ({"user": "root\n* * * * * root evil"}, "not a user name"),
        ({"user": "two words"}, "not a user name"),
        ({"schedule": "*/0 * * * *"}, "the step 0 must be 1-59"),
        ({"schedule": "5/10 * * * *"}, "a step needs \\* or a range"),
        ({"schedule": "* * * jan *"}, "write numbers, not names"),
        ({"schedule": "30-10 * * * *"}, "runs backwards"),
        ({"schedule": "* * 32 * *"}, "32 is outside 1-31"),
        ({"schedule": "* * * * *\n"}, "control character"),
        ({"schedule": "* * * * */2"}, "no systemd equivalent.*backend: cron"),
    ],
)
def test_a_cron_entry_that_cron_would_misread_is_refused(override: dict[str, str], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        CronParams(**{"name": "j", "schedule": "0 * * * *", "command": "true", **override})


def test_a_schedule_is_written_as_five_plain_fields() -> None:
    assert CronParams(name="j", schedule=" 0  */4 * * *", command="true").schedule == "0 */4 * * *"
    assert CronParams(name="j", schedule="* * * * */2", command="true", backend="cron").schedule


# -- 10: file modes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "mode"),
    [
        ("600", 0o600),
        ("644", 0o644),
        ("0644", 0o644),
        ('"0644"', 0o644),
        ('"755"', 0o755),
        ('"0o700"', 0o700),
        ("1777", 0o1777),
    ],
)
def test_a_mode_is_read_as_the_octal_it_looks_like(tmp_path: Path, written: str, mode: int) -> None:
    book = write(
        tmp_path,
        f"plays:\n  - hosts: all\n    resources:\n      - file: {{path: /etc/x, content: x, mode: {written}}}\n",
        "p.yaml",
    )
    entry = playbook.load_playbook(book).plays[0].entries[0]
    assert FileParams.model_validate(entry.params).mode == mode


@pytest.mark.parametrize("written", ["4095", "99999999999999999999", "8", '"u=rw"', '"0999"', "true", "-1"])
def test_a_mode_that_is_not_octal_is_refused_before_any_host(tmp_path: Path, written: str) -> None:
    for resource in (
        "file: {path: /etc/x, content: x, mode: %s}",
        "line: {path: /etc/x, line: x, mode: %s}",
        "model_cache: {path: /mnt/c, size_gb: 1, mode: %s}",
    ):
        book = write(
            tmp_path, "plays:\n  - hosts: all\n    resources:\n      - " + resource % written + "\n", "p.yaml"
        )
        with pytest.raises(DocumentError, match="mode") as err:
            playbook.load_playbook(book)
        assert "p.yaml:4: plays[0].resources[0]." in err.value.message


# -- 11: YAML alias bombs -------------------------------------------------------------------

BOMB = """\
a: &a [x, x, x, x, x, x, x, x, x, x]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


@pytest.mark.parametrize("kind", ["inventory", "playbook", "phases"])
def test_an_alias_bomb_is_refused_with_its_line(tmp_path: Path, kind: str) -> None:
    path = write(tmp_path, BOMB, f"{kind}.yaml")
    load = {"inventory": load_inventory, "playbook": playbook.load_playbook, "phases": load_phases}[kind]
    with pytest.raises(InputError, match="expands to more than 100,000 values") as err:
        load(path)
    assert f"{kind}.yaml:5:" in err.value.message  # e's list, whose *d aliases pass the bound


def test_a_few_aliases_still_work(tmp_path: Path) -> None:
    text = INV.replace("  a:\n", "  a: &a_host\n") + "  c:\n    <<: *a_host\n    address: 10.0.0.3\n"
    inv = load_inventory(write(tmp_path, text))
    assert inv.hosts["c"].roles == ["train", "cache"] and inv.hosts["c"].address == "10.0.0.3"


def test_nesting_too_deep_or_a_list_as_a_key_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="nested too deeply"):
        load_inventory(write(tmp_path, "lab: " + "[" * 5000 + "]" * 5000 + "\n"))
    with pytest.raises(InputError, match="a key here is a list or a mapping"):
        load_inventory(write(tmp_path, "lab: t\n? [a, b]\n: 1\n"))


# -- 12: numbers that mean nothing ----------------------------------------------------------


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", ".NaN"])
def test_inf_and_nan_are_refused_anywhere_in_a_document(tmp_path: Path, value: str) -> None:
    with pytest.raises(InputError, match=f"inv.yaml:7:.*{re.escape(value)} is not a number"):
        load_inventory(write(tmp_path, INV.replace("size_gb: 2", f"size_gb: {value}")))
    with pytest.raises(InputError, match="is not a number"):
        load_inventory(write(tmp_path, INV + f"    notes: {value}\n"))


def test_a_number_with_thousands_of_digits_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"inv.yaml:7:.*too many digits"):
        load_inventory(write(tmp_path, INV.replace("size_gb: 2", "size_gb: " + "9" * 5000)))


def test_inventory_json_never_prints_infinity(tmp_path: Path) -> None:
    inv_path = str(write(tmp_path, INV.replace("size_gb: 2", "size_gb: .inf")))
    code, out = run_cli("-i", inv_path, "--json", "inventory", "show")
    assert code == 2 and "Infinity" not in out, out


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("lr=inf", "finite number"),
        ("lr=.nan", "finite number"),
        ("steps=true", "yes/no value, not a number"),
        ("model.d_model=false", "yes/no value"),
        ("checkpoint_dir=ckpt/phase{phase}", "not an absolute path"),
    ],
)
def test_a_setting_that_means_nothing_is_refused(tmp_path: Path, setting: str, words: str) -> None:
    phases = load_phases(write(tmp_path, "phases:\n  1: {steps: 10}\n", "train.yaml"))
    with pytest.raises(InputError, match=words):
        phases.settings(1, [setting])


def test_a_relative_checkpoint_dir_in_the_phases_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DocumentError, match=re.escape("train.yaml:2: phases[1].checkpoint_dir")):
        load_phases(write(tmp_path, "phases:\n  1: {checkpoint_dir: ckpt}\n", "train.yaml"))


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf"])
def test_a_timeout_or_size_that_means_nothing_is_a_usage_error(tmp_path: Path, value: str) -> None:
    inv_path = str(write(tmp_path, INV))
    code, out = run_cli("exec", "-i", inv_path, "--timeout", value, "--", "touch", str(tmp_path / "x"))
    assert code == 2 and "not a number above 0" in out and not (tmp_path / "x").exists(), out
    code, out = run_cli("bench", "make-model", "-i", inv_path, "--size-gb", value)
    assert code == 2 and "not a number above 0" in out, out


@pytest.mark.parametrize(
    ("size_gb", "arg", "mib"), [(1.3, "1331M", 1331), (2, "2G", 2048), (0.5, "512M", 512)]
)
def test_a_fractional_cache_size_is_rounded_once_and_converges(size_gb: float, arg: str, mib: int) -> None:
    host = Host(name="a", address="10.0.0.1", model_cache=ModelCache(path="/mnt/c", size_gb=size_gb))
    res = ModelCacheRes.from_playbook(host, {"reserve_gb": 0})
    fstab = edit_fstab("", "/mnt/c", fstab_entry("/mnt/c", size_gb, 0o755))
    # What the host reports after mounting `size=<arg>`: whole MiB.
    state = {
        "mount": {"mounted": True, "fstype": "tmpfs", "size_bytes": mib << 20, "used_bytes": 0},
        "mem": {"total_bytes": 32 * GIB},
        "fstab": {"exists": True, "text": fstab, "mode": 0o644},
        "manifest": {"exists": True, "is_dir": True},
    }
    assert f"size={arg}," in fstab
    assert not res.plan(state).changed


def test_a_cache_size_under_one_mib_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="less than 1 MiB"):
        load_inventory(write(tmp_path, INV.replace("size_gb: 2", "size_gb: 0.0001")))


# -- --help shows flags as flags ------------------------------------------------------------


def commands(group: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    for name, sub in getattr(group, "commands", {}).items():
        out += commands(sub, (*prefix, name))
    return out


def test_no_help_shows_a_flag_as_taking_a_value() -> None:
    import typer

    root = typer.main.get_command(app)
    paths = commands(root)
    assert len(paths) > 15  # every group and command, the root included
    for path in paths:
        result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (path, result.output)
        assert "<bool>" not in result.output, (path, result.output)
        assert "--json" not in result.output or re.search(r"--json\s{2,}\S", result.output), path
        assert not re.search(r"--verbose\s+-v\s+<int>", result.output), (path, result.output)
