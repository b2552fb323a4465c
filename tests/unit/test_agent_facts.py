"""The host agent: its parsers on real-world samples, and `facts.collect` run for real on this machine."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path
from typing import Any

import pytest

from labctl.agent import AGENT_VERSION
from labctl.agent.core import gpus
from labctl.agent.core.parsers import (
    cuda_version_string,
    memory_from_meminfo,
    nccl_version_string,
    parse_bonding,
    parse_cpuinfo,
    parse_if_inet6,
    parse_ip_addr_json,
    parse_meminfo,
    parse_mounts,
    parse_nvidia_smi_csv,
    parse_os_release,
)
from labctl.agent.facts import collect as facts
from labctl.agent.facts.storage import select_mounts
from labctl.hosts.agent_ship import agent_zip

REPO = Path(__file__).resolve().parents[2]
PY38 = Path("/root/.pyenv/versions/3.8.18/bin/python3")
SECTIONS = [
    "os",
    "cpu",
    "memory",
    "gpus",
    "gpu_source",
    "nics",
    "mounts",
    "disks",
    "python",
    "torch",
    "docker",
]

BOND_8023AD = """\
Ethernet Channel Bonding Driver: v5.15.0-91-generic

Bonding Mode: IEEE 802.3ad Dynamic link aggregation
Transmit Hash Policy: layer3+4 (1)
MII Status: up
MII Polling Interval (ms): 100
Up Delay (ms): 0
Down Delay (ms): 0
Peer Notification Delay (ms): 0

802.3ad info
LACP active: on
LACP rate: fast
Min links: 0
Aggregator selection policy (ad_select): stable
System priority: 65535
System MAC address: 3c:ec:ef:4a:10:02
Active Aggregator Info:
\tAggregator ID: 1
\tNumber of ports: 2
\tActor Key: 9
\tPartner Key: 1001
\tPartner Mac Address: 70:4c:a5:21:9e:80

Slave Interface: eno1
MII Status: up
Speed: 1000 Mbps
Duplex: full
Link Failure Count: 0
Permanent HW addr: 3c:ec:ef:4a:10:02
Slave queue ID: 0
Aggregator ID: 1
Actor Churn State: none
Partner Churn State: none
Actor Churned Count: 0
Partner Churned Count: 0
details actor lacp pdu:
    system priority: 65535
    system mac address: 3c:ec:ef:4a:10:02
    port key: 9
    port priority: 255
    port number: 1
    port state: 63
details partner lacp pdu:
    system priority: 32768
    system mac address: 70:4c:a5:21:9e:80
    oper key: 1001
    port priority: 128
    port number: 7
    port state: 63

Slave Interface: eno2
MII Status: up
Speed: 1000 Mbps
Duplex: full
Link Failure Count: 2
Permanent HW addr: 3c:ec:ef:4a:10:03
Slave queue ID: 0
Aggregator ID: 1
Actor Churn State: none
Partner Churn State: none
Actor Churned Count: 0
Partner Churned Count: 0
details actor lacp pdu:
    system priority: 65535
    system mac address: 3c:ec:ef:4a:10:02
    port key: 9
    port priority: 255
    port number: 2
    port state: 63
details partner lacp pdu:
    system priority: 32768
    system mac address: 70:4c:a5:21:9e:80
    oper key: 1001
    port priority: 128
    port number: 8
    port state: 63
"""

BOND_ACTIVE_BACKUP = """\
Ethernet Channel Bonding Driver: v6.1.0-18-amd64

Bonding Mode: fault-tolerance (active-backup)
Primary Slave: None
Currently Active Slave: enp3s0
MII Status: up
MII Polling Interval (ms): 100
Up Delay (ms): 0
Down Delay (ms): 0
Peer Notification Delay (ms): 0

Slave Interface: enp3s0
MII Status: up
Speed: 1000 Mbps
Duplex: full
Link Failure Count: 0
Permanent HW addr: 00:1b:21:aa:bb:01
Slave queue ID: 0

