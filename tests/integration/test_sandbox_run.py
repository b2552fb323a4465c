"""`labctl sandbox run` and `labctl.sandbox.run_many` against the real dockerd on this machine:
through a `connection: local` host, and through a simulated host over SSH (the sim's hosts share
this machine's dockerd and /run)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.sandbox import run_many
from labctl.sandbox.limits import MIB
from tests.conftest import ON_THIS_MACHINE, REPO, labctl

pytestmark = [pytest.mark.integration, ON_THIS_MACHINE]

IMAGE_PACKAGES = {"python": "python3-minimal", "c": "gcc,libc6-dev"}


def _docker_ok() -> bool:
    return (
        shutil.which("docker") is not None
        and subprocess.run(["docker", "info"], capture_output=True).returncode == 0
    )


def _start_dockerd() -> str | None:
    """Why Docker cannot run here, or None once `docker info` answers (dockerd started if need be)."""
    if shutil.which("docker") is None or shutil.which("dockerd") is None:
        return "docker.io is not installed"
    if os.geteuid() != 0:
        return "needs root to reach or start dockerd"
    if _docker_ok():
        return None
    with open("/tmp/dockerd.log", "ab") as log:
        subprocess.Popen(["dockerd"], stdout=log, stderr=log, start_new_session=True)
    for _ in range(60):
        if _docker_ok():
            return None
        time.sleep(0.5)
    return "dockerd did not start (see /tmp/dockerd.log)"


@pytest.fixture(scope="session")
def sandbox_images(docker_images: dict[str, Any]) -> None:
    """labctl-sandbox/{python,c}:latest, built by labctl's own builder (conftest's docker_images)."""


@pytest.fixture(scope="module")
def local_inv(sandbox_images: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    inv = tmp_path_factory.mktemp("sbx") / "local.yaml"
    doc = {
        "lab": "l",
        "hosts": {
            "here": {
                "address": "127.0.0.1",
                "connection": "local",
                "python": "/usr/bin/python3",
                "roles": ["sandbox"],
                "sandbox": {"languages": ["python", "c"], "pool": 4},
            }
        },
    }
    inv.write_text(yaml.safe_dump(doc))
    return inv


@pytest.fixture(scope="module")
def sim_inv(sandbox_images: None, lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The sim's inventory with absolute key paths; irina (role sandbox) runs the pool over SSH."""
    doc = yaml.safe_load(lab.inventory_path.read_text())
    doc["defaults"]["ssh_key"] = str(lab.key_path)
    doc["defaults"]["known_hosts"] = str(lab.known_hosts_path)
    doc["hosts"]["irina"]["roles"] = ["storage", "sandbox"]
    doc["hosts"]["irina"]["sandbox"] = {"languages": ["python", "c"], "pool": 2}
    out = tmp_path_factory.mktemp("sbx-sim") / "inventory.yaml"
    out.write_text(yaml.safe_dump(doc))
    yield out


def sandbox_run(inv: Path, source: str, *args: str) -> tuple[int, dict[str, Any]]:
    path = inv.parent / f"prog-{uuid.uuid4().hex[:8]}"
    path.write_text(source)
    proc = labctl("--json", "-i", str(inv), "sandbox", "run", str(path), *args, timeout=180)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def gone(container: str, tries: int = 80) -> bool:
    """Whether `container` is no longer in Docker at all (killed and removed), within 20 s."""
    for _ in range(tries):
        out = subprocess.run(
            ["docker", "ps", "-aq", "--filter", "label=labctl.sandbox=1", "--filter", f"name=^/{container}$"],
            capture_output=True,
            text=True,
        ).stdout
        if not out.strip():
            return True
        if tries > 1:
            time.sleep(0.25)
    return False


def no_process(marker: str) -> bool:
    for _ in range(80):
        if subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode != 0:
            return True
        time.sleep(0.25)
    return False


