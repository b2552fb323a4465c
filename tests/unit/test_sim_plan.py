"""The sim's pure planning: names, addresses, interface names, sshd config and inventory. No root."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.output.errors import InputError
from labctl.sim import plan
from labctl.sim.plan import (
    DEFAULT_HOSTS,
    IFNAMSIZ,
    MANAGED_PATHS,
    SIM_CACHE_GB,
    assign_addresses,
    bridge_address,
    host_entry,
    host_names,
    inventory_doc,
    known_hosts_text,
    lab_name,
    parse_rate,
    plan_hosts,
    seed_hosts,
    sshd_config,
    start_script,
    tbf_args,
    veth_names,
)

SEED: dict[str, Any] = {
    "m5": {
        "address": "192.168.1.10",
        "roles": ["train", "inference", "cache"],
        "ram_gb": 256,
        "gpus": [{"model": "Tesla V100", "memory_gb": 32, "count": 1}],
        "nics": [{"name": "eno1", "speed_mbps": 1000}, {"name": "eno2", "speed_mbps": 1000}],
        "bond": {
            "name": "bond0",
            "mode": "802.3ad",
            "interfaces": ["eno1", "eno2"],
            "address": "192.168.1.10/24",
            "gateway": "192.168.1.1",
        },
        "model_cache": {"path": "/mnt/model-cache", "size_gb": 200, "source": "irina"},
        "user": "admin",
        "port": 2222,
    },
    "workstation": {"address": "192.168.1.40", "roles": ["edge"], "os": "windows", "nics": ["eth3"]},
}


def test_default_names_are_the_seed_lab() -> None:
    assert host_names() == list(DEFAULT_HOSTS) == ["m5", "irina", "pharaoh", "workstation"]


def test_count_fills_with_nodes_after_the_given_names() -> None:
    names = host_names(None, 16)
    assert names[:4] == list(DEFAULT_HOSTS)
    assert names[4:] == [f"node{i:02d}" for i in range(1, 13)]
    assert host_names(["a", "b"], 4) == ["a", "b", "node01", "node02"]


def test_count_smaller_than_names_truncates_and_skips_taken_node_names() -> None:
    assert host_names(None, 2) == ["m5", "irina"]
    assert host_names(["node01"], 3) == ["node01", "node02", "node03"]
    assert host_names([], 2) == ["node01", "node02"]


@pytest.mark.parametrize(
    ("hosts", "count"), [(["a", "a"], None), (["bad name"], None), ([], None), (["-x"], None), (None, 0)]
)
def test_bad_names_and_counts_are_input_errors(hosts: list[str] | None, count: int | None) -> None:
    with pytest.raises(InputError):
        host_names(hosts, count)


def test_addresses_start_at_ten_and_the_bridge_is_dot_one() -> None:
    assert bridge_address("10.250.0.0/24") == "10.250.0.1"
    assert assign_addresses(["a", "b", "c"], "10.250.0.0/24") == {
        "a": "10.250.0.10",
        "b": "10.250.0.11",
        "c": "10.250.0.12",
    }


def test_existing_hosts_keep_their_addresses_and_new_ones_fill_gaps() -> None:
    got = assign_addresses(["x", "b", "new"], "10.250.0.0/24", {"b": "10.250.0.11", "gone": "10.250.0.10"})
    assert got == {"x": "10.250.0.10", "b": "10.250.0.11", "new": "10.250.0.12"}


def test_subnet_capacity_and_validity() -> None:
    assert len(assign_addresses(host_names(None, 200), "10.250.0.0/24")) == 200
    with pytest.raises(InputError, match="room for"):
        assign_addresses(host_names(None, 250), "10.250.0.0/24")
    assert len(set(assign_addresses(host_names(None, 300), "10.250.0.0/22").values())) == 300
    for bad in ("10.250.0.1/24", "fd00::/64", "nonsense", "10.0.0.0/30"):
        with pytest.raises(InputError):
            assign_addresses(["a"], bad)


def test_veth_names_fit_the_kernel_limit_whatever_the_host_name() -> None:
    plans = plan_hosts(host_names(["a-very-long-host-name-indeed"], 64), "10.250.0.0/24", "lcbr0", "lc-")
    veths = [v for p in plans for v in p.veths]
    assert len(set(veths)) == len(veths) == 128
    assert all(len(v) <= IFNAMSIZ for v in veths)
    assert plans[0].veths == ("lcbr0-10-0", "lcbr0-10-1")
    assert plans[0].namespace == "lc-a-very-long-host-name-indeed"
    assert max(len(v) for v in veth_names("abcdefghi", "10.250.0.254", "10.250.0.0/24")) == IFNAMSIZ


def test_long_bridge_names_and_bad_prefixes_are_refused() -> None:
    with pytest.raises(InputError, match="bridge"):
        plan_hosts(["a"], bridge="muchtoolongbridge")
    with pytest.raises(InputError, match="prefix"):
        plan_hosts(["a"], prefix="bad prefix")


def test_rates() -> None:
    assert parse_rate("1gbit") == 1_000_000_000
    assert parse_rate("100mbit") == 100_000_000
    assert parse_rate("125MBps") == 1_000_000_000
    args = tbf_args("1gbit")
    assert args[:3] == ["tbf", "rate", "1000000000"]
    assert int(args[args.index("burst") + 1]) >= 64 * 1024
    for bad in ("fast", "1 gbit", "0mbit", "10bit"):
        with pytest.raises(InputError):
            parse_rate(bad)


def test_seed_host_is_copied_with_sim_address_nics_and_bond() -> None:
    entry = host_entry("10.250.0.10", SEED["m5"], "10.250.0.1", 24)
    assert entry["address"] == "10.250.0.10"
    assert entry["roles"] == ["train", "inference", "cache"]
    assert entry["gpus"] == SEED["m5"]["gpus"] and entry["ram_gb"] == 256
    # Same path and source, but a cap that fits a machine shared by every sim host.
    assert entry["model_cache"] == {**SEED["m5"]["model_cache"], "size_gb": SIM_CACHE_GB}
    assert SEED["m5"]["model_cache"]["size_gb"] > SIM_CACHE_GB
    assert entry["nics"] == [{"name": "eth0", "speed_mbps": 1000}, {"name": "eth1", "speed_mbps": 1000}]
    assert entry["bond"] == {
        "name": "bond0",
        "mode": "802.3ad",
        "interfaces": ["eth0", "eth1"],
        "address": "10.250.0.10/24",
        "gateway": "10.250.0.1",
    }
    # The sim decides how hosts are reached; a seed host's own user/port would point nowhere.
    assert "user" not in entry and "port" not in entry
    # The seed itself is not changed.
    assert SEED["m5"]["bond"]["interfaces"] == ["eno1", "eno2"]


def test_plain_nodes_and_other_nic_shapes() -> None:
    assert host_entry("10.250.0.14", None, "10.250.0.1", 24) == {"address": "10.250.0.14", "roles": ["node"]}
    ws = host_entry("10.250.0.13", SEED["workstation"], "10.250.0.1", 24)
    assert ws == {"address": "10.250.0.13", "roles": ["edge"], "os": "windows", "nics": ["eth0"]}
    assert plan._rename_nics({"eno1": {"speed_mbps": 1}, "eno2": {}, "eno3": {}}) == {
        "eth0": {"speed_mbps": 1},
        "eth1": {},
    }


def test_inventory_follows_the_contract() -> None:
    plans = plan_hosts(host_names(["m5", "workstation"], 3), "10.250.0.0/24")
    doc = inventory_doc(plans, "10.250.0.0/24", "/usr/bin/python3", SEED)
    assert doc["lab"] == "sim"
    assert doc["defaults"] == {
        "user": "root",
        "port": 22,
        "connection": "ssh",
        "python": "/usr/bin/python3",
        "ssh_key": "keys/id_ed25519",
        "known_hosts": "keys/known_hosts",
    }
    assert list(doc["hosts"]) == ["m5", "workstation", "node01"]
    assert doc["hosts"]["node01"] == {"address": "10.250.0.12", "roles": ["node"]}
    assert doc["hosts"]["m5"]["bond"]["address"] == "10.250.0.10/24"


def test_labs_side_by_side_have_names_of_their_own() -> None:
    # They share this machine's Docker, where sandbox pools are told apart by the lab's name.
    assert lab_name("lcbr0") == "sim" and lab_name("lctest1") == "sim-lctest1"
    assert lab_name("lctest1") != lab_name("lctest2")
    plans = plan_hosts(host_names(["m5"], 1), "10.251.0.0/24")
    assert (
        inventory_doc(plans, "10.251.0.0/24", "/usr/bin/python3", SEED, lab=lab_name("lcbr9"))["lab"]
        == "sim-lcbr9"
    )


def test_inventory_from_the_real_seed_lab_validates(tmp_path: Path) -> None:
    """The inventory written for the seed lab passes labctl's own inventory loader."""
    import labctl

    seed_file = Path(labctl.__file__).parent / "data" / "lab.yaml"
    if not seed_file.exists():
        pytest.skip("no seed lab file labctl/data/lab.yaml yet")
    load = pytest.importorskip("labctl.inventory.load")
    seed = seed_hosts(yaml.safe_load(seed_file.read_text()))
    plans = plan_hosts(host_names(None, 6), "10.250.0.0/24")
    doc = inventory_doc(plans, "10.250.0.0/24", "/usr/bin/python3", seed)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id_ed25519").write_text("")  # the loader checks that the key file exists
    inv = load.load_inventory(path)
    assert set(inv.hosts) == {"m5", "irina", "pharaoh", "workstation", "node01", "node02"}
    assert inv.hosts["m5"].bond is not None
    assert [str(i) for i in inv.hosts["m5"].bond.interfaces] == ["eth0", "eth1"]
    assert inv.hosts["workstation"].os == "windows"


