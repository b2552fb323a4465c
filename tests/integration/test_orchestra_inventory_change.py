"""The orchestra after the inventory changed under it, on the simulated lab: a GPU removed, servers
started outside warm.json, another lab's server on the same machine, a serving host renamed away.

The sim has no GPU: m5's GPUs are the inventory's declared P40s (mocked by declaration), and
labctl's own model server runs each tiny model on the CPU with the GPU index only as its tag.
What runs is read the way the agent reads it, from this machine's /proc (the sim's hosts share
its kernel): processes tagged LABCTL_ORCH_* in m5's network namespace.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, labctl, m5_cache, run_json, sh
from tests.integration.test_orchestra import NETNS, WARM_JSON

# Each test starts real servers a few times over SSH on two shared cores; the first also makes the
# models and mounts m5's cache, the last takes them down.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
LIBRARY = ["inv-a", "inv-b", "inv-c"]


def tagged(host: str = "m5") -> list[dict[str, Any]]:
    """Every orchestra server (group leader) in `host`'s namespace, of any lab: pid, lab, host,
    model and GPU tag."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}/ns/net").st_ino != NETNS[host]:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
            if b"LABCTL_ORCH_MODEL" not in env or os.getpgid(int(name)) != int(name):
                continue
        except OSError:
            continue
        gpu = env.get(b"LABCTL_ORCH_GPU", b"").decode()
        out.append(
            {
                "pid": int(name),
                "lab": env.get(b"LABCTL_LAB", b"").decode(),
                "host": env.get(b"LABCTL_HOST", b"").decode(),
                "model": env[b"LABCTL_ORCH_MODEL"].decode(),
                "gpu": int(gpu) if gpu.isdigit() else None,
            }
        )
    return out


def ours(lab: str, host: str = "m5") -> list[dict[str, Any]]:
    return [s for s in tagged() if s["lab"] == lab and s["host"] == host]


def warm_json(inv: Path) -> dict[str, Any]:
    return json.loads(sh(inv, "m5", f"cat {WARM_JSON}"))  # type: ignore[no-any-return]


def write_inventory(inv: Path, doc: dict[str, Any], p40s: int, rename_m5: str | None = None) -> None:
    """The lab's inventory with m5's GPUs declared as `p40s` Tesla P40s (indices 0..p40s-1), and
    m5 under another name when `rename_m5` is given."""
    out = json.loads(json.dumps(doc))
    out["hosts"]["m5"]["gpus"] = [{"model": "Tesla P40", "memory_gb": 24, "count": p40s}]
    if rename_m5:
        out["hosts"][rename_m5] = out["hosts"].pop("m5")
    inv.write_text(yaml.safe_dump(out))