@pytest.fixture(params=["local", "sim"])
def inv(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue("local_inv" if request.param == "local" else "sim_inv")


def test_exit_code_stdin_and_stderr_come_back(inv: Path) -> None:
    stdin = inv.parent / "in.txt"
    stdin.write_text("lab\n")
    src = "import sys\nprint('got', sys.stdin.read().strip())\nprint('to stderr', file=sys.stderr)\nsys.exit(7)\n"
    rc, doc = sandbox_run(inv, src, "--lang", "python", "--stdin", str(stdin))
    assert rc == 7  # the CLI exits with the program's own code
    assert doc["exit_code"] == 7 and doc["stdout"] == "got lab\n" and doc["stderr"] == "to stderr\n"
    assert not (doc["timed_out"] or doc["oom_killed"] or doc["truncated"])
    assert set(doc) == {
        "lang",
        "exit_code",
        "stdout",
        "stderr",
        "truncated",
        "timed_out",
        "oom_killed",
        "wall_ms",
    }


def test_a_compiled_language_compiles_then_runs(inv: Path) -> None:
    src = '#include <stdio.h>\nint main(void) { char b[64]; fgets(b, 64, stdin); printf("c:%s", b); return 3; }\n'
    stdin = inv.parent / "in-c.txt"
    stdin.write_text("x\n")
    rc, doc = sandbox_run(inv, src, "--lang", "c", "--stdin", str(stdin))
    assert (rc, doc["exit_code"], doc["stdout"]) == (3, 3, "c:x\n")
    rc, doc = sandbox_run(inv, "int main(void) { return nope; }\n", "--lang", "c")
    assert rc != 0 and "nope" in doc["stderr"]  # the compiler's own message


def test_timeout_kills_the_container_and_everything_in_it(local_inv: Path) -> None:
    marker = f"sbx-escape-{uuid.uuid4().hex[:8]}"
    # a detached grandchild in its own session that ignores SIGTERM: it must die with the run
    src = (
        "import os, subprocess, time\n"
        f"subprocess.Popen(['sh', '-c', 'trap \"\" TERM; sleep 1000; : {marker}'], start_new_session=True)\n"
        "time.sleep(1000)\n"
    )
    res = run_many([{"lang": "python", "source": src, "timeout": 1.5}], inventory=local_inv)[0]
    assert res["timed_out"] and res["exit_code"] is None
    assert gone(res["container"])
    assert no_process(marker)
    rc, doc = sandbox_run(local_inv, "while True: pass\n", "--lang", "python", "--timeout", "1")
    assert rc == 124 and doc["timed_out"]


def test_memory_limit_is_reported_as_oom(inv: Path) -> None:
    rc, doc = sandbox_run(
        inv, "x = bytearray(200 * 1024 * 1024)\nprint('survived')\n", "--lang", "python", "--memory", "64"
    )
    assert doc["oom_killed"] and doc["exit_code"] == 137 and rc == 137, doc
    assert "survived" not in doc["stdout"]
    rc, doc = sandbox_run(
        inv, "x = bytearray(20 * 1024 * 1024)\nprint('fits')\n", "--lang", "python", "--memory", "64"
    )
    assert rc == 0 and doc["stdout"] == "fits\n" and not doc["oom_killed"]


def test_output_is_capped_while_streaming(inv: Path) -> None:
    src = "import sys\nsys.stdout.write('x' * (5 * 1024 * 1024))\nsys.stderr.write('e' * 10)\n"
    rc, doc = sandbox_run(inv, src, "--lang", "python")
    assert rc == 0 and doc["truncated"]
    assert doc["stdout"] == "x" * MIB and doc["stderr"] == "e" * 10


def test_64_concurrent_submissions_none_lost_none_mixed(inv: Path) -> None:
    progs = [
        {"lang": "python", "source": f"import sys\nprint({i}, sys.stdin.read())\n", "stdin": f"in{i}"}
        for i in range(64)
    ]
    results = run_many(progs, inventory=inv, concurrency=64)
    assert len(results) == 64
    assert [r["stdout"] for r in results] == [f"{i} in{i}\n" for i in range(64)]
    assert all(r["exit_code"] == 0 and not r["timed_out"] for r in results)
    assert len({r["container"] for r in results}) == 64  # each container used exactly once


def test_pool_survives_between_calls_and_is_adopted(local_inv: Path) -> None:
    first = run_many([{"lang": "python", "source": "print(1)"}], inventory=local_inv)[0]
    assert first["exit_code"] == 0
    # the next agent process (a new call) takes a container the previous one left idle
    second = run_many([{"lang": "python", "source": "print(2)"}], inventory=local_inv)[0]
    assert second["warm"] and second["stdout"] == "2\n"


def _lab_inv(lab: str, folder: Path) -> Path:
    inv = folder / f"{lab}.yaml"
    host = {"address": "127.0.0.1", "connection": "local", "python": "/usr/bin/python3", "roles": ["sandbox"]}
    host["sandbox"] = {"languages": ["python"], "pool": 2}
    inv.write_text(yaml.safe_dump({"lab": lab, "hosts": {"here": host}}))
    return inv


def _idle_of(lab: str) -> set[str]:
    out = subprocess.run(
        ["docker", "ps", "--filter", f"label=labctl.lab={lab}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {n for n in out.split() if n.startswith("labctl-sbx-")}


def test_two_labs_on_one_dockerd_never_take_each_others_containers(
    sandbox_images: None, tmp_path: Path
) -> None:
    from labctl.sandbox.api import lang_spec
    from labctl.sandbox.limits import Limits

    tag = uuid.uuid4().hex[:8]
    lab_a, lab_b = f"lab-a-{tag}", f"lab-b-{tag}"
    inv_a, inv_b = _lab_inv(lab_a, tmp_path), _lab_inv(lab_b, tmp_path)
    # an idle container from before containers had a lab, of the very same pool: no lab's
    before = f"labctl-sbx-python-{tag}"
    labels = lang_spec("python", Limits())["config"]["Labels"]
    subprocess.run(
        ["docker", "run", "-d", "--name", before, *[x for k, v in labels.items() for x in ("--label", f"{k}={v}")],
         "--user", "65534:65534", "--network", "none", "labctl-sandbox/python:latest", "sleep", "300"],
        check=True, capture_output=True,
    )  # fmt: skip
    prog = {"lang": "python", "source": "print(1)"}
    try:
        assert run_many([prog], inventory=inv_a)[0]["stdout"] == "1\n"
        idle_a = _idle_of(lab_a)
        assert len(idle_a) == 2  # lab a's pool, topped up
        # lab b finds two idle containers of the same config and one of no lab: it takes none
        assert [r["stdout"] for r in run_many([prog] * 3, inventory=inv_b, concurrency=1)] == ["1\n"] * 3
        assert _idle_of(lab_a) == idle_a
        assert len(_idle_of(lab_b)) == 2 and not _idle_of(lab_b) & idle_a
        assert not gone(before, tries=1)
        # and lab a still finds its own, warm
        assert run_many([prog], inventory=inv_a)[0]["warm"]
        assert not gone(before, tries=1)
    finally:
        for lab in (lab_a, lab_b):
            subprocess.run(
                f"docker ps -aq --filter label=labctl.lab={lab} | xargs -r docker rm -f",
                shell=True,
                capture_output=True,
            )
        subprocess.run(["docker", "rm", "-f", before], capture_output=True)


def test_unknown_language_is_an_input_error(local_inv: Path) -> None:
    proc = labctl("-i", str(local_inv), "sandbox", "run", "--lang", "cobol", "/dev/null")
    assert (
        proc.returncode == 2
        and "no sandbox language 'cobol'" in proc.stderr
        and "Traceback" not in proc.stderr
    )


def test_a_container_whose_agent_died_mid_run_is_reaped(local_inv: Path, tmp_path: Path) -> None:
    # an agent that claims a container and dies before it can release it (killed, SSH gone)
    script = (
        "import os, sys\n"
        "from labctl.agent.sandbox.docker import Client\n"
        "from labctl.agent.sandbox.pool import Pool\n"
        "from labctl.sandbox.api import lang_spec\n"
        "from labctl.sandbox.limits import Limits\n"
        "pool = Pool(Client(), 'python', lang_spec('python', Limits())['config'], 0, 'l')\n"  # local_inv's lab
        "name, _ = pool.claim()\n"
        "print(name, flush=True)\n"
        "os._exit(9)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    orphan = proc.stdout.strip()
    assert proc.returncode == 9 and orphan.startswith("labctl-run-"), proc.stderr
    assert not gone(orphan, tries=1)  # left running by the dead agent
    assert run_many([{"lang": "python", "source": "print(1)"}], inventory=local_inv)[0]["stdout"] == "1\n"
    assert gone(orphan)  # the next agent killed it


def test_bench_measures_both_methods_without_errors(local_inv: Path) -> None:
    proc = labctl(
        "--json", "-i", str(local_inv), "sandbox", "bench", "--concurrency", "1,4", "--runs", "4", timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [r["concurrency"] for r in doc["rows"]] == [1, 4]
    for row in doc["rows"]:
        for method in ("pool", "docker_run"):
            s = row[method]
            assert s["runs"] == 4 and s["errors"] == 0 and 0 < s["p50_ms"] <= s["p95_ms"] <= s["p99_ms"]
