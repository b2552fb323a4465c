"""The host side of the bond preflight (labctl/agent/network/bondcheck.py, run here on this
machine: its real NICs, addresses and netplan) and the pure judgement of its answer
(labctl/network/bond_preflight.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.network.bondcheck import (
    bond_probe,
    bonding_driver,
    controller_path,
    ifupdown_conflicts,
    read_bond,
)
from labctl.agent.provision.commands import probe_command
from labctl.inventory.model import Bond, Host
from labctl.network.bond_preflight import preflight
from labctl.network.bond_render import bond_file, render_bond

M5 = Host(name="m5", address="192.168.1.10")
BOND = Bond(name="bond0", interfaces=["eno1", "eno2"], address="192.168.1.10/24", gateway="192.168.1.1")  # type: ignore[arg-type]


def good_probe(**over: Any) -> dict[str, Any]:
    """A host that can take BOND: the shape bond_probe answers in."""
    probe: dict[str, Any] = {
        "driver": {
            "present": True,
            "how": "loadable (/lib/modules/6.1.0/kernel/drivers/net/bonding/bonding.ko)",
        },
        "nics": ["eno1", "eno2", "lo"],
        "addresses": {"lo": ["127.0.0.1/8"], "eno1": ["192.168.1.10/24"], "eno2": []},
        "netplan": "/usr/sbin/netplan",
        "bond": None,
        "file": {"exists": False, "text": None},
        "netplan_problems": [],
        "systemd_networkd": True,
    }
    probe.update(over)
    return probe


def test_a_host_that_can_take_the_bond_has_no_problems() -> None:
    assert preflight(M5, BOND, good_probe(), None) == []
    # Re-applying: the address already lives on the bond.
    on_bond = good_probe(addresses={"bond0": ["192.168.1.10/24"], "eno1": [], "eno2": []})
    assert preflight(M5, BOND, on_bond, "192.168.1.10") == []


def test_every_problem_in_order() -> None:
    probe = good_probe(
        driver={"present": False, "how": "kernel 6.1.0: not loaded"},
        nics=["eno1", "eth5", "lo"],
        netplan=None,
        netplan_problems=["/etc/netplan/90-labctl-bond0.yaml:3:1: Error"],
    )
    other = Bond(name="bond0", interfaces=["eno1", "eno2"], address="192.168.1.11/24")  # type: ignore[arg-type]
    problems = preflight(M5, other, probe, None)
    assert len(problems) == 5
    assert (
        "no bonding driver" in problems[0]
        and "modprobe bonding" in problems[0]
        and "CONFIG_BONDING" in problems[0]
    )
    assert (
        problems[1]
        == "m5 has no NIC eno2 for bond0; its NICs are eno1, eth5: fix bond.interfaces in the inventory."
    )
    assert "cut the controller off" in problems[2] and "192.168.1.11/24" in problems[2]
    assert "no netplan" in problems[3] and "netplan.io" in problems[3]
    assert problems[4] == "netplan on m5 refuses the bond: /etc/netplan/90-labctl-bond0.yaml:3:1: Error"


@pytest.mark.parametrize(
    ("address", "gateway", "reach", "cut"),
    [
        ("192.168.1.11/24", None, None, True),  # host.address on eno1 moves away
        (None, None, None, True),  # the bond takes no address at all
        ("192.168.1.10/24", None, None, False),
        ("192.168.1.11/24", None, "10.0.0.7", False),  # the controller comes in elsewhere
        ("192.168.1.11/24", None, "192.168.1.10", True),
    ],
)
def test_an_address_change_that_would_cut_the_controller_off(
    address: str | None, gateway: str | None, reach: str | None, cut: bool
) -> None:
    bond = Bond(name="bond0", interfaces=["eno1", "eno2"], address=address, gateway=gateway)  # type: ignore[arg-type]
    probe = good_probe(
        addresses={"eno1": ["192.168.1.10/24"], "eth0": ["10.0.0.7/24"]}, nics=["eno1", "eno2", "eth0"]
    )
    problems = preflight(M5, bond, probe, reach)
    assert (problems != []) == cut, problems
    if cut:
        assert "the controller reaches m5 at 192.168.1.10 on eno1, a member of bond0" in problems[0]


def test_a_management_nic_outside_the_bond_keeps_the_host_reachable() -> None:
    host = Host(name="m5", address="10.0.0.7")
    bond = Bond(name="bond0", interfaces=["eno1", "eno2"], address="192.168.1.50/24")  # type: ignore[arg-type]
    probe = good_probe(addresses={"eno1": ["192.168.1.10/24"], "eth0": ["10.0.0.7/24"]})
    assert preflight(host, bond, probe, None) == []


def test_a_host_named_by_dns_is_judged_by_the_address_the_controller_reached() -> None:
    host = Host(name="m5", address="m5.lab.example")
    moved = Bond(name="bond0", interfaces=["eno1", "eno2"], address="192.168.1.11/24")  # type: ignore[arg-type]
    assert preflight(host, moved, good_probe(), None) == []  # unknown: the transaction's revert covers it
    assert "cut the controller off" in preflight(host, moved, good_probe(), "192.168.1.10")[0]
    # sshd tells the agent which address the connection came in on.
    ssh = {"client": "192.168.1.5", "server": "192.168.1.10", "dev": "eno1", "via": None}
    assert "at 192.168.1.10 on eno1" in preflight(host, moved, good_probe(controller=ssh), None)[0]


ROUTED = {"client": "10.8.0.5", "server": "192.168.1.10", "dev": "eno1", "via": "192.168.1.1"}


@pytest.mark.parametrize(
    ("controller", "gateway", "words"),
    [
        (ROUTED, None, "set bond.gateway: 192.168.1.1 (a router in 192.168.1.0/24)"),
        (ROUTED, "192.168.1.1", None),
        ({**ROUTED, "client": "192.168.1.5", "via": None}, None, None),  # on the bond's own subnet
        ({**ROUTED, "dev": "eth0"}, None, None),  # the way back is not over a member
        ({**ROUTED, "client": "fd00::5", "via": None}, "192.168.1.1", "reach the host over IPv4"),
        (None, None, None),  # no SSH session (a local connection): nothing to judge
    ],
)
def test_a_bond_that_loses_the_route_back_to_the_controller(
    controller: dict[str, Any] | None, gateway: str | None, words: str | None
) -> None:
    # The controller sits on another subnet (a laptop over VPN): the bond keeps the address it
    # reaches, but without a gateway the host could not answer it any more.
    bond = Bond(name="bond0", interfaces=["eno1", "eno2"], address="192.168.1.10/24", gateway=gateway)  # type: ignore[arg-type]
    problems = preflight(M5, bond, good_probe(controller=controller), None)
    if words is None:
        assert problems == []
    else:
        assert len(problems) == 1 and words in problems[0] and "cut the controller off" in problems[0], (
            problems
        )


def test_an_ipv6_way_in_over_a_member_is_cut_by_an_ipv4_bond() -> None:
    host = Host(name="m5", address="fd00::10")
    probe = good_probe(addresses={"eno1": ["192.168.1.10/24", "fd00::10/64"], "eno2": []})
    problems = preflight(host, BOND, probe, None)
    assert len(problems) == 1 and "carries IPv4 only" in problems[0] and "192.168.1.10" in problems[0]


def test_controller_path_reads_sshds_environment_and_the_real_route_back() -> None:
    # The environment sshd gives a session, and this machine's real routing table.
    found = controller_path({"SSH_CONNECTION": "127.0.0.1 50222 127.0.0.1 22"})
    assert found == {"client": "127.0.0.1", "server": "127.0.0.1", "dev": "lo", "via": None}
    assert controller_path({}) is None
    assert controller_path({"SSH_CONNECTION": "garbage"}) is None


# --- the agent side, on this machine ------------------------------------------------------


def test_this_kernel_has_no_bonding_driver() -> None:
    if os.path.isdir("/sys/module/bonding") or os.path.isdir("/proc/net/bonding"):
        pytest.skip("this kernel has the bonding driver loaded")
    found = bonding_driver()
    assert found["present"] is False
    assert os.uname().release in found["how"]


REL = "6.1.0-test"


def fake_tree(tmp_path: Path, files: dict[str, str], disabled: str = "0") -> dict[str, Any]:
    """A fake /sys/module, /lib/modules and modules_disabled: this machine's real ones have no
    bonding driver to find."""
    sysmod, mods = tmp_path / "sys-module", tmp_path / "lib-modules"
    (mods / REL).mkdir(parents=True)
    sysmod.mkdir()
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "modules_disabled").write_text(disabled + "\n")
    return {
        "sys_module": str(sysmod),
        "proc_dir": str(tmp_path / "proc-net-bonding"),
        "modules_dirs": (str(mods),),
        "release": REL,
        "modules_disabled": str(tmp_path / "modules_disabled"),
    }


KO = f"lib-modules/{REL}/kernel/drivers/net/bonding/bonding.ko.zst"


@pytest.mark.parametrize(
    ("files", "disabled", "present", "how"),
    [
        ({}, "0", False, f"kernel {REL}: not loaded"),
        (
            {f"lib-modules/{REL}/modules.builtin": "kernel/drivers/net/bonding/bonding.ko\n"},
            "1",
            True,
            "built into",
        ),
        ({KO: ""}, "0", True, "loadable ("),
        ({KO: ""}, "1", False, "refuses to load modules (kernel.modules_disabled=1)"),
        # Not where Debian puts it: modprobe's index says where it is.
        (
            {
                f"lib-modules/{REL}/updates/bonding.ko.xz": "",
                f"lib-modules/{REL}/modules.dep": "kernel/net/tls/tls.ko.xz:\nupdates/bonding.ko.xz: kernel/net/tls/tls.ko.xz\n",
            },
            "0",
            True,
            "updates/bonding.ko.xz",
        ),
        ({"sys-module/bonding/refcnt": "0"}, "1", True, "loaded"),
    ],
    ids=["none", "built-in", "loadable", "loading-disabled", "modules.dep", "loaded"],
)
def test_fake_module_tree_finds_the_bonding_driver(
    tmp_path: Path, files: dict[str, str], disabled: str, present: bool, how: str
) -> None:
    found = bonding_driver(**fake_tree(tmp_path, files, disabled))
    assert found["present"] is present
    assert how in found["how"], found


def test_fake_proc_net_bonding_read_bond(tmp_path: Path) -> None:
    # A fake /proc/net/bonding: this kernel has no bonding driver, so it has no real one.
    (tmp_path / "bond0").write_text(
        "Bonding Mode: load balancing (round-robin)\nMII Status: up\n\nSlave Interface: eno1\nMII Status: up\n"
    )
    parsed = read_bond("bond0", proc_dir=str(tmp_path))
    assert parsed is not None and parsed["mode"] == "balance-rr" and parsed["slaves"][0]["name"] == "eno1"
    assert read_bond("bond1", proc_dir=str(tmp_path)) is None


def test_bond_probe_on_this_machine_and_its_verdict(tmp_path: Path) -> None:
    existing = tmp_path / "90-labctl-bond0.yaml"
    existing.write_text("old\n")
    args = {
        "name": "bond0",
        "path": str(existing),
        "text": render_bond(BOND, "m5"),
        "members": BOND.interfaces,
    }
    # Through the provision agent's probe table, as the controller calls it.
    probe = probe_command({"probes": {"b": {"kind": "bond", **args}}})["results"]["b"]
    assert set(probe) == {
        "driver",
        "nics",
        "addresses",
        "netplan",
        "bond",
        "file",
        "netplan_problems",
        "systemd_networkd",
        "controller",
        "other_managers",
        "masters",
    }
    # Other sessions' simulated labs add and remove links here: compare shapes, not the list.
    assert "lo" in probe["nics"] and probe["nics"] == sorted(probe["nics"])
    assert "127.0.0.1/8" in probe["addresses"]["lo"]
    assert probe["netplan"] is not None
    assert probe["file"] == {"exists": True, "text": "old\n"}
    folder = bond_probe({"name": "bond0", "path": str(tmp_path)})["file"]
    assert folder["exists"] is True and folder["text"] is None and str(tmp_path) in folder["error"]
    assert probe["bond"] is None
    assert isinstance(probe["systemd_networkd"], bool)
    # The path is outside /etc/netplan: netplan's check names it rather than guess.
    assert probe["netplan_problems"] and str(existing) in probe["netplan_problems"][0]
    if not probe["driver"]["present"]:
        problems = preflight(M5, BOND, probe, None)
        assert "no bonding driver" in problems[0]
        assert any("has no NIC" in p for p in problems)


def test_bond_probe_judges_the_file_with_real_netplan() -> None:
    good = bond_probe(
        {
            "name": "bond0",
            "path": bond_file(BOND),
            "text": render_bond(BOND, "m5"),
            "members": BOND.interfaces,
        }
    )
    broken = bond_probe(
        {
            "name": "bond0",
            "path": bond_file(BOND),
            "text": render_bond(BOND, "m5").replace("mode: 802.3ad", "mode: 802.3ax"),
            "members": BOND.interfaces,
        }
    )
    # This machine's own /etc/netplan is the base: whatever it holds, ours must not add a refusal.
    assert not any("802.3ax" in p for p in good["netplan_problems"])
    assert any("unknown bond mode '802.3ax'" in p for p in broken["netplan_problems"])
    assert preflight(M5, BOND, {**good_probe(), "netplan_problems": broken["netplan_problems"]}, None)[
        0
    ].startswith("netplan on m5 refuses the bond: /etc/netplan/90-labctl-bond0.yaml:")


PY38 = Path("/root/.pyenv/versions/3.8.18/bin/python3")


@pytest.mark.skipif(not PY38.exists(), reason=f"no Python 3.8 interpreter at {PY38}")
def test_the_bond_probe_runs_in_memory_on_python38(tmp_path: Path) -> None:
    # As `provision --check` runs it on a host: only the modules the probe command imports travel.
    import json
    import subprocess

    from labctl.hosts.agent_ship import IN_MEMORY, agent_blob

    args = {
        "probes": {
            "b": {
                "kind": "bond",
                "name": "bond0",
                "path": bond_file(BOND),
                "text": "x: [\n",
                "members": ["eno1"],
            }
        }
    }
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(PY38), "-c", IN_MEMORY, agent_blob("provision.probe"), "provision.probe", json.dumps(args)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)["results"]["b"]
    assert "error" not in result, result
    assert result["driver"]["present"] in (True, False)
    assert result["netplan_problems"] and "/etc/netplan/90-labctl-bond0.yaml" in result["netplan_problems"][0]


def test_ifupdown_stanzas_for_a_member_are_named(tmp_path: Path) -> None:
    # Debian's own /etc/network/interfaces layout; ifupdown is not installed on this machine,
    # so a file stands in for /sbin/ifup (only its presence is read).
    etc = tmp_path / "network"
    (etc / "interfaces.d").mkdir(parents=True)
    (etc / "interfaces").write_text(
        "source /etc/network/interfaces.d/*\n".replace("/etc/network", str(etc))
        + "auto lo\niface lo inet loopback\n\nallow-hotplug eno2  # the second port\n"
    )
    (etc / "interfaces.d" / "eno1").write_text(
        "auto eno1\niface eno1 inet static\n    address 192.168.1.10/24\n"
    )
    ifup = tmp_path / "ifup"
    ifup.write_text("")
    found = ifupdown_conflicts(["eno1", "eno2"], str(etc / "interfaces"), str(ifup))
    assert found == [
        f"eno2 is also configured by ifupdown ({etc}/interfaces: allow-hotplug eno2); networkd and "
        "ifupdown would fight over it: remove its stanzas there",
        f"eno1 is also configured by ifupdown ({etc}/interfaces.d/eno1: auto eno1; {etc}/interfaces.d/eno1: "
        "iface eno1 inet static); networkd and ifupdown would fight over it: remove its stanzas there",
    ]
    assert ifupdown_conflicts(["eno1"], str(etc / "interfaces"), str(tmp_path / "no-ifup")) == []
    problems = preflight(M5, BOND, good_probe(other_managers=found), None)
    assert len(problems) == 2 and problems[0].startswith("on m5, eno2 is also configured by ifupdown")


def test_a_member_enslaved_elsewhere_and_a_name_taken_by_a_nic() -> None:
    probe = good_probe(masters={"eno1": "br0", "eno2": None}, nics=["eno1", "eno2", "bond0", "lo"])
    problems = preflight(M5, BOND, probe, None)
    assert problems == [
        "on m5, eno1 is already enslaved to br0: a NIC belongs to one bond or bridge only, so release it there first.",
        "m5 already has an interface bond0 that is not a bond: give the bond another name (bond.name).",
    ]
    # Re-applying over the bond that is already there: both are ours.
    again = good_probe(
        masters={"eno1": "bond0", "eno2": "bond0"}, nics=["eno1", "eno2", "bond0"], bond={"mode": "802.3ad"}
    )
    assert preflight(M5, BOND, again, None) == []
