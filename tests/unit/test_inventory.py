"""Inventory loading and validation: every broken file names its line and field and exits 2."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from labctl.cli.app import app
from labctl.inventory.load import InventoryError, load_inventory
from labctl.inventory.select import select_hosts
from labctl.output.errors import InputError

REPO = Path(__file__).resolve().parents[2]

GOOD = """\
lab: t
defaults:
  user: root
  port: 22
  ssh_key: keys/id
  known_hosts: keys/known_hosts
hosts:
  a:
    address: 10.0.0.1
    roles: [train, cache]
    gpus: [{model: Tesla V100, memory_gb: 32}]
    model_cache: {path: /mnt/model-cache, size_gb: 20, source: b}
  b:
    address: 10.0.0.2
    port: 2222
    roles: [storage]
    storage: {models: /srv/models}
  c:
    address: c.lab.example
    user: admin
    roles: [train]
    os: windows
"""


def write(tmp_path: Path, text: str, key: bool = True) -> Path:
    if key:
        (tmp_path / "keys").mkdir(exist_ok=True)
        (tmp_path / "keys" / "id").write_text("not really a key")
    p = tmp_path / "inv.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_good_inventory_merges_defaults_and_resolves_paths(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, GOOD))
    a, b, c = inv.hosts["a"], inv.hosts["b"], inv.hosts["c"]
    assert (a.user, a.port) == ("root", 22)
    assert (b.port, c.user) == (2222, "admin")  # the host's own keys win
    assert a.ssh_key == tmp_path / "keys" / "id"  # relative to the inventory file
    assert b.known_hosts == tmp_path / "keys" / "known_hosts"
    assert c.is_windows and not a.is_windows
    assert a.gpus[0].count == 1 and a.gpu_count == 1
    assert inv.roles() == ["train", "cache", "storage"]


def test_seed_lab_inventory_is_valid_and_matches_the_seed() -> None:
    inv = load_inventory(REPO / "inventory" / "lab.yaml")
    assert list(inv.hosts) == ["m5", "irina", "pharaoh", "workstation"]
    m5 = inv.hosts["m5"]
    assert m5.ram_gb == 256 and m5.gpu_count == 5
    assert {g.model: g.count for g in m5.gpus} == {"Tesla V100": 1, "Tesla P40": 4}
    assert m5.bond is not None and m5.bond.mode == "802.3ad" and m5.bond.interfaces == ["eno1", "eno2"]
    assert m5.model_cache is not None and m5.model_cache.source == "irina"
    assert inv.hosts["irina"].storage is not None
    assert inv.hosts["workstation"].is_windows
    total_vram = sum(g.memory_gb * g.count for h in inv.hosts.values() for g in h.gpus)
    assert total_vram == 156  # seed 000: 156 GB of VRAM across the lab


# (name, text, expected line, expected field, words the message must contain)
BROKEN = [
    ("yaml syntax", "lab: t\nhosts:\n  a: {address: 10.0.0.1\n", None, None, ["does not parse"]),
    (
        "unknown host key",
        GOOD.replace("    roles: [storage]", "    rolez: [storage]"),
        16,
        "hosts.b.rolez",
        ["unknown key 'rolez'", "Did you mean 'roles'"],
    ),
    ("unknown top key", "labb: t\n" + GOOD.split("\n", 1)[1], 1, "labb", ["unknown key 'labb'", "'lab'"]),
    (
        "unknown default key",
        GOOD.replace("  port: 22\n", "  prot: 22\n", 1),
        4,
        "defaults.prot",
        ["Did you mean 'port'"],
    ),
    (
        "wrong type",
        GOOD.replace("memory_gb: 32", "memory_gb: lots"),
        11,
        "hosts.a.gpus[0].memory_gb",
        ["valid number", "memory_gb: 32"],
    ),
    ("bad port", GOOD.replace("port: 2222", "port: 70000"), 15, "hosts.b.port", ["65535"]),
    (
        "bad address",
        GOOD.replace("10.0.0.2", "10.0.0.300"),
        14,
        "hosts.b.address",
        ["not an IP address or a host name"],
    ),
    ("duplicate host", GOOD + "  a:\n    address: 10.0.0.9\n", 23, "hosts.a", ["appears twice", "line 8"]),
    (
        "missing address",
        GOOD.replace("    address: c.lab.example\n", ""),
        18,
        "hosts.c.address",
        ["required"],
    ),
    ("missing key file", GOOD, 5, "defaults.ssh_key", ["does not exist", "ssh-keygen"]),
    (
        "unknown cache source",
        GOOD.replace("source: b", "source: zz"),
        12,
        "hosts.a.model_cache.source",
        ["'zz' is not a host"],
    ),
    (
        "source without storage",
        GOOD.replace("source: b", "source: c"),
        12,
        "hosts.a.model_cache.source",
        ["no 'storage'"],
    ),
    (
        "relative cache path",
        GOOD.replace("path: /mnt/model-cache", "path: mnt/cache"),
        12,
        "hosts.a.model_cache.path",
        ["absolute"],
    ),
    (
        "bad connection",
        GOOD.replace("  user: root\n", "  user: root\n  connection: telnet\n", 1),
        4,
        "defaults.connection",
        ["ssh", "local"],
    ),
    ("no hosts", "lab: t\nhosts: {}\n", 2, "hosts", ["at least one host"]),
    ("host not a mapping", "lab: t\nhosts:\n  a: 10.0.0.1\n", 3, "hosts.a", ["must be a mapping"]),
    (
        "duplicate address",
        GOOD.replace("10.0.0.2\n    port: 2222", "10.0.0.1\n    port: 22"),
        14,
        "hosts.b.address",
        ["already host 'a'"],
    ),
    (
        "bad gpu count",
        GOOD.replace("memory_gb: 32}", "memory_gb: 32, count: 0}"),
        11,
        "hosts.a.gpus[0].count",
        ["greater than or equal to 1"],
    ),
    (
        "bond too small",
        GOOD.replace("    roles: [storage]", "    roles: [storage]\n    bond: {interfaces: [eno1]}"),
        17,
        "hosts.b.bond.interfaces",
        ["at least 2"],
    ),
    (
        "bond over unknown nic",
        GOOD.replace(
            "    roles: [storage]",
            "    roles: [storage]\n    nics: [{name: eno1}, {name: eno2}]\n    bond: {interfaces: [eno1, eth9]}",
        ),
        18,
        "hosts.b.bond.interfaces[1]",
        ["'eth9' is not one of this host's nics"],
    ),
    ("bad role", GOOD.replace("[train, cache]", "[Train Server]"), 10, "hosts.a.roles", ["lower case"]),
]


@pytest.mark.parametrize(("name", "text", "line", "field", "words"), BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_inventory_names_line_and_field(
    tmp_path: Path, name: str, text: str, line: int | None, field: str | None, words: list[str]
) -> None:
    path = write(tmp_path, text, key=name != "missing key file")
    with pytest.raises(InputError) as err:
        load_inventory(path)
    e = err.value
    assert e.exit_code == 2
    msg = e.paragraph()
    if line is not None:
        assert f"{path}:{line}: {field}:" in msg, msg
    for w in words:
        assert w in msg, msg


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    text = (
        GOOD.replace("rolez", "roles")
        .replace("port: 2222", "port: 0")
        .replace("memory_gb: 32", "memory_gb: -1")
    )
    with pytest.raises(InventoryError) as err:
        load_inventory(write(tmp_path, text))
    assert len(err.value.problems) == 2


def test_missing_file_is_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="No inventory at"):
        load_inventory(tmp_path / "nope.yaml")


def test_cli_validate_exit_codes_and_no_traceback(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = write(tmp_path, GOOD.replace("roles: [storage]", "rolez: [storage]"))
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", "-i", str(bad), "inventory", "validate"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"{bad}:16: hosts.b.rolez" in proc.stderr
    assert proc.stdout == ""
    good = write(tmp_path, GOOD)
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", "inventory", "validate", "-i", str(good), "--json"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    import json

    assert json.loads(proc.stdout)["hosts"] == ["a", "b", "c"]


def test_cli_json_error_goes_to_stdout(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    bad = write(tmp_path, "lab: [")
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", "inventory", "show", "-i", str(bad), "--json"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    assert doc["exit_code"] == 2 and "does not parse" in doc["error"]


def test_inventory_show_table_lists_every_host() -> None:
    result = CliRunner().invoke(
        app, ["inventory", "show", "-i", str(REPO / "inventory" / "lab.yaml")], env={"COLUMNS": "250"}
    )
    assert result.exit_code == 0, result.output
    for name in ("m5", "irina", "pharaoh", "workstation", "Tesla P40", "802.3ad"):
        assert name in result.output


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (None, ["a", "b", "c"]),
        ("all", ["a", "b", "c"]),
        ("b", ["b"]),
        ("c,a", ["a", "c"]),
        ("role:train", ["a", "c"]),
        ("role:train,!c", ["a"]),
        ("!b", ["a", "c"]),
        ("[ab]", ["a", "b"]),
        ("all,!b", ["a", "c"]),
    ],
)
def test_limit_selection(tmp_path: Path, limit: str | None, expected: list[str]) -> None:
    inv = load_inventory(write(tmp_path, GOOD))
    assert [h.name for h in select_hosts(inv, limit)] == expected


@pytest.mark.parametrize("limit", ["zz", "role:nothing", "a,typo"])
def test_limit_that_matches_nothing_is_an_input_error(tmp_path: Path, limit: str) -> None:
    inv = load_inventory(write(tmp_path, GOOD))
    with pytest.raises(InputError, match="matches no host") as err:
        select_hosts(inv, limit)
    assert "role:NAME" in err.value.hint
