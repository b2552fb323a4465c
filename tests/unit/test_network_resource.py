"""The `bond` resource's plan: pure, from what the `bond` and `net_txn` probes answer."""

from __future__ import annotations

from typing import Any

import pytest

from labctl.inventory.model import Bond, Host
from labctl.network.bond_render import bond_file, render_bond
from labctl.provision.resource import NotApplicable, PlanError
from labctl.provision.resources.network import BondResource

BOND = {"name": "bond0", "mode": "802.3ad", "interfaces": ["eno1", "eno2"], "address": "10.0.0.1/24"}

# /proc/net/bonding/bond0 parsed, as it reads with LACP negotiated on both members.
UP = {
    "mode": "802.3ad",
    "mii_status": "up",
    "xmit_hash_policy": "layer3+4",
    "lacp_rate": "fast",
    "miimon_ms": 100,
    "active_aggregator": {"id": 1, "ports": 2, "partner_mac": "aa:bb:cc:dd:ee:ff"},
    "slaves": [
        {
            "name": n,
            "mii_status": "up",
            "aggregator_id": 1,
            "in_active_aggregator": True,
            "partner_mac": "aa:bb:cc:dd:ee:ff",
        }
        for n in ("eno1", "eno2")
    ],
}


def host(**bond: Any) -> Host:
    return Host(name="m5", address="10.0.0.1", bond=Bond.model_validate({**BOND, **bond}))


def resource(h: Host | None = None, **params: Any) -> BondResource:
    r = BondResource.from_playbook(h or host(), params)
    assert isinstance(r, BondResource)
    return r


def state(
    file_text: str | None = None, live: dict[str, Any] | None = None, **probe: Any
) -> dict[str, dict[str, Any]]:
    answer = {
        "driver": {"present": True, "how": "loaded"},
        "nics": ["lo", "eno1", "eno2"],
        "addresses": {"eno1": ["10.0.0.1/24"]},
        "netplan": "/usr/sbin/netplan",
        "bond": live,
        "file": {"exists": file_text is not None, "text": file_text},
        "netplan_problems": [],
        **probe,
    }
    return {"bond": answer, "txn": {"open": None}}


def test_a_new_bond_plans_one_transaction_with_the_file_its_diff_and_the_lacp_reminder() -> None:
    r = resource(revert_after=45)
    change = r.plan(state())
    assert len(change.ops) == 1
    op = change.ops[0]
    assert op["op"] == "net_transaction"
    assert op["files"] == {bond_file(r.bond): render_bond(r.bond, "m5")}
    assert ["netplan", "apply"] in op["commands"] and ["netplan", "apply"] in op["reapply"]
    assert "reverts by itself after 45 s" in change.summary[0]
    assert "LACP" in change.summary[0]
    assert "+++ /etc/netplan/90-labctl-bond0.yaml (planned)" in change.diffs[0]


def test_a_bond_in_place_plans_nothing() -> None:
    r = resource()
    assert not r.plan(state(render_bond(r.bond, "m5"), UP)).changed


def test_the_file_in_place_but_the_kernel_bond_wrong_is_applied_again() -> None:
    r = resource()
    down = {**UP, "slaves": [{**UP["slaves"][0]}, {**UP["slaves"][1], "mii_status": "down"}]}
    change = r.plan(state(render_bond(r.bond, "m5"), down))
    assert change.changed and change.summary[0].startswith("re-apply")


def test_each_mode_gets_the_switch_reminder_it_needs() -> None:
    rr = resource(host(mode="balance-rr")).plan(state()).summary[0]
    assert "static group" in rr and "LACP group" not in rr
    backup = resource(host(mode="active-backup")).plan(state()).summary[0]
    assert "Note:" not in backup


@pytest.mark.parametrize(
    ("probe", "words"),
    [
        ({"driver": {"present": False, "how": "not loaded"}}, "no bonding driver"),
        ({"nics": ["lo", "eno1"]}, "no NIC eno2"),
        ({"netplan": None}, "no netplan"),
        ({"netplan_problems": ["eno1 has addresses in 50-cloud-init.yaml"]}, "50-cloud-init.yaml"),
    ],
)
def test_the_preflight_refuses_before_anything_is_planned(probe: dict[str, Any], words: str) -> None:
    with pytest.raises(PlanError) as err:
        resource().plan(state(**probe))
    assert words in err.value.message
    assert "Nothing on the host was changed" in err.value.hint


def test_a_bond_that_moves_the_hosts_address_away_is_refused() -> None:
    with pytest.raises(PlanError) as err:
        resource(host(address="10.0.0.9/24")).plan(state())
    assert "cut the controller off" in err.value.message


def test_an_open_transaction_on_the_host_is_refused() -> None:
    s = state()
    s["txn"] = {"open": {"id": "x", "label": "exec: ip addr", "state": "applied"}}
    with pytest.raises(PlanError) as err:
        resource().plan(s)
    assert "another network transaction is open" in err.value.message


def test_a_host_without_a_bond_is_not_applicable() -> None:
    with pytest.raises(NotApplicable):
        BondResource.from_playbook(Host(name="irina", address="10.0.0.2"), {})


def test_revert_after_is_bounded() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        resource(revert_after=3)


def test_a_bond_the_kernel_has_is_deleted_before_netplan_makes_it_again() -> None:
    r = resource()
    wrong_mode = {**UP, "mode": "balance-rr"}
    op = r.plan(state(render_bond(r.bond, "m5"), wrong_mode)).ops[0]
    assert op["commands"] == [
        ["netplan", "generate"],
        ["ip", "link", "del", "dev", "bond0"],
        ["netplan", "apply"],
    ]
    assert op["reapply"] == [["netplan", "generate"], ["netplan", "apply"]]
    # A first bond has nothing to delete.
    assert ["ip", "link", "del", "dev", "bond0"] not in r.plan(state()).ops[0]["commands"]


def test_init_writes_the_network_playbook_and_its_bond_plans_for_the_seed_m5(tmp_path: Any) -> None:
    """`labctl init`'s network playbook loads, and its bond entry builds for the seed lab's M5
    (802.3ad over eno1+eno2) with the playbook's revert_after."""
    from pathlib import Path

    from labctl.documents.starter import write_starter
    from labctl.inventory.load import load_inventory
    from labctl.provision.playbook import load_playbook

    repo = Path(__file__).resolve().parents[2]
    written = write_starter(tmp_path / "mylab")
    book = tmp_path / "mylab/playbooks/network.yaml"
    assert book in written and book.read_bytes() == (repo / "playbooks/network.yaml").read_bytes()
    entry = load_playbook(book).plays[0].entries[0]
    assert entry.type_name == "bond"
    m5 = load_inventory(tmp_path / "mylab/inventory/lab.yaml").hosts["m5"]
    r = BondResource.from_playbook(m5, entry.params)
    assert isinstance(r, BondResource) and r.params.revert_after == 90
    assert r.plan(state()).ops[0]["files"]["/etc/netplan/90-labctl-bond0.yaml"].count("802.3ad") == 1