def start_tagged(inv: Path, lab: str, host: str, model: str, gpu: int) -> None:
    """A process tagged as `lab`'s orchestra server for `host`, started by hand on m5 (detached,
    not in warm.json): what the agent takes for a server."""
    tags = (
        f"LABCTL_LAB={lab} LABCTL_HOST={host} LABCTL_ORCH_MODEL={model} LABCTL_ORCH_PORT=1 "
        f"LABCTL_ORCH_GPU={gpu} LABCTL_ORCH_STARTED=1"
    )
    sh(inv, "m5", f"setsid -f env {tags} sleep 3600 </dev/null >/dev/null 2>&1")
    # `setsid -f` returns before its child has become `env ... sleep`: wait until the tags show.
    deadline = time.monotonic() + 30
    while not any(s["lab"] == lab and s["model"] == model for s in tagged()):
        assert time.monotonic() < deadline, f"the by-hand server {model} never showed on m5"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def changing(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    """A copy of the lab's inventory whose m5 declares two P40s, three tiny models on irina, and
    an orchestra file beside it: m5 keeps 2 warm, rotating 1. Yields (inventory, its document)."""
    inv = lab.inventory_path
    NETNS.update({h: os.stat(f"/run/netns/{lab.namespace(h)}").st_ino for h in lab.hosts})
    with m5_cache(lab):
        for name in LIBRARY:
            labctl(
                "-i",
                str(inv),
                "bench",
                "make-model",
                "--size-gb",
                "0.004",
                "--name",
                name,
                "--host",
                "irina",
                check=True,
            )
        folder = tmp_path_factory.mktemp("orch-inv")
        copy = folder / "lab.yaml"
        doc = yaml.safe_load(inv.read_text())
        for key in ("ssh_key", "known_hosts"):
            doc["defaults"][key] = str((inv.parent / doc["defaults"][key]).resolve())
        write_inventory(copy, doc, 2)
        (folder / "playbooks").mkdir()
        (folder / "playbooks" / "train.yaml").write_text((REPO / "playbooks" / "train.yaml").read_text())
        (folder / "playbooks" / "orchestra.yaml").write_text(
            yaml.safe_dump(
                {
                    "hosts": "m5",
                    "warm": 2,
                    "rotate": 1,
                    "every": "4h",
                    "server": {"python": sys.executable, "start_timeout": 180, "stop_grace": 5},
                    "models": [{"name": n, "size_gb": 0.004} for n in LIBRARY],
                }
            )
        )
        try:
            yield copy, doc
        finally:
            write_inventory(copy, doc, 2)
            labctl("-i", str(copy), "orchestra", "stop", timeout=120)
            for s in tagged():
                if s["model"] in LIBRARY or s["model"].startswith("by-hand"):
                    os.kill(s["pid"], signal.SIGKILL)
            sh(inv, "m5", "rm -rf /var/lib/labctl/orchestra")
            sh(inv, "irina", "rm -rf " + " ".join(f"/srv/models/{n}" for n in LIBRARY))


def start_on_two_gpus(inv: Path, doc: dict[str, Any], lab: str) -> None:
    write_inventory(inv, doc, 2)
    rc, out = run_json(inv, "orchestra", "start", timeout=400)
    assert rc == 0, out
    assert sorted(m["gpu"] for m in warm_json(inv)["models"]) == [0, 1]
    assert sorted(s["gpu"] for s in ours(lab)) == [0, 1]


def test_rotate_after_a_gpu_left_the_inventory_keeps_the_warm_count_on_the_gpu_that_remains(
    changing: tuple[Path, dict[str, Any]],
) -> None:
    inv, doc = changing
    lab = doc["lab"]
    start_on_two_gpus(inv, doc, lab)

    write_inventory(inv, doc, 1)  # GPU 1 is gone
    rc, out = run_json(inv, "rotate", timeout=400)
    assert rc == 0, out
    running = ours(lab)
    assert len(running) == 2 and {s["gpu"] for s in running} == {0}, running
    warm = warm_json(inv)
    assert len(warm["models"]) == 2 and {m["gpu"] for m in warm["models"]} == {0}
    assert sorted(m["name"] for m in warm["models"]) == sorted(s["model"] for s in running)
    assert any("GPU 1 is gone from the inventory" in why for why in out["plan"]["why"].values()), out["plan"]

    rc, again = run_json(inv, "rotate", "--dry-run")
    assert rc == 0 and again["plan"]["displaced"] == {}


def test_stop_after_a_gpu_left_stops_every_server_of_the_lab_and_no_other_labs(
    changing: tuple[Path, dict[str, Any]],
) -> None:
    inv, doc = changing
    lab = doc["lab"]
    run_json(inv, "orchestra", "stop", timeout=200)
    start_on_two_gpus(inv, doc, lab)
    start_tagged(inv, lab, "m5", "by-hand-ours", 0)  # this lab's, outside warm.json
    start_tagged(inv, "another-lab", "m5", "by-hand-theirs", 0)  # another lab's, same machine
    theirs = [s for s in tagged() if s["lab"] == "another-lab"]
    assert len(theirs) == 1 and len(ours(lab)) == 3
    try:
        write_inventory(inv, doc, 1)
        rc, out = run_json(inv, "orchestra", "stop", timeout=200)
        assert rc == 0, out
        assert ours(lab) == []  # the server on GPU 1 and the one started by hand too
        assert [s["pid"] for s in tagged() if s["lab"] == "another-lab"] == [theirs[0]["pid"]]
        assert warm_json(inv)["models"] == []
    finally:
        for s in tagged():
            if s["lab"] == "another-lab":
                os.kill(s["pid"], signal.SIGKILL)


def test_a_serving_host_gone_from_the_inventory_is_named_with_the_command_that_stops_its_servers(
    changing: tuple[Path, dict[str, Any]],
) -> None:
    """m5 renamed m5b in the inventory: to this lab, host m5 is gone (its servers keep their m5
    tag). The rotation by the new inventory exits 1 naming m5's servers and the ssh command that
    stops them; that command's kill, run on the machine, stops exactly them."""
    inv, doc = changing
    lab = doc["lab"]
    run_json(inv, "orchestra", "stop", timeout=200)
    start_on_two_gpus(inv, doc, lab)
    old = sorted(s["pid"] for s in ours(lab))  # as this machine sees them
    recorded = sorted(m["pid"] for m in warm_json(inv)["models"])  # as m5 sees them (its pid namespace)
    try:
        orch = inv.parent / "playbooks" / "orchestra.yaml"
        spec = yaml.safe_load(orch.read_text())
        orch.write_text(yaml.safe_dump({**spec, "hosts": "m5b"}))
        write_inventory(inv, doc, 2, rename_m5="m5b")
        proc = labctl("--json", "-i", str(inv), "orchestra", "start", timeout=400)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        err = json.loads(proc.stdout)
        assert "m5: no longer in the inventory" in err["error"], err
        address = doc["hosts"]["m5"]["address"]
        command = f"ssh root@{address} 'kill -TERM " + " ".join(f"-{p}" for p in recorded) + "'"
        assert command in err["error"], err
        assert sorted(s["pid"] for s in ours(lab)) == old  # named, not touched (labctl cannot reach "m5")
        # The named command's kill, run there, stops them; the next start is clean.
        rc, _ = run_json(inv, "exec", "-l", "m5b", "--", command.split(" ", 2)[2].strip("'"))
        assert rc == 0
        deadline = time.monotonic() + 60  # SIGTERM: each server ends its loop, then exits
        while ours(lab) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ours(lab) == []
        rc, out = run_json(inv, "orchestra", "start", timeout=400)
        assert rc == 0 and out["left_behind"] == [], out
        assert len(ours(lab, "m5b")) == 2
    finally:
        orch.write_text(yaml.safe_dump(spec))
        write_inventory(inv, doc, 2, rename_m5="m5b")
        labctl("-i", str(inv), "orchestra", "stop", timeout=200)
        write_inventory(inv, doc, 2)
