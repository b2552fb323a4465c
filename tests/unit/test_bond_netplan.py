"""labctl/agent/network/netplan.py against the real netplan (netplan.io): a copy of the host's
netplan files with the new ones laid over them, judged by `netplan generate`, and members that
the merged config still gives something of their own, read back with `netplan get`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.agent.network.netplan import (
    check_files,
    member_conflicts,
    netplan_binary,
    netplan_problems,
    parse_netplan_yaml,
)
from labctl.inventory.model import Bond
from labctl.network.bond_render import bond_file, render_bond

BOND = Bond(name="bond0", mode="802.3ad", interfaces=["eno1", "eno2"], address="192.168.1.10/24")  # type: ignore[arg-type]
FILE = bond_file(BOND)
TEXT = render_bond(BOND, "m5")


def host_dir(tmp_path: Path, files: dict[str, str]) -> str:
    """A host's /etc/netplan as a folder of real files."""
    d = tmp_path / "etc-netplan"
    d.mkdir()
    for name, text in files.items():
        (d / name).write_text(text)
        (d / name).chmod(0o600)
    return str(d)


def snapshot(d: str) -> dict[str, tuple[str, int]]:
    return {n: (Path(d, n).read_text(), os.stat(Path(d, n)).st_mode) for n in sorted(os.listdir(d))}


def conflicts(tmp_path: Path, files: dict[str, str], **kw: Any) -> list[str]:
    return member_conflicts(
        {FILE: TEXT}, BOND.interfaces, etc_dir=host_dir(tmp_path, files), other_dirs=(), **kw
    )


def test_a_member_keeping_an_address_from_another_file_is_named(tmp_path: Path) -> None:
    # netplan merges files: the address of eno2 in the distribution's file survives ours.
    cloud = "network:\n  version: 2\n  ethernets:\n    eno2:\n      addresses: [10.0.0.5/24]\n"
    found = conflicts(tmp_path, {"50-cloud-init.yaml": cloud})
    assert len(found) == 1
    assert "eno2" in found[0] and "10.0.0.5/24" in found[0] and "/etc/netplan/50-cloud-init.yaml" in found[0]


def test_dhcp_from_an_earlier_file_is_overridden_by_ours_and_not_reported(tmp_path: Path) -> None:
    early = "network:\n  version: 2\n  ethernets:\n    eno1: {dhcp4: true, dhcp6: true}\n"
    assert conflicts(tmp_path, {"50-cloud-init.yaml": early}) == []


def test_dhcp_from_a_later_file_wins_over_ours_and_is_reported(tmp_path: Path) -> None:
    late = "network:\n  version: 2\n  ethernets:\n    eno1: {dhcp4: true}\n"
    found = conflicts(tmp_path, {"99-local.yaml": late})
    assert len(found) == 1
    assert "eno1" in found[0] and "dhcp4: true" in found[0] and "99-local.yaml" in found[0]


def test_definitions_that_match_a_member_by_name_glob_mac_or_set_name(tmp_path: Path) -> None:
    other = (
        "network:\n  version: 2\n  ethernets:\n"
        "    all-en:\n      match: {name: 'eno*'}\n      dhcp6: true\n"
        "    by-mac:\n      match: {macaddress: 'AA:BB:CC:DD:EE:02'}\n      addresses: [10.9.0.2/24]\n"
        "    renamed:\n      match: {macaddress: 'aa:bb:cc:dd:ee:99'}\n      set-name: eno1\n"
        "      routes: [{to: 10.8.0.0/16, via: 10.9.0.1}]\n"
        "    elsewhere:\n      match: {name: 'eth*'}\n      dhcp4: true\n"
    )
    ids = {
        "eno1": {"mac": "aa:bb:cc:dd:ee:01", "driver": "igb"},
        "eno2": {"mac": "aa:bb:cc:dd:ee:02", "driver": "igb"},
    }
    found = conflicts(tmp_path, {"60-other.yaml": other}, nic_ids=ids)
    text = "\n".join(found)
    assert "eno1 (as all-en) still has dhcp6: true" in text
    assert "eno2 (as all-en) still has dhcp6: true" in text
    assert "eno2 (as by-mac) still has address 10.9.0.2/24" in text
    assert "eno1 (as renamed) still has routes" in text
    assert "elsewhere" not in text
    assert len(found) == 4


def test_a_vlan_over_a_member_is_named(tmp_path: Path) -> None:
    vlan = (
        "network:\n  version: 2\n  ethernets: {eno1: {}}\n"
        "  vlans:\n    vlan5: {id: 5, link: eno1, addresses: [10.5.0.1/24]}\n"
    )
    found = conflicts(tmp_path, {"60-vlan.yaml": vlan})
    assert len(found) == 1 and "VLAN vlan5" in found[0] and "eno1" in found[0]


def test_a_clean_host_has_no_conflicts_and_nothing_changes_there(tmp_path: Path) -> None:
    other = "network:\n  version: 2\n  ethernets:\n    eth0: {addresses: [10.0.0.9/24]}\n"
    d = host_dir(tmp_path, {"01-mgmt.yaml": other})
    before = snapshot(d)
    assert netplan_problems({FILE: TEXT}, BOND.interfaces, etc_dir=d, other_dirs=()) == []
    assert snapshot(d) == before  # checked in a copy: the host's folder is untouched


