"""The LLM orchestra on the simulated lab: real tinylm checkpoints on irina, m5's RAM cache,
labctl's own model server on m5's CPU (the sim has no GPU; the GPUs are the inventory's declared
ones), over real SSH.

Servers are found the way the agent finds them, from this machine's /proc (the sim's hosts share
its kernel): processes tagged LABCTL_ORCH_MODEL for LABCTL_HOST=m5.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.core import paths
from labctl.agent.orchestra.client import Endpoint, ask_all, load_endpoints
from tests.conftest import REPO, labctl, m5_cache, orchestra_lab, run_json, sh

pytestmark = pytest.mark.integration
LIBRARY = ["orch-a", "orch-b", "orch-c", "orch-d", "orch-e"]
WARM_JSON = "/var/lib/labctl/orchestra/warm.json"


# Host name -> its network namespace's inode: this machine's /proc also holds the servers of
# any other simulated lab running beside the tests (`make demo`'s has an m5 too).
NETNS: dict[str, int] = {}


def servers(host: str = "m5") -> dict[int, str]:
    """pid (as this machine sees it) → model of the orchestra servers running on the test lab's
    `host` (group leaders only)."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
            if os.stat(f"/proc/{name}/ns/net").st_ino != NETNS[host]:
                continue
        except OSError:
            continue
        if env.get(b"LABCTL_HOST") == host.encode() and b"LABCTL_ORCH_MODEL" in env:
            pid = int(name)
            try:
                if os.getpgid(pid) != pid:
                    continue
            except OSError:
                continue
            out[pid] = env[b"LABCTL_ORCH_MODEL"].decode()
    return out