Slave Interface: enp4s0
MII Status: down
Speed: Unknown
Duplex: Unknown
Link Failure Count: 1
Permanent HW addr: 00:1b:21:aa:bb:02
Slave queue ID: 0
"""

MEMINFO = """\
MemTotal:       263856876 kB
MemFree:        12011804 kB
MemAvailable:   201456112 kB
Buffers:          812044 kB
Cached:         187046672 kB
SwapCached:            0 kB
Active:         58623540 kB
Inactive:       183214980 kB
Shmem:          104857600 kB
SwapTotal:       8388604 kB
SwapFree:        8388092 kB
Dirty:               148 kB
AnonHugePages:   2048000 kB
HugePages_Total:       0
HugePages_Free:        0
Hugepagesize:       2048 kB
DirectMap1G:    199229440 kB
"""

OS_RELEASE = """\
PRETTY_NAME="Ubuntu 22.04.4 LTS"
NAME="Ubuntu"
VERSION_ID="22.04"
VERSION="22.04.4 LTS (Jammy Jellyfish)"
VERSION_CODENAME=jammy
ID=ubuntu
ID_LIKE=debian
# a comment line
HOME_URL="https://www.ubuntu.com/"
"""

NVIDIA_SMI_CSV = """\
0, Tesla V100-PCIE-32GB, GPU-6b1c0a4e-8f2d-4c1e-9a55-0d2b3c4e5f60, 32768, 4, 7.0, 535.129.03, 0, 34, 00000000:3B:00.0
1, Tesla P40, GPU-1f2e3d4c-5b6a-7988-a1b2-c3d4e5f60718, 24576, 18211, 6.1, 535.129.03, 87, 61, 00000000:5E:00.0
2, Tesla P40, GPU-9a8b7c6d-5e4f-3a2b-1c0d-e9f8a7b6c5d4, 24576, [N/A], 6.1, 535.129.03, [Not Supported], [N/A], 00000000:86:00.0
"""


def cpuinfo_two_sockets() -> str:
    """/proc/cpuinfo of a dual Xeon E5-2680 v4 box cut down to 2 cores x 2 threads per socket."""
    blocks = []
    processor = 0
    for socket_id in (0, 1):
        for thread in (0, 1):
            for core in (0, 1):
                blocks.append(
                    textwrap.dedent(
                        f"""\
                        processor\t: {processor}
                        vendor_id\t: GenuineIntel
                        cpu family\t: 6
                        model\t\t: 79
                        model name\t: Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz
                        stepping\t: 1
                        cpu MHz\t\t: 1200.042
                        cache size\t: 35840 KB
                        physical id\t: {socket_id}
                        siblings\t: 4
                        core id\t\t: {core}
                        cpu cores\t: 2
                        apicid\t\t: {socket_id * 32 + core * 2 + thread}
                        flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep avx2
                        bogomips\t: 4800.08
                        """
                    )
                )
                processor += 1
    return "\n".join(blocks) + "\n"


# --- parsers -------------------------------------------------------------------------------


def test_bonding_8023ad_two_slaves() -> None:
    bond = parse_bonding(BOND_8023AD)
    assert bond["mode"] == "802.3ad"
    assert bond["mii_status"] == "up"
    assert bond["xmit_hash_policy"] == "layer3+4"
    assert bond["lacp_rate"] == "fast"
    assert bond["miimon_ms"] == 100
    assert bond["active_aggregator"] == {"id": 1, "ports": 2, "partner_mac": "70:4c:a5:21:9e:80"}
    assert [s["name"] for s in bond["slaves"]] == ["eno1", "eno2"]
    eno1, eno2 = bond["slaves"]
    assert eno1["mii_status"] == "up" and eno1["speed_mbps"] == 1000 and eno1["duplex"] == "full"
    # The LACP partner details repeat "system mac address"; they must not replace the slave's own.
    assert eno1["permanent_hw_addr"] == "3c:ec:ef:4a:10:02"
    assert eno2["permanent_hw_addr"] == "3c:ec:ef:4a:10:03"
    assert eno2["link_failure_count"] == 2
    assert eno1["in_active_aggregator"] and eno2["in_active_aggregator"]


def test_bonding_slave_outside_active_aggregator_is_flagged() -> None:
    head, _, eno2 = BOND_8023AD.partition("Slave Interface: eno2")
    text = head + "Slave Interface: eno2" + eno2.replace("Aggregator ID: 1", "Aggregator ID: 2")
    bond = parse_bonding(text)
    assert [s["in_active_aggregator"] for s in bond["slaves"]] == [True, False]


def test_bonding_active_backup_with_a_down_slave() -> None:
    bond = parse_bonding(BOND_ACTIVE_BACKUP)
    assert bond["mode"] == "active-backup"
    assert bond["active_slave"] == "enp3s0"
    assert "active_aggregator" not in bond
    down = bond["slaves"][1]
    assert down == {
        "name": "enp4s0",
        "mii_status": "down",
        "speed_mbps": None,
        "duplex": "Unknown",
        "link_failure_count": 1,
        "permanent_hw_addr": "00:1b:21:aa:bb:02",
    }


def test_meminfo_in_bytes() -> None:
    info = parse_meminfo(MEMINFO)
    assert info["MemTotal"] == 263856876 * 1024
    assert info["HugePages_Total"] == 0  # no unit: a count, not kB
    memory = memory_from_meminfo(info)
    assert memory["total_bytes"] == 263856876 * 1024
    assert memory["available_bytes"] == 201456112 * 1024
    assert memory["swap_total_bytes"] == 8388604 * 1024
    assert memory["shmem_bytes"] == 104857600 * 1024
    assert memory["total_gib"] == pytest.approx(251.63, abs=0.01)  # GiB, and named so


def test_meminfo_without_memavailable_estimates_it() -> None:
    old_kernel = "MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 20 kB\nCached: 300 kB\n"
    assert memory_from_meminfo(parse_meminfo(old_kernel))["available_bytes"] == 420 * 1024


def test_cpuinfo_two_sockets() -> None:
    cpu = parse_cpuinfo(cpuinfo_two_sockets())
    assert cpu == {
        "model": "Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz",
        "sockets": 2,
        "physical_cores": 4,
        "logical_cpus": 8,
    }


def test_cpuinfo_arm_without_topology() -> None:
    text = "processor\t: 0\nBogoMIPS\t: 108.00\nCPU part\t: 0xd08\n\nprocessor\t: 1\nBogoMIPS\t: 108.00\n\n"
    text += "Hardware\t: BCM2835\nModel\t\t: Raspberry Pi 4 Model B Rev 1.4\n"
    cpu = parse_cpuinfo(text)
    assert cpu["logical_cpus"] == 2
    assert cpu["sockets"] == 1
    assert cpu["physical_cores"] is None
    assert cpu["model"] == "Raspberry Pi 4 Model B Rev 1.4"


def test_os_release() -> None:
    release = parse_os_release(OS_RELEASE)
    assert release["ID"] == "ubuntu"
    assert release["VERSION_ID"] == "22.04"
    assert release["PRETTY_NAME"] == "Ubuntu 22.04.4 LTS"
    assert release["VERSION_CODENAME"] == "jammy"
    assert parse_os_release('NAME="say \\"hi\\""\nBAD="unbalanced\n') == {
        "NAME": 'say "hi"',
        "BAD": "unbalanced",
    }


def test_nvidia_smi_csv_with_unavailable_values() -> None:
    rows = parse_nvidia_smi_csv(NVIDIA_SMI_CSV)
    assert [r["index"] for r in rows] == [0, 1, 2]
    v100, p40, p40_b = rows
    assert v100["name"] == "Tesla V100-PCIE-32GB"
    assert v100["memory_total_bytes"] == 32768 * 1024**2
    assert v100["compute_capability"] == "7.0"
    assert v100["driver_version"] == "535.129.03"
    assert v100["pci_bus_id"] == "00000000:3B:00.0"
    assert p40["memory_used_bytes"] == 18211 * 1024**2
    assert p40["utilization_pct"] == 87 and p40["temperature_c"] == 61
    assert p40_b["memory_used_bytes"] is None
    assert p40_b["utilization_pct"] is None
    assert p40_b["temperature_c"] is None
    assert p40_b["uuid"] == "GPU-9a8b7c6d-5e4f-3a2b-1c0d-e9f8a7b6c5d4"


def test_version_strings() -> None:
    assert cuda_version_string(12020) == "12.2"
    assert cuda_version_string(11080) == "11.8"
    assert cuda_version_string(0) is None
    assert nccl_version_string((2, 18, 3)) == "2.18.3"
    assert nccl_version_string(21803) == "2.18.3"
    assert nccl_version_string(2708) == "2.7.8"


def test_ip_json_and_if_inet6() -> None:
    ip_json = json.dumps(
        [
            {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
            {
                "ifname": "bond0",
                "addr_info": [
                    {"family": "inet", "local": "192.168.1.10", "prefixlen": 24, "scope": "global"},
                    {"family": "inet6", "local": "fe80::3eec:efff:fe4a:1002", "prefixlen": 64},
                ],
            },
            {"ifname": "eno1", "addr_info": [{}]},
        ]
    )
    assert parse_ip_addr_json(ip_json) == {
        "lo": ["127.0.0.1/8"],
        "bond0": ["192.168.1.10/24", "fe80::3eec:efff:fe4a:1002/64"],
        "eno1": [],
    }
    inet6 = (
        "fe800000000000003eeceffffe4a1002 03 40 20 80    bond0\n"
        "fd000000000000000000000000000002 04 40 00 82     eth0\n"
        "00000000000000000000000000000001 01 80 10 80       lo\n"
    )
    parsed = parse_if_inet6(inet6)
    assert parsed["bond0"] == ["fe80::3eec:efff:fe4a:1002/64"]
    assert parsed["eth0"] == ["fd00::2/64"]
    assert parsed["lo"] == ["::1/128"]


def test_mounts_unescaped_and_pseudo_filesystems_dropped() -> None:
    text = textwrap.dedent(
        """\
        proc /proc proc rw,nosuid 0 0
        sysfs /sys sysfs rw 0 0
        cgroup2 /sys/fs/cgroup cgroup2 rw 0 0
        /dev/nvme0n1p2 / ext4 rw,relatime 0 0
        tmpfs /mnt/model-cache tmpfs rw,size=209715200k 0 0
        /dev/sdb1 /srv/my\\040models xfs rw 0 0
        /dev/loop3 /snap/core20/2015 squashfs ro 0 0
        overlay /var/lib/docker/overlay2/abc/merged overlay rw 0 0
        /dev/nvme0n1p2 / ext4 rw,relatime 0 0
        """
    )
    kept = select_mounts(parse_mounts(text))
    assert [m["mountpoint"] for m in kept] == ["/", "/mnt/model-cache", "/srv/my models"]
    assert kept[1]["fstype"] == "tmpfs"


# --- GPU sources, with a stand-in nvidia-smi on PATH -------------------------------------


def _fake_nvidia_smi(tmp_path: Path, body: str) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)


@pytest.fixture
def no_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import pynvml` raise ImportError, as on a host without it.
    monkeypatch.setitem(sys.modules, "pynvml", None)


@pytest.mark.usefixtures("no_pynvml")
def test_gpus_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "out.csv").write_text(NVIDIA_SMI_CSV)
    _fake_nvidia_smi(tmp_path, f'cat "{tmp_path}/out.csv"\n')
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    source, found = gpus.gather_gpus()
    assert source == "nvidia-smi"
    assert [g["name"] for g in found] == ["Tesla V100-PCIE-32GB", "Tesla P40", "Tesla P40"]
    assert all("cuda_driver_version" in g for g in found)


@pytest.mark.usefixtures("no_pynvml")
def test_gpus_from_old_driver_without_compute_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_nvidia_smi(
        tmp_path,
        'case "$1" in *compute_cap*) echo \'Field "compute_cap" is not a valid field to query.\'; exit 2;; esac\n'
        "echo '0, Tesla P4, GPU-1, 7680, 0, 470.223.02, 0, 40, 00000000:04:00.0'\n",
    )
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    source, found = gpus.gather_gpus()
    assert source == "nvidia-smi"
    assert found[0]["name"] == "Tesla P4"
    assert found[0]["compute_capability"] is None
    assert found[0]["driver_version"] == "470.223.02"
    assert found[0]["pci_bus_id"] == "00000000:04:00.0"


@pytest.mark.usefixtures("no_pynvml")
def test_broken_nvidia_smi_is_an_error_not_zero_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_nvidia_smi(
        tmp_path,
        'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."; exit 9\n',
    )
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with pytest.raises(gpus.GpuQueryError, match="couldn't communicate"):
        gpus.gather_gpus()
    result = facts.gather_facts({"sections": ["gpus"]})
    assert result["gpu_source"] == "error"
    assert "couldn't communicate" in result["gpus"]["error"]


@pytest.mark.usefixtures("no_pynvml")
def test_no_nvidia_tools_means_no_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpus.gather_gpus() == ("none", [])


def fake_pynvml(init_error: str | None = None) -> types.ModuleType:
    """A stand-in for nvidia-ml-py with its API names and quirks (bytes names on old
    versions, NVMLError subclasses per error code); there is no NVIDIA driver here."""
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    errors = {
        name: type("NVMLError_" + name, (NVMLError,), {})
        for name in ("NotSupported", "LibraryNotFound", "DriverNotLoaded")
    }
    devices = [
        ("Tesla V100-PCIE-32GB", 32768, 4, (7, 0), 34, "00000000:3B:00.0"),
        ("Tesla P40", 24576, 18211, (6, 1), None, "00000000:5E:00.0"),
    ]
    nvml.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    nvml.calls = []  # type: ignore[attr-defined]

    def init() -> None:
        nvml.calls.append("init")
        if init_error:
            raise errors[init_error]("NVML: " + init_error)

    def temperature(handle: int, sensor: int) -> int:
        value = devices[handle][4]
        if value is None:
            raise errors["NotSupported"]("Not Supported")
        return value

    nvml.__dict__.update(
        nvmlInit=init,
        nvmlShutdown=lambda: nvml.calls.append("shutdown"),
        nvmlSystemGetDriverVersion=lambda: b"535.129.03",
        nvmlSystemGetCudaDriverVersion_v2=lambda: 12020,
        nvmlDeviceGetCount=lambda: len(devices),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: devices[h][0].encode(),
        nvmlDeviceGetUUID=lambda h: f"GPU-{h:08d}",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(
            total=devices[h][1] * 1024**2, used=devices[h][2] * 1024**2, free=0
        ),
        nvmlDeviceGetCudaComputeCapability=lambda h: devices[h][3],
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=10 * h, memory=0),
        nvmlDeviceGetTemperature=temperature,
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=devices[h][5].encode()),
    )
    return nvml


def test_gpus_from_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    source, found = gpus.gather_gpus()
    assert source == "pynvml"
    assert found[0] == {
        "index": 0,
        "name": "Tesla V100-PCIE-32GB",
        "uuid": "GPU-00000000",
        "memory_total_bytes": 32768 * 1024**2,
        "memory_used_bytes": 4 * 1024**2,
        "compute_capability": "7.0",
        "driver_version": "535.129.03",
        "cuda_driver_version": "12.2",
        "utilization_pct": 0,
        "temperature_c": 34,
        "pci_bus_id": "00000000:3B:00.0",
        "power_w": None,
    }
    assert found[1]["compute_capability"] == "6.1"
    assert found[1]["temperature_c"] is None  # NotSupported on one field keeps the GPU
    assert nvml.calls == ["init", "shutdown"]


def test_pynvml_without_driver_library_means_no_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml("LibraryNotFound"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpus.gather_gpus() == ("none", [])


def test_pynvml_with_driver_not_loaded_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml("DriverNotLoaded"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(gpus.GpuQueryError, match="NVML init failed: NVML: DriverNotLoaded"):
        gpus.gather_gpus()


# --- facts assembled in-process -------------------------------------------------------------


def test_failing_section_does_not_sink_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> Any:
        raise PermissionError("/proc/cpuinfo: denied")

    monkeypatch.setitem(facts.SECTIONS, "cpu", broken)
    result = facts.gather_facts({"torch": False})
    assert result["cpu"] == {"error": "PermissionError: /proc/cpuinfo: denied", "kind": "PermissionError"}
    assert result["memory"]["total_bytes"] > 0
    assert result["torch"] == {"skipped": True}


def test_section_past_the_deadline_is_reported_as_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(facts.SECTIONS, "docker", lambda: time.sleep(5))
    result = facts.gather_facts({"sections": ["docker", "python"], "timeout_s": 0.3})
    assert result["docker"] == {"error": "did not finish within 0.3 s", "kind": "timeout"}
    assert result["python"]["version"]
    assert set(result) == {"docker", "python", "labctl"}


# --- the agent as a process -----------------------------------------------------------------


def run_agent(
    *argv: str, python: str = sys.executable, stdin: str | None = None
) -> tuple[int, dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [python, "-m", "labctl.agent", *argv],
        cwd=REPO,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, f"stdout must be one JSON line, got: {proc.stdout!r} (stderr {proc.stderr!r})"
    return proc.returncode, json.loads(lines[0])


def physical_nics() -> list[str]:
    net = "/sys/class/net"
    return sorted(n for n in os.listdir(net) if n != "lo" and os.path.isdir(os.path.join(net, n)))


def check_facts_match_this_host(result: dict[str, Any]) -> None:
    for section in SECTIONS:
        assert section in result, section
        value = result[section]
        if section not in ("torch", "docker"):
            assert not (isinstance(value, dict) and "error" in value), (section, value)
    expected = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert result["memory"]["total_bytes"] == pytest.approx(expected, rel=0.01)
    assert [n["name"] for n in result["nics"]] == physical_nics()
    assert result["cpu"]["logical_cpus"] == os.cpu_count()
    assert result["os"]["release"] == os.uname().release
    assert any(m["mountpoint"] == "/" for m in result["mounts"])
    root = next(m for m in result["mounts"] if m["mountpoint"] == "/")
    assert root["size_bytes"] == os.statvfs("/").f_blocks * os.statvfs("/").f_frsize
    assert result["labctl"]["agent_version"] == AGENT_VERSION
    assert result["labctl"]["elapsed_s"] >= 0


def test_facts_subprocess_describes_this_host() -> None:
    rc, result = run_agent("facts.collect")
    assert rc == 0, result
    check_facts_match_this_host(result)
    assert result["python"]["executable"] == sys.executable
    if shutil.which("nvidia-smi") is None and importlib.util.find_spec("pynvml") is None:
        assert result["gpu_source"] == "none"
        assert result["gpus"] == []


def test_facts_without_torch_skips_it() -> None:
    rc, result = run_agent("facts.collect", '{"torch": false}')
    assert rc == 0
    assert result["torch"] == {"skipped": True}
    assert "torch" not in result["labctl"]["sections_s"]


def test_ping() -> None:
    rc, result = run_agent("ping")
    assert rc == 0
    assert result["agent_version"] == AGENT_VERSION
    assert result["python_version"] == "{}.{}.{}".format(*sys.version_info[:3])
    assert isinstance(result["pid"], int) and result["pid"] != os.getpid()


@pytest.mark.parametrize(
    ("argv", "stdin", "kind"),
    [
        (("no-such-command",), None, "unknown_command"),
        (("facts.collect", "{not json"), None, "bad_args"),
        (("facts.collect", "[1, 2]"), None, "bad_args"),
        (("facts.collect", '{"sections": ["os", "gpu"]}'), None, "bad_args"),
        (("facts.collect", "-"), '{"sections": 3}', "bad_args"),
        (("facts.collect", '{"timeout_s": "soon"}'), None, "bad_args"),
        ((), None, "usage"),
    ],
)
def test_failures_exit_1_with_an_error_object(argv: tuple[str, ...], stdin: str | None, kind: str) -> None:
    rc, result = run_agent(*argv, stdin=stdin)
    assert rc == 1
    assert result["kind"] == kind
    assert result["error"]


def test_args_from_stdin() -> None:
    rc, result = run_agent("facts.collect", "-", stdin='{"sections": ["memory"], "torch": false}')
    assert rc == 0
    assert set(result) == {"memory", "labctl"}


def test_noise_from_a_command_goes_to_stderr() -> None:
    code = (
        "import os, sys\n"
        "from labctl.agent.commands import register\n"
        "from labctl.agent.__main__ import main\n"
        "def noisy(args):\n"
        "    print('python noise')\n"
        "    os.system('echo child noise')\n"
        "    return {'ok': True}\n"
        "register('noisy', noisy)\n"
        "sys.exit(main(['noisy']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == {"ok": True}
    assert "python noise" in proc.stderr and "child noise" in proc.stderr


def test_handler_exception_is_reported_with_traceback() -> None:
    code = (
        "import sys\n"
        "from labctl.agent.commands import register\n"
        "from labctl.agent.__main__ import main\n"
        "register('boom', lambda args: 1 / 0)\n"
        "sys.exit(main(['boom']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    result = json.loads(proc.stdout)
    assert result["kind"] == "exception"
    assert result["error"].startswith("ZeroDivisionError")
    assert "<lambda>" in result["traceback"] and "ZeroDivisionError" in result["traceback"]


# --- what ships: the zipapp, and Python 3.8 ------------------------------------------------


def build_zipapp(target: Path) -> None:
    """The archive labctl ships to hosts, built by the controller's own code."""
    target.write_bytes(agent_zip()[0])


