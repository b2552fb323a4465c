"""doctor's pure verdicts, from facts shaped exactly as the agent's `facts.collect` answers them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from labctl.doctor.checks import (
    check_cache_mount,
    check_clocks,
    check_driver,
    check_gpus,
    check_host,
    check_host_key,
    check_network,
    check_same_torch,
    check_sandbox,
    check_torch_build,
    mount_of,
)
from labctl.doctor.gather import Clock, HostFound, NetworkProbe, probe_pair
from labctl.doctor.model import FAIL, PASS, WARN, Line, exit_code
from labctl.inventory.model import GPU, Host, ModelCache, Sandbox

GIB = 1024**3
M5 = Host(
    name="m5",
    address="10.0.0.1",
    roles=["train"],
    gpus=[GPU(model="Tesla V100", memory_gb=32), GPU(model="Tesla P40", memory_gb=24, count=4)],
    ram_gb=256,
    model_cache=ModelCache(path="/mnt/model-cache", size_gb=2),
)


def gpu(index: int, name: str, gib: float, cc: str, cuda: str = "12.8") -> dict[str, Any]:
    return {
        "index": index, "name": name, "uuid": None, "memory_total_bytes": int(gib * GIB),
        "memory_used_bytes": 0, "compute_capability": cc, "driver_version": "570.1",
        "cuda_driver_version": cuda, "utilization_pct": 0, "temperature_c": 30, "pci_bus_id": None,
    }  # fmt: skip


def facts(gpus: list[dict[str, Any]], source: str = "nvml", **more: Any) -> dict[str, Any]:
    f: dict[str, Any] = {
        "gpus": gpus,
        "gpu_source": source,
        "memory": {"total_bytes": 251 * GIB},
        "torch": {"installed": False},
        "nics": [],
        "mounts": [],
    }
    f.update(more)
    return f


def statuses(lines: list[Line], check: str) -> list[str]:
    return [x.status for x in lines if x.check == check]


def test_declared_gpus_missing_without_a_driver_fail_with_the_driver_fix_and_ram_passes() -> None:
    lines = check_gpus(HostFound(M5, facts([], source="none")))
    fails = [x for x in lines if x.status == FAIL]
    assert [x.found.split(",")[0] for x in fails] == [
        "declared 1x Tesla V100 (32 GiB)",
        "declared 4x Tesla P40 (24 GiB)",
    ]
    assert all("Install the NVIDIA driver on m5" in x.fix for x in fails)
    assert statuses(lines, "RAM declared") == [PASS]
    assert statuses(lines, "GPU") == []
    assert statuses(check_driver(HostFound(M5, facts([], source="none"))), "driver") == [FAIL]


def test_a_missing_p40_fails_with_the_seating_fix_and_the_gpus_there_pass() -> None:
    found = [gpu(0, "Tesla V100-PCIE-32GB", 31.7, "7.0")] + [
        gpu(i, "Tesla P40", 22.4, "6.1") for i in (1, 2, 3)
    ]
    lines = check_gpus(HostFound(M5, facts(found)))
    (fail,) = [x for x in lines if x.status == FAIL]
    assert fail.found.startswith("declared 4x Tesla P40 (24 GiB), found 3")
    assert "nvidia-smi -L on m5" in fail.fix and "inventory" in fail.fix
    assert statuses(lines, "GPU") == [PASS] * 4
    assert "31.7 GiB" in lines[1].found


def test_torch_without_kernels_for_pascal_fails_and_names_a_build_that_covers_every_gpu() -> None:
    found = [gpu(0, "Tesla V100", 31.7, "7.0"), gpu(1, "Tesla P40", 22.4, "6.1")]
    torch = {"installed": True, "version": "2.8.0+cu128", "cuda": "12.8", "nccl": "2.27.3",
             "arch_list": ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]}  # fmt: skip
    (line,) = check_torch_build(HostFound(M5, facts(found, torch=torch)))
    assert line.status == FAIL and "GPU 1 Tesla P40 (sm_61)" in line.found and "V100" not in line.found
    assert "2.8.0+cu126" in line.fix
    torch["arch_list"] = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
    assert [x.status for x in check_torch_build(HostFound(M5, facts(found, torch=torch)))] == [PASS]


def test_a_driver_older_than_torchs_cuda_fails() -> None:
    found = [gpu(0, "Tesla V100", 31.7, "7.0", cuda="12.4")]
    torch = {"installed": True, "version": "2.8.0", "cuda": "12.8", "arch_list": ["sm_70"]}
    (line,) = check_driver(HostFound(M5, facts(found, torch=torch)))
    assert line.status == FAIL and "CUDA 12.8" in line.fix


def test_training_hosts_on_different_torch_or_nccl_fail_lab_wide() -> None:
    other = Host(name="b", address="10.0.0.2", roles=["train"])
    t1 = {"installed": True, "version": "2.8.0", "nccl": "2.27.3"}
    t2 = {"installed": True, "version": "2.8.0", "nccl": "2.21.5"}
    (line,) = check_same_torch([HostFound(M5, facts([], torch=t1)), HostFound(other, facts([], torch=t2))])
    assert line.status == FAIL and line.host is None and "NCCL 2.21.5 on b" in line.found
    (same,) = check_same_torch([HostFound(M5, facts([], torch=t1)), HostFound(other, facts([], torch=t1))])
    assert same.status == PASS


def test_clock_skew_beyond_what_the_round_trip_explains_fails() -> None:
    ok = HostFound(M5, clock=Clock(100.0, 100.3, 100.4))  # within the 0.2 s half round trip + margin
    bad = HostFound(Host(name="b", address="10.0.0.2"), clock=Clock(100.0, 112.0, 100.2))
    lines = check_clocks([ok, bad])
    assert [(x.host, x.status) for x in lines] == [("m5", PASS), ("b", FAIL)]
    assert "timedatectl set-ntp true" in lines[1].fix


def test_network_probe_verdicts() -> None:
    assert check_network(None, "needs two Linux hosts that answered")[0].status == WARN
    failed = NetworkProbe("a", "b", error="a could not send to b", hint="Check the firewall.")
    assert [(x.status, x.fix) for x in check_network(failed, None)] == [(FAIL, "Check the firewall.")]
    report = {"best": {"mbps": 200.0, "share": 0.2}, "link": {"mbps": 1000},
              "runs": [{"streams": 1, "connect_ms": 0.4}]}  # fmt: skip
    bw, lat = check_network(NetworkProbe("a", "b", report=report), None)
    assert (bw.status, lat.status) == (WARN, PASS) and "20% of the 1000 Mbit/s link" in bw.found
    report["best"] = {"mbps": 940.0, "share": 0.94}
    report["runs"] = [{"streams": 1, "connect_ms": 40.0}]
    bw, lat = check_network(NetworkProbe("a", "b", report=report), None)
    assert (bw.status, lat.status) == (PASS, WARN)


def test_cache_mount_missing_or_off_size_warns_and_at_size_passes() -> None:
    assert statuses(check_cache_mount(HostFound(M5, facts([]))), "model cache") == [WARN]
    mount = {"mountpoint": "/mnt/model-cache", "fstype": "tmpfs", "device": "tmpfs", "size_bytes": 2 * GIB}
    assert statuses(check_cache_mount(HostFound(M5, facts([], mounts=[mount]))), "model cache") == [PASS]
    mount["size_bytes"] = GIB
    (line,) = check_cache_mount(HostFound(M5, facts([], mounts=[mount])))
    assert line.status == WARN and "provision --tags cache --limit m5" in line.fix


def test_mount_of_takes_the_longest_mountpoint_holding_the_path() -> None:
    mounts = [{"mountpoint": "/"}, {"mountpoint": "/var"}, {"mountpoint": "/var/lib/labctlx"}]
    assert mount_of(mounts, "/var/lib/labctl/train") == {"mountpoint": "/var"}


def test_sandbox_host_without_its_language_images_fails() -> None:
    irina = Host(
        name="irina", address="10.0.0.2", roles=["sandbox"], sandbox=Sandbox(languages=["python", "go"])
    )
    images = [{"image": "labctl-sandbox-python:latest", "lang": "python"}]
    f = HostFound(irina, facts([], docker={"cli": True, "server_version": "26.1"}), images=images)
    lines = check_sandbox(f)
    assert [(x.check, x.status) for x in lines] == [("docker", PASS), ("sandbox images", FAIL)]
    assert "go" in lines[1].found and "playbooks/sandbox.yaml --limit irina" in lines[1].fix
    assert check_sandbox(HostFound(irina, facts([], docker={"cli": False})))[0].status == FAIL
    assert check_sandbox(HostFound(M5, facts([]))) == []


def test_host_key_pinned_passes_and_unpinned_fails_with_trust(tmp_path: Path) -> None:
    import paramiko

    key = paramiko.Ed25519Key.from_private_key_file(str(_ed25519(tmp_path)))
    known = tmp_path / "known_hosts"
    known.write_text(f"10.0.0.1 {key.get_name()} {key.get_base64()}\n")
    pinned = Host(name="m5", address="10.0.0.1", known_hosts=known)
    assert [x.status for x in check_host_key(HostFound(pinned))] == [PASS]
    other = Host(name="b", address="10.0.0.9", known_hosts=known)
    (line,) = check_host_key(HostFound(other))
    assert line.status == FAIL and line.fix == "Pin it: labctl trust b"


def _ed25519(tmp_path: Path) -> Path:
    import subprocess

    path = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def test_unreachable_host_fails_and_windows_is_skipped_with_a_warning(tmp_path: Path) -> None:
    down = HostFound(
        Host(name="b", address="10.0.0.2", known_hosts=tmp_path / "none"), error="timed out", hint="Check it."
    )
    assert [(x.check, x.status) for x in check_host(down)] == [("host key", FAIL), ("reachable", FAIL)]
    win = HostFound(
        Host(name="w", address="10.0.0.4", os="windows", known_hosts=tmp_path / "none"), skipped="windows"
    )
    assert check_host(win)[-1].status == WARN
    assert exit_code(check_host(win)) == 1 and exit_code([Line(WARN, "x", None, "y")]) == 0


def test_the_probe_pair_puts_a_training_host_at_the_receiving_end() -> None:
    a, b = Host(name="a", address="10.0.0.2"), Host(name="t", address="10.0.0.3", roles=["train"])
    pair = probe_pair([HostFound(a, facts([])), HostFound(b, facts([])), HostFound(M5)])
    assert pair is not None and (pair[0].name, pair[1].name) == ("a", "t")


def test_alerts_firing_are_lines_critical_fails_warning_warns_and_none_passes() -> None:
    from labctl.doctor.checks import check_alerts
    from labctl.monitor.alerts import Alert

    hot = Alert("gpu_temperature", "m5", "critical", "GPU 1 at 91 °C (above 85 °C)", 91, 85, gpu=1)
    full = Alert("model_cache_full", "m5", "warning", "model cache 93% full (above 90%)", 93, 90)
    lines = check_alerts(HostFound(M5, facts([]), alerts=[hot, full]))
    assert [(x.status, x.check) for x in lines] == [
        (FAIL, "alert gpu_temperature"),
        (WARN, "alert model_cache_full"),
    ]
    assert "91 °C" in lines[0].found and "alerts.yaml" in lines[0].fix
    assert statuses(check_alerts(HostFound(M5, facts([]), alerts=[])), "alerts") == [PASS]
    assert check_alerts(HostFound(M5, facts([]))) == []  # not sampled: no line


def test_a_nics_speed_reads_as_facts_shows_it_and_a_virtual_ones_is_not_held_against_it() -> None:
    from labctl.doctor.checks import check_nics
    from labctl.inventory.model import NIC

    host = M5.model_copy(update={"nics": [NIC(name="eth0", speed_mbps=25000)]})
    veth = {"name": "eth0", "operstate": "up", "speed_mbps": 10000, "virtual": True, "is_bond": False}
    (line,) = [x for x in check_nics(HostFound(host, facts([], nics=[veth]))) if x.check == "NIC"]
    # `labctl facts` shows this NIC as "eth0 10000M up": doctor says the same speed.
    assert "10000 Mbit/s" in line.found and "no speed reported" not in line.found
    assert "virtual" in line.found and line.status == PASS  # a veth's figure is no cable's
    cable = {**veth, "virtual": False}
    (line,) = [x for x in check_nics(HostFound(host, facts([], nics=[cable]))) if x.check == "NIC"]
    assert line.status == WARN and "10000 Mbit/s; declared 25000" in line.found
    unknown = {**veth, "speed_mbps": None}
    (line,) = [x for x in check_nics(HostFound(host, facts([], nics=[unknown]))) if x.check == "NIC"]
    assert "no speed reported" in line.found