def answers(address: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/health", timeout=3) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def phase3_dry_run(inv: Path) -> subprocess.CompletedProcess[str]:
    """Phase 3's preflight on m5 (CPU), which reads the orchestra's warm.json. The sandbox's
    part is left out here: test_phase3_lab.py checks it with a sandbox served."""
    argv = [
        "train",
        "--set",
        "requires_sandbox=false",
        "--phase",
        "3",
        "--dry-run",
        "--limit",
        "m5",
        "--device",
        "cpu",
        "--python",
        sys.executable,
    ]
    return labctl("-i", str(inv), *argv, timeout=200)


def warm_json(inv: Path) -> dict[str, Any]:
    return json.loads(sh(inv, "m5", f"cat {WARM_JSON}"))  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def orch(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """The lab's inventory with m5's cache mounted, five tiny models on irina, and an orchestra
    file beside a copy of the inventory: m5 serves 3 warm models, rotating 1 at a time."""
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
        folder = tmp_path_factory.mktemp("orch")
        copy = orchestra_lab(
            inv,
            folder,
            {
                "hosts": "m5",
                "warm": 3,
                "rotate": 1,
                "every": "4h",
                "pinned": ["orch-a"],
                "server": {"python": sys.executable, "start_timeout": 180, "stop_grace": 10},
                "models": [{"name": n, "size_gb": 0.004} for n in LIBRARY],
            },
        )
        try:
            yield copy, folder
        finally:
            labctl("-i", str(copy), "orchestra", "stop", timeout=120)
            for pid in servers():
                os.kill(pid, signal.SIGKILL)
            sh(inv, "m5", "rm -rf /var/lib/labctl/orchestra")
            sh(inv, "irina", "rm -rf " + " ".join(f"/srv/models/{n}" for n in LIBRARY))


def test_plan_places_the_warm_set_on_the_p40s_and_leaves_the_v100_to_training(
    orch: tuple[Path, Path],
) -> None:
    inv, _ = orch
    rc, doc = run_json(inv, "orchestra", "plan")
    assert rc == 0, doc
    placed = {p["model"]: p for p in doc["placement"]}
    assert set(placed) == {"orch-a", "orch-b", "orch-c"}
    assert {p["gpu_model"] for p in placed.values()} == {"Tesla P40"}
    assert all(p["host"] == "m5" for p in placed.values())


def trainers_endpoints(inv: Path, tmp_path: Path) -> list[Endpoint]:
    """What m5's trainer would ask now: its endpoints.json, read by the trainer's own client."""
    text = sh(inv, "m5", f"stat -c %a {paths.ORCHESTRA_ENDPOINTS}; cat {paths.ORCHESTRA_ENDPOINTS}")
    mode, doc = text.split("\n", 1)
    assert mode == "644" and 'api_key"' not in doc
    copy = tmp_path / "endpoints.json"
    copy.write_text(doc)
    return load_endpoints(str(copy), environ={})


def test_start_then_rotate_then_phase3_preflight(orch: tuple[Path, Path], lab: Any, tmp_path: Path) -> None:
    inv, _ = orch
    m5 = lab.hosts["m5"]
    rc, doc = run_json(inv, "orchestra", "start", timeout=400)
    assert rc == 0, doc
    warm = warm_json(inv)
    loaded = {m["name"]: m for m in warm["models"]}
    assert set(loaded) == {"orch-a", "orch-b", "orch-c"} and all(
        m["state"] == "loaded" for m in loaded.values()
    )
    # Exactly the planned servers run, and each answers on its recorded port.
    assert sorted(servers().values()) == ["orch-a", "orch-b", "orch-c"]
    assert all(answers(m5, m["port"]) for m in loaded.values())
    assert {t["model"]: t["cache_hit"] for t in doc["joined"]} == dict.fromkeys(loaded, False)
    # The host that trains (m5) was told where the warm set answers; the trainer's client reads
    # that file and asks all three at once over the lab network, each answering as itself.
    before = trainers_endpoints(inv, tmp_path)
    assert [(e.name, e.base_url) for e in before] == [
        (n, f"http://{m5}:{m['port']}/v1") for n, m in sorted(loaded.items())
    ]
    assert [p["why"] for p in doc["published"]] == ["joined", "committed"]
    got = ask_all(before, "def f(x):", max_tokens=8)
    assert [(a.name, a.answered_by, a.ok, a.completion_tokens) for a in got] == [
        (n, n, True, 8) for n in sorted(loaded)
    ], got
    # `orchestra ask` from the controller asks the same servers, and gets the same answers.
    rc, asked = run_json(inv, "orchestra", "ask", "--max-tokens", "8", "def f(x):")
    assert rc == 0, asked
    assert {a["name"]: a["text"] for a in asked["answers"]} == {a.name: a.text for a in got}
    assert asked["cycle_s"] > 0 and asked["sum_s"] >= max(a["latency_s"] for a in asked["answers"])

    # A second start changes nothing.
    rc, again = run_json(inv, "orchestra", "start", timeout=200)
    assert rc == 0 and again["joined"] == [] and again["changed"] is False

    rc, doc = run_json(inv, "rotate", timeout=400)
    assert rc == 0, doc
    (joined,) = [t["model"] for t in doc["joined"]]
    (left,) = [t["model"] for t in doc["left"]]
    assert joined == "orch-d" and left == "orch-b"  # next in the library; oldest non-pinned
    after = {m["name"]: m for m in warm_json(inv)["models"]}
    assert set(after) == {"orch-a", "orch-c", "orch-d"}
    assert sorted(servers().values()) == ["orch-a", "orch-c", "orch-d"]
    assert answers(m5, after["orch-d"]["port"]) and not answers(m5, loaded["orch-b"]["port"])
    assert doc["stages"]["load"] > 0 and doc["stages"]["warmup"] > 0
    # orch-b left the trainers' file before its server stopped (the drain), orch-d joined it once healthy.
    assert [(p["why"], sorted(p["models"])) for p in doc["published"]] == [
        ("joined", ["orch-a", "orch-b", "orch-c", "orch-d"]),
        ("draining", ["orch-a", "orch-c", "orch-d"]),
        ("committed", ["orch-a", "orch-c", "orch-d"]),
    ]
    assert all(p["hosts"] == {"m5": "ok"} for p in doc["published"])
    assert sorted(e.name for e in trainers_endpoints(inv, tmp_path)) == ["orch-a", "orch-c", "orch-d"]
    # A client still holding the old warm set: orch-b's request goes to a model that answers.
    got = ask_all(before, "def f(x):", max_tokens=8)
    assert [(a.answered_by == a.name, a.retried) for a in got] == [
        (True, False),
        (False, True),
        (True, False),
    ]
    assert all(a.ok for a in got) and got[1].answered_by in {"orch-a", "orch-c"}

    rc, st = run_json(inv, "orchestra", "status")
    assert rc == 0 and st["healthy"] == 3 and st["last_rotation"]["joined"] == ["orch-d"]
    # No `cron install rotate` yet: no next rotation, whatever the file's every says.
    assert st["next_rotation_at"] is None and st["schedule"]["installed"] is False

    proc = phase3_dry_run(inv)
    assert proc.returncode == 0, proc.stderr


def test_two_rotations_at_once_never_overlap(orch: tuple[Path, Path]) -> None:
    inv, _ = orch
    argv = [sys.executable, "-m", "labctl", "--json", "-i", str(inv), "rotate"]
    procs = [
        subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    docs = [json.loads(o[0]) for o in outs]
    assert max(d["waited_for_lock"] for d in docs) > 1.0  # the second waited for the first
    history = [
        json.loads(line) for line in sh(inv, "m5", "cat /var/lib/labctl/orchestra/history.jsonl").splitlines()
    ]
    rotations = [h for h in history if h["kind"] == "rotate"][-2:]
    a, b = sorted(rotations, key=lambda h: h["at"])
    assert b["started"] >= a["at"]  # the second began (took the lock) after the first had ended
    assert len(servers()) == 3 and len(warm_json(inv)["models"]) == 3


def test_a_rotation_killed_half_way_is_repaired_by_the_next(orch: tuple[Path, Path], lab: Any) -> None:
    inv, _ = orch
    before = {m["name"] for m in warm_json(inv)["models"]}
    proc = subprocess.Popen(
        [sys.executable, "-m", "labctl", "-i", str(inv), "rotate"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(servers()) <= 3:
        time.sleep(0.2)
    assert len(servers()) == 4, "the joining server never started"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)
    orphans = {pid: m for pid, m in servers().items() if m not in before}
    assert orphans, "a joining server outlives the killed rotation (a detached process): the repair has work"

    rc, st = run_json(inv, "orchestra", "status")
    assert rc == 1 and st["problems"]  # status sees it and says the next rotation repairs it

    rc, doc = run_json(inv, "rotate", timeout=400)
    assert rc == 0, doc
    assert any("not in warm.json" in n for n in doc["repairs"])
    for pid in orphans:
        assert pid not in servers()
    warm = {m["name"]: m for m in warm_json(inv)["models"]}
    assert sorted(servers().values()) == sorted(warm) and len(warm) == 3
    assert all(answers(lab.hosts["m5"], m["port"]) for m in warm.values())


def test_pinned_and_unknown_models_are_refused_and_nothing_changes(orch: tuple[Path, Path]) -> None:
    inv, _ = orch
    before = warm_json(inv)
    proc = labctl("-i", str(inv), "rotate", "--out", "orch-a")
    assert proc.returncode == 2 and "pinned" in proc.stderr and "Traceback" not in proc.stderr
    proc = labctl("-i", str(inv), "rotate", "--in", "no-such-model")
    assert proc.returncode == 2 and "no-such-model" in proc.stderr
    assert warm_json(inv)["models"] == before["models"]


def test_rotation_scheduled_on_pharaoh_runs_over_ssh_from_there(orch: tuple[Path, Path], lab: Any) -> None:
    """`cron install rotate` twice leaves one entry on the orchestrator; its command, run by hand
    there, is a rotation over SSH from pharaoh (its own labctl copy, key and lab copy)."""
    from tests.integration.test_cron_jobs import run_cron_entry

    inv, _ = orch
    before = {m["name"] for m in warm_json(inv)["models"]}
    try:
        rc, first = run_json(inv, "cron", "install", "rotate", timeout=600)  # every: the file's 4h
        assert rc == 0, first
        assert first["host"] == "pharaoh" and first["schedule"] == "0 */4 * * *"
        rc, second = run_json(inv, "cron", "install", "rotate", timeout=600)
        assert rc == 0 and second["changed"] is False, second
        assert sh(inv, "pharaoh", "ls /etc/cron.d | grep -c '^labctl-rotate$'").strip() == "1"
        assert sh(inv, "m5", "test -e /var/lib/labctl/controller && echo yes || echo no").strip() == "no"

        ran = run_cron_entry(inv, "pharaoh", "rotate")
        log = sh(inv, "pharaoh", "tail -40 /var/log/labctl/rotate.log")
        assert ran["rc"] == 0, (ran, log)
        after = {m["name"] for m in warm_json(inv)["models"]}
        assert len(after) == 3 and after != before and "orch-a" in after
        assert sorted(servers().values()) == sorted(after)
        assert "rotate: in:" in log  # the rotation's own summary, written on pharaoh
        rc, listed = run_json(inv, "cron", "list")
        (job,) = [j for j in listed["jobs"] if j["host"] == "pharaoh" and j["name"] == "rotate"]
        assert job["last"]["rc"] == 0
    finally:
        run_json(inv, "cron", "remove", "rotate", "--purge", timeout=300)


def test_stop_unloads_everything_and_phase3_then_refuses(orch: tuple[Path, Path]) -> None:
    inv, _ = orch
    rc, doc = run_json(inv, "orchestra", "stop", timeout=200)
    assert rc == 0, doc
    assert servers() == {} and warm_json(inv)["models"] == []
    proc = phase3_dry_run(inv)
    assert proc.returncode == 1 and "orchestra start" in proc.stderr