def test_a_member_in_a_bridge_of_another_file_is_refused_by_netplan(tmp_path: Path) -> None:
    bridge = "network:\n  version: 2\n  ethernets: {eno1: {}}\n  bridges:\n    br0: {interfaces: [eno1], dhcp4: true}\n"
    d = host_dir(tmp_path, {"60-br.yaml": bridge})
    message = check_files({FILE: TEXT}, etc_dir=d)
    assert message is not None and "already assigned to bridge br0" in message
    assert "/etc/netplan/90-labctl-bond0.yaml" in message
    # netplan_problems stops at netplan's refusal: the merged config it would read does not exist.
    assert netplan_problems({FILE: TEXT}, BOND.interfaces, etc_dir=d, other_dirs=()) == [message]


def test_none_removes_a_file_from_the_copy(tmp_path: Path) -> None:
    d = host_dir(tmp_path, {"90-labctl-bond0.yaml": TEXT.replace("mode: 802.3ad", "mode: nonsense")})
    assert check_files({}, etc_dir=d, other_dirs=()) is not None
    assert check_files({FILE: None}, etc_dir=d, other_dirs=()) is None
    assert check_files({FILE: TEXT}, etc_dir=d, other_dirs=()) is None  # the new text replaces it
    assert "nonsense" in Path(d, "90-labctl-bond0.yaml").read_text()


def test_files_in_run_netplan_are_read_too(tmp_path: Path) -> None:
    run = tmp_path / "run" / "netplan"
    run.mkdir(parents=True)
    (run / "10-runtime.yaml").write_text(
        "network:\n  version: 2\n  ethernets:\n    eno1: {addresses: [10.7.0.1/24]}\n"
    )
    found = member_conflicts(
        {FILE: TEXT}, BOND.interfaces, etc_dir=host_dir(tmp_path, {}), other_dirs=(str(run),)
    )
    assert len(found) == 1 and "10.7.0.1/24" in found[0]


def test_a_vlan_over_an_undefined_member_gives_netplans_message_not_a_traceback(tmp_path: Path) -> None:
    vlan = "network:\n  version: 2\n  vlans:\n    vlan5: {id: 5, link: eth7}\n"
    found = conflicts(tmp_path, {"60-vlan.yaml": vlan})
    assert len(found) == 1
    assert "Traceback" not in found[0]
    assert "/etc/netplan/60-vlan.yaml:4:" in found[0] and "interface 'eth7' is not defined" in found[0]


def test_a_file_outside_etc_netplan_is_refused(tmp_path: Path) -> None:
    message = check_files(
        {"/etc/systemd/network/x.yaml": TEXT}, etc_dir=host_dir(tmp_path, {}), other_dirs=()
    )
    assert message is not None and "/etc/systemd/network/x.yaml" in message and "/etc/netplan" in message


def _strings(value: Any) -> Any:
    """PyYAML types plain scalars (2 -> int); the agent's reader keeps them as netplan wrote them."""
    if isinstance(value, dict):
        return {str(k): _strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strings(v) for v in value]
    if isinstance(value, (bool, type(None))):
        return value
    return str(value)


def test_the_agents_reader_agrees_with_pyyaml_on_real_netplan_get_output(tmp_path: Path) -> None:
    rich = (
        "network:\n  version: 2\n  ethernets:\n"
        "    eth0:\n      match: {name: 'eth*', driver: [e1000, igb]}\n"
        "      addresses:\n        - 10.0.1.5/24:\n            label: 'eth0:1'\n            lifetime: 0\n"
        "        - 'fd00::5/64'\n"
        "      routes: [{to: 10.8.0.0/16, via: 10.0.1.1, metric: 50}]\n"
        "      nameservers: {addresses: [8.8.8.8], search: [a.example, b]}\n"
        "      dhcp6: yes\n      mtu: 9000\n"
        "  vlans:\n    vlan5: {id: 5, link: eth0}\n"
    )
    d = Path(host_dir(tmp_path, {"60-rich.yaml": rich, "90-labctl-bond0.yaml": TEXT}))
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    d.rename(root / "etc" / "netplan")
    netplan = netplan_binary()
    assert netplan is not None
    out = subprocess.run(
        [netplan, "get", "--root-dir", str(root), "all"], capture_output=True, text=True, check=True
    ).stdout
    assert "lifetime" in out and "bond0" in out  # the shapes this test is for are in the output
    assert parse_netplan_yaml(out) == _strings(yaml.safe_load(out))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("", None),
        ("null", None),
        ('a:\n- 1\n- x: 2\n  y: "q\\""\nb: true\n', {"a": ["1", {"x": "2", "y": 'q"'}], "b": True}),
        ('"k: 1": []\n', {"k: 1": []}),
    ],
)
def test_the_agents_reader_on_edge_shapes(text: str, value: Any) -> None:
    assert parse_netplan_yaml(text) == value


def test_the_agents_reader_refuses_what_it_does_not_understand() -> None:
    with pytest.raises(ValueError):
        parse_netplan_yaml("a:\n  b: 1\n    c: 2\n")


def test_a_snap_environment_still_checks_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # netplan's front end, when SNAP is set, asks the host's netplan service over D-Bus to
    # regenerate the live config instead of reading --root-dir: the agent must never inherit it.
    monkeypatch.setenv("SNAP", "/snap/netplan/current")
    text = TEXT.replace("mode: 802.3ad", "mode: 802.3ax")
    message = check_files({FILE: text}, etc_dir=host_dir(tmp_path, {}), other_dirs=())
    assert message is not None and "unknown bond mode '802.3ax'" in message
