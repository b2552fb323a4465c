"""The bond's netplan file: every mode, with and without gateway and DNS, passes the real
`netplan generate` (netplan.io, /usr/sbin/netplan; CI installs it), and only keys the kernel
uses in that mode are written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.agent.network.netplan import check_files, netplan_binary
from labctl.inventory.model import Bond
from labctl.network.bond_render import bond_file, lacp_reminder, render_bond, switch_reminder

MODES = ["802.3ad", "balance-rr", "active-backup", "balance-xor", "balance-alb", "balance-tlb"]
EXTRAS: dict[str, dict[str, Any]] = {
    "bare": {},
    "address": {"address": "192.168.1.10/24"},
    "dns": {"address": "192.168.1.10/24", "dns": ["192.168.1.1"]},
    "gateway": {"address": "192.168.1.10/24", "gateway": "192.168.1.1"},
    "gateway+dns": {
        "address": "192.168.1.10/24",
        "gateway": "192.168.1.1",
        "dns": ["192.168.1.1", "1.1.1.1"],
        "search": ["lab", "lab.example"],
    },
    "search only": {"address": "192.168.1.10/24", "search": ["lab"]},
}


def make(mode: str = "802.3ad", **extra: Any) -> Bond:
    return Bond(name="bond0", mode=mode, interfaces=["eno1", "eno2"], **extra)  # type: ignore[arg-type]


def generate(tmp_path: Path, text: str, bond: Bond) -> str | None:
    return check_files({bond_file(bond): text}, etc_dir=str(tmp_path), other_dirs=())


def test_netplan_is_installed() -> None:
    # The rendering tests below are only as good as netplan's parser: it must be the real one.
    assert netplan_binary() is not None, "install netplan.io (apt-get install netplan.io)"


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_passes_real_netplan_generate(tmp_path: Path, mode: str) -> None:
    # One netplan run per mode: each variant is its own bond over its own NICs, in its own file,
    # so netplan's message names the variant's file if one is refused.
    files: dict[str, str | None] = {}
    for i, extra in enumerate(EXTRAS.values()):
        bond = Bond(name=f"bond{i}", mode=mode, interfaces=[f"eno{2 * i}", f"eno{2 * i + 1}"], **extra)  # type: ignore[arg-type]
        files[bond_file(bond)] = text = render_bond(bond, "m5")
        spec = yaml.safe_load(text)["network"]["bonds"][bond.name]
        assert spec["interfaces"] == bond.interfaces
        assert spec["parameters"]["mode"] == mode
        assert ("addresses" in spec) == ("address" in extra)
        assert ("routes" in spec) == ("gateway" in extra)
        assert ("nameservers" in spec) == ("dns" in extra or "search" in extra)
    assert len(files) == len(EXTRAS)
    assert check_files(files, etc_dir=str(tmp_path), other_dirs=()) is None


def test_8023ad_defaults_and_the_file_in_full() -> None:
    bond = make(address="192.168.1.10/24", gateway="192.168.1.1", dns=["1.1.1.1"], search=["lab"])
    assert bond_file(bond) == "/etc/netplan/90-labctl-bond0.yaml"
    assert render_bond(bond, "m5") == (
        "# Written by labctl from the inventory's bond for host m5.\n"
        "# labctl provision replaces this file: change the inventory, not this file.\n"
        "network:\n"
        "  version: 2\n"
        "  ethernets:\n"
        "    eno1:\n"
        "      renderer: networkd\n"
        "      dhcp4: false\n"
        "      dhcp6: false\n"
        "    eno2:\n"
        "      renderer: networkd\n"
        "      dhcp4: false\n"
        "      dhcp6: false\n"
        "  bonds:\n"
        "    bond0:\n"
        "      renderer: networkd\n"
        "      interfaces:\n"
        "      - eno1\n"
        "      - eno2\n"
        "      addresses:\n"
        "      - 192.168.1.10/24\n"
        "      routes:\n"
        "      - to: default\n"
        "        via: 192.168.1.1\n"
        "      nameservers:\n"
        "        addresses:\n"
        "        - 1.1.1.1\n"
        "        search:\n"
        "        - lab\n"
        "      parameters:\n"
        "        mode: 802.3ad\n"
        "        lacp-rate: fast\n"
        "        transmit-hash-policy: layer3+4\n"
        "        mii-monitor-interval: 100\n"
    )


@pytest.mark.parametrize(
    ("mode", "keys"),
    [
        ("802.3ad", ["mode", "lacp-rate", "transmit-hash-policy", "mii-monitor-interval"]),
        ("balance-xor", ["mode", "transmit-hash-policy", "mii-monitor-interval"]),
        ("balance-tlb", ["mode", "transmit-hash-policy", "mii-monitor-interval"]),
        ("balance-rr", ["mode", "mii-monitor-interval"]),
        ("active-backup", ["mode", "mii-monitor-interval"]),
        ("balance-alb", ["mode", "mii-monitor-interval"]),
    ],
)
def test_only_the_parameters_the_mode_uses(mode: str, keys: list[str]) -> None:
    # netplan takes lacp-rate in any mode without a word; the kernel ignores it outside 802.3ad.
    params = yaml.safe_load(render_bond(make(mode), "m5"))["network"]["bonds"]["bond0"]["parameters"]
    assert list(params) == keys
    assert params["mode"] == mode


def test_inventory_settings_reach_the_file() -> None:
    bond = make(lacp_rate="slow", xmit_hash_policy="layer2+3", miimon=250)
    params = yaml.safe_load(render_bond(bond, "m5"))["network"]["bonds"]["bond0"]["parameters"]
    assert params == {
        "mode": "802.3ad",
        "lacp-rate": "slow",
        "transmit-hash-policy": "layer2+3",
        "mii-monitor-interval": 250,
    }


def test_rendering_is_deterministic() -> None:
    bond = make(address="10.0.0.5/24", gateway="10.0.0.1", dns=["10.0.0.1"])
    assert render_bond(bond, "m5") == render_bond(
        make(address="10.0.0.5/24", gateway="10.0.0.1", dns=["10.0.0.1"]), "m5"
    )


def test_a_broken_config_is_refused_with_netplans_message(tmp_path: Path) -> None:
    bond = make(address="192.168.1.10/24")
    text = render_bond(bond, "m5").replace("mode: 802.3ad", "mode: 802.3ax")
    message = generate(tmp_path, text, bond)
    assert message is not None
    assert "/etc/netplan/90-labctl-bond0.yaml" in message  # the host's path, not the temp copy
    assert "unknown bond mode '802.3ax'" in message
    assert str(tmp_path) not in message


def test_lacp_reminder_names_the_switch_ports() -> None:
    named = lacp_reminder(make(switch_ports=[1, 2]), "m5")
    assert named is not None
    assert "switch ports 1, 2" in named and "one LACP group" in named and "static LAG is not enough" in named
    unnamed = lacp_reminder(make(), "m5")
    assert unnamed is not None
    assert "eno1, eno2" in unnamed and "bond.switch_ports" in unnamed
    assert lacp_reminder(make(switch_ports=["gi1/0/1", "gi1/0/2"]), "m5") is not None
    assert "gi1/0/1, gi1/0/2" in (lacp_reminder(make(switch_ports=["gi1/0/1", "gi1/0/2"]), "m5") or "")


@pytest.mark.parametrize("mode", [m for m in MODES if m != "802.3ad"])
def test_no_lacp_reminder_outside_8023ad(mode: str) -> None:
    assert lacp_reminder(make(mode, switch_ports=[1, 2]), "m5") is None


def test_the_bond_file_leaves_the_hosts_other_nics_with_their_renderer(tmp_path: Path) -> None:
    # Ubuntu desktops ship 01-network-manager-all.yaml: NetworkManager runs the management NIC.
    # A network-wide `renderer: networkd` in our later file would hand eth0 to networkd as well.
    import subprocess

    etc = tmp_path / "etc" / "netplan"
    etc.mkdir(parents=True)
    bond = make(address="192.168.1.10/24")
    files = {
        "01-network-manager-all.yaml": "network:\n  version: 2\n  renderer: NetworkManager\n"
        "  ethernets:\n    eth0: {dhcp4: true}\n",
        Path(bond_file(bond)).name: render_bond(bond, "m5"),
    }
    for name, text in files.items():
        (etc / name).write_text(text)
        (etc / name).chmod(0o600)
    netplan = netplan_binary()
    assert netplan is not None
    subprocess.run([netplan, "generate", "--root-dir", str(tmp_path)], check=True, capture_output=True)
    networkd = sorted(p.name for p in (tmp_path / "run" / "systemd" / "network").iterdir())
    assert networkd == [
        "10-netplan-bond0.netdev",
        "10-netplan-bond0.network",
        "10-netplan-eno1.network",
        "10-netplan-eno2.network",
    ]
    assert (tmp_path / "run" / "NetworkManager" / "system-connections" / "netplan-eth0.nmconnection").exists()


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        ("802.3ad", "one LACP group"),
        ("balance-rr", "one static group"),
        ("balance-xor", "one static group"),
        ("active-backup", None),
        ("balance-alb", None),
        ("balance-tlb", None),
    ],
)
def test_switch_reminder_for_every_mode(mode: str, words: str | None) -> None:
    said = switch_reminder(make(mode, switch_ports=[3, 4]), "irina")
    if words is None:
        assert said is None
    else:
        assert (
            said is not None
            and words in said
            and "switch ports 3, 4" in said
            and said.startswith("irina bond0")
        )


@pytest.mark.parametrize("names", [["on", "0123"], ["yes", "1.5"]])
def test_nic_names_yaml_would_read_as_other_types_stay_names(tmp_path: Path, names: list[str]) -> None:
    bond = Bond(name="bond0", interfaces=names, address="10.0.0.5/24")  # type: ignore[arg-type]
    text = render_bond(bond, "m5")
    network = yaml.safe_load(text)["network"]
    assert list(network["ethernets"]) == names and network["bonds"]["bond0"]["interfaces"] == names
    assert generate(tmp_path, text, bond) is None