def test_zipapp_runs_alone(tmp_path: Path) -> None:
    target = tmp_path / "agent.pyz"
    build_zipapp(target)
    # Run from an empty directory with no PYTHONPATH: nothing but the archive is importable.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, str(target), "facts.collect", '{"torch": false}'],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    check_facts_match_this_host(json.loads(proc.stdout))
    bad = subprocess.run(
        [sys.executable, str(target), "nope"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["kind"] == "unknown_command"


@pytest.mark.skipif(not PY38.exists(), reason=f"no Python 3.8 interpreter at {PY38}")
def test_python38_runs_module_and_zipapp(tmp_path: Path) -> None:
    rc, result = run_agent("facts.collect", python=str(PY38))
    assert rc == 0, result
    check_facts_match_this_host(result)
    assert result["python"]["version"].startswith("3.8.")
    rc, result = run_agent("nope", python=str(PY38))
    assert rc == 1 and result["kind"] == "unknown_command"

    target = tmp_path / "agent.pyz"
    build_zipapp(target)
    proc = subprocess.run(
        [str(PY38), str(target), "ping"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["python_version"].startswith("3.8.")


def _netns_usable() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = f"labctl-probe-{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        return False
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True


def test_nics_in_a_namespace_with_bridge_veth_and_addresses() -> None:
    if not _netns_usable():
        pytest.skip("needs root and `ip netns` to build links to inspect")
    ns = f"labctl-agent-{os.getpid()}"
    steps = [
        ["netns", "add", ns],
        ["-n", ns, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1"],
        ["-n", ns, "link", "add", "br0", "type", "bridge"],
        ["-n", ns, "link", "set", "veth0", "master", "br0"],
        ["-n", ns, "addr", "add", "10.9.0.1/24", "dev", "br0"],
        ["-n", ns, "addr", "add", "10.9.0.7/16", "dev", "br0"],
        ["-n", ns, "addr", "add", "fd00:9::1/64", "dev", "veth1"],
        ["-n", ns, "link", "set", "veth1", "mtu", "9000"],
    ]
    try:
        for step in steps:
            subprocess.run(["ip", *step], check=True, capture_output=True)
        proc = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                ns,
                sys.executable,
                "-m",
                "labctl.agent",
                "facts.collect",
                '{"sections": ["nics"]}',
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        nics = {n["name"]: n for n in json.loads(proc.stdout)["nics"]}
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    assert sorted(nics) == ["br0", "veth0", "veth1"]
    assert nics["br0"]["addresses"] == ["10.9.0.1/24", "10.9.0.7/16"]
    assert nics["veth1"]["addresses"] == ["fd00:9::1/64"]
    assert nics["veth0"]["master"] == "br0"
    assert nics["br0"]["master"] is None
    assert nics["veth1"]["mtu"] == 9000
    assert all(n["virtual"] and not n["is_bond"] and n["operstate"] == "down" for n in nics.values())
