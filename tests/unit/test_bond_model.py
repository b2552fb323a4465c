"""The inventory's `bond`: DNS, search domains and switch ports, and the bonds that could
only lock a host out (a gateway it cannot reach, a NIC listed twice) refused with file, line
and field, exit 2."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from labctl.inventory.load import load_inventory
from labctl.output.errors import InputError

INV = """\
lab: t
defaults:
  ssh_key: keys/id
hosts:
  m5:
    address: 192.168.1.10
    bond:
      name: bond0
      address: 192.168.1.10/24
{extra}
"""


def load(tmp_path: Path, extra: str, interfaces: str = "[eno1, eno2]") -> object:
    (tmp_path / "keys").mkdir(exist_ok=True)
    (tmp_path / "keys" / "id").write_text("not really a key")
    p = tmp_path / "inv.yaml"
    extra = f"interfaces: {interfaces}\n" + textwrap.dedent(extra)
    p.write_text(INV.format(extra=textwrap.indent(extra, "      ")))
    return load_inventory(p)


def test_dns_search_and_switch_ports(tmp_path: Path) -> None:
    inv = load(
        tmp_path,
        """\
        gateway: 192.168.1.1
        dns: [192.168.1.1, 1.1.1.1]
        search: [lab, lab.example]
        switch_ports: [1, "gi1/0/2"]
        """,
    )
    bond = inv.hosts["m5"].bond  # type: ignore[attr-defined]
    assert [str(a) for a in bond.dns] == ["192.168.1.1", "1.1.1.1"]
    assert bond.search == ["lab", "lab.example"]
    assert bond.switch_ports == [1, "gi1/0/2"]


def test_defaults_are_empty(tmp_path: Path) -> None:
    bond = load(tmp_path, "").hosts["m5"].bond  # type: ignore[attr-defined]
    assert (bond.dns, bond.search, bond.switch_ports) == ([], [], [])


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ("gateway: 10.0.0.1", "hosts.m5.bond", ["outside the bond's subnet 192.168.1.0/24"]),
        ("dns: [not-an-ip]", "hosts.m5.bond.dns[0]", ["IPv4"]),
        ("search: [bad_domain]", "hosts.m5.bond.search[0]", ["not a domain name"]),
        ("switch_ports: [yes]", "hosts.m5.bond.switch_ports[0]", ["not a switch port"]),
        ("switch_ports: [gi 1]", "hosts.m5.bond.switch_ports[0]", ["not a switch port name"]),
    ],
)
def test_bad_bond_names_the_field(tmp_path: Path, extra: str, field: str, words: list[str]) -> None:
    with pytest.raises(InputError) as err:
        load(tmp_path, extra)
    assert err.value.exit_code == 2
    msg = err.value.paragraph()
    assert f"{field}:" in msg, msg
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize(
    ("interfaces", "words"),
    [("[eno1, eno1]", "lists a NIC twice"), ("[bond0, eno1]", "cannot be one of its own interfaces")],
)
def test_a_nic_twice_and_the_bond_as_its_own_member(tmp_path: Path, interfaces: str, words: str) -> None:
    with pytest.raises(InputError) as err:
        load(tmp_path, "", interfaces)
    assert "hosts.m5.bond:" in err.value.paragraph() and words in err.value.paragraph()