def test_seed_hosts_tolerates_odd_files() -> None:
    assert seed_hosts(None) == {}
    assert seed_hosts({"hosts": None}) == {}
    assert seed_hosts({"hosts": {"a": {"roles": []}, "b": "junk"}}) == {"a": {"roles": []}}


def test_sshd_config_has_what_labctl_relies_on() -> None:
    text = sshd_config("10.250.0.10", "/d/hosts/m5/key", "/d/hosts/m5/sshd.pid", "/d/keys/authorized_keys")
    lines = set(text.splitlines())
    for want in (
        "ListenAddress 10.250.0.10",
        "HostKey /d/hosts/m5/key",
        "PidFile /d/hosts/m5/sshd.pid",
        # the sim's shared key, and each host's own root keys (its private /root/.ssh)
        "AuthorizedKeysFile /d/keys/authorized_keys .ssh/authorized_keys",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "UseDNS no",
        "Subsystem sftp internal-sftp",
        "MaxStartups 200",
        "MaxSessions 64",
    ):
        assert want in lines, want
    assert 'HostKey "/my dir/key"' in sshd_config("10.0.0.10", "/my dir/key", "/p", "/a")


def test_start_script_binds_every_managed_path_then_execs_sshd() -> None:
    script = start_script("m5", "/sim dir/hosts/m5/root", "/usr/sbin/sshd", "/c", "/l")
    words = shlex.split(script.replace(";", " ; "))
    for mp in MANAGED_PATHS:
        assert f"/sim dir/hosts/m5/root{mp.path}" in words
        assert mp.path in words
    assert script.rstrip().endswith("exec /usr/sbin/sshd -D -f /c -E /l")
    assert "/etc/fstab" in {mp.path for mp in MANAGED_PATHS if mp.is_file}


def test_known_hosts_lines() -> None:
    text = known_hosts_text(
        [("10.250.0.10", "ssh-ed25519 AAAAkey comment"), ("10.250.0.11", "ssh-ed25519 BBBB")]
    )
    assert text == "10.250.0.10 ssh-ed25519 AAAAkey\n10.250.0.11 ssh-ed25519 BBBB\n"


@pytest.mark.parametrize("args", [["up"], ["down"], ["status"], ["stop", "m5"], ["start", "m5"]])
def test_sim_commands_need_root(args: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from labctl.cli.sim_cmd import app
    from labctl.output.errors import HostError

    monkeypatch.setattr("os.geteuid", lambda: 1000)
    r = CliRunner().invoke(app, [*args, "--dir", str(tmp_path / "sim")])
    assert isinstance(r.exception, HostError)
    assert r.exception.message == "labctl sim needs root to create network namespaces."
    assert not (tmp_path / "sim").exists()
