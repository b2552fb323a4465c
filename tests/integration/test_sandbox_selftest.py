"""Every self-test attack for python and c, run for real through the sandbox engine
(`run_programs`, the warm pool on this machine's dockerd), is contained, and the host check
finds nothing left. Then `labctl sandbox selftest` end to end over SSH on a simulated host.

The attacks run in the python and c sandbox images (conftest's docker_images), in containers
labelled so that the host check judges only the containers these tests made, while other
test sessions share the same dockerd.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from labctl.agent.sandbox import hostcheck
from labctl.agent.sandbox.runner import run_programs
from labctl.sandbox.api import lang_spec
from labctl.sandbox.attacks import attacks_for
from labctl.sandbox.limits import Limits
from labctl.sandbox.selftest import run_attack
from tests.conftest import ON_THIS_MACHINE, labctl

pytestmark = [pytest.mark.integration, ON_THIS_MACHINE]

RUN_LABEL = f"labctl.test=selftest-{uuid.uuid4().hex[:8]}"
LAB = RUN_LABEL.split("=", 1)[1]  # the lab these tests run their pools as
# Attacks known to escape the engine, name -> why: each an xfail(strict) until it is fixed, so
# the table shows the day it is. (The nproc ulimit shared by every container of uid 65534 was
# one: a fork bomb beside another run starved it; fixed on the engine's side.)
KNOWN_ESCAPES: dict[str, str] = {}


def _docker_ok() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def attack_image(docker_images: dict[str, Any]) -> Iterator[None]:
    """The python and c sandbox images (conftest's docker_images, labctl's own builder); the
    containers these tests made are removed afterwards."""
    yield None
    subprocess.run(
        f"docker ps -aq --filter label={RUN_LABEL} | xargs -r docker rm -f", shell=True, capture_output=True
    )


def _engine() -> tuple[Any, Any]:
    limits = Limits()
    langs = {}
    for lang in ("python", "c"):
        spec = lang_spec(lang, limits)
        spec["config"]["Labels"][RUN_LABEL.split("=")[0]] = RUN_LABEL.split("=")[1]
        langs[lang] = spec

    def run_batch(reqs: list[dict[str, Any]], conc: int) -> list[dict[str, Any]]:
        return run_programs(reqs, langs, limits.as_dict(), concurrency=conc, pool_size=2, lab=LAB)

    def check(action: str, args: dict[str, Any]) -> dict[str, Any]:
        return hostcheck.hostcheck_command({"action": action, **args})

    return run_batch, check


ATTACKS = [
    pytest.param(
        a,
        id=f"{a.lang}-{a.name}",
        marks=[pytest.mark.xfail(strict=True, reason=KNOWN_ESCAPES[a.name])]
        if a.name in KNOWN_ESCAPES
        else [],
    )
    for lang in ("python", "c")
    for a in attacks_for(lang)
]


@pytest.mark.parametrize("attack", ATTACKS)
def test_attack_is_contained_and_leaves_the_host_clean(attack_image: None, attack: Any) -> None:
    run_batch, check = _engine()
    row = run_attack(attack, run_batch, check, [RUN_LABEL])
    assert row["contained"] is True, (
        f"{attack.lang}/{attack.name} escaped: {row['detail']} runs={row['runs']}"
    )
    assert row["host_problems"] == []


def test_the_host_check_sees_a_left_container_and_its_process(attack_image: None) -> None:
    """The check the verdicts rest on: a claimed container left running is found, with its
    process, and found gone once removed."""
    before = hostcheck.snapshot([RUN_LABEL])
    name = f"labctl-run-{uuid.uuid4().hex[:12]}"
    label = RUN_LABEL.split("=")
    subprocess.run(
        ["docker", "run", "-d", "--name", name, "--label", "labctl.sandbox=1", "--label", f"{label[0]}={label[1]}",
         "--user", "65534:65534", "--network", "none", "labctl-sandbox/python:latest", "sleep", "300"],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        report = hostcheck.settle(before, wait_s=1)
        assert [c["name"] for c in report["containers_left"]] == [name]
        assert any("sleep 300" in p["cmd"] for p in report["processes_left"])
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    assert hostcheck.settle(before, wait_s=10)["clean"]


# Every attack already ran through the engine above; over SSH, one of each shape proves the
# path: a resource bomb, a reach for the host, and a pair of runs that must meet.
OVER_SSH = ["fork_bomb", "docker_socket", "signal_other_run"]


def test_selftest_cli_over_ssh_on_a_sim_host(lab: Any, attack_image: None) -> None:
    """`labctl sandbox selftest` end to end: the agent on a simulated host drives this
    machine's dockerd (the sim's hosts share it) with labctl's own python image."""
    picks = [arg for name in OVER_SSH for arg in ("--attack", name)]
    proc = labctl(
        "-i", str(lab.inventory_path), "--json", "sandbox", "selftest", "--host", "irina", "--lang", "python",
        *picks, timeout=900,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    rows = {r["attack"]: r for r in doc["rows"]}
    assert list(rows) == OVER_SSH
    assert all(len(rows[n]["runs"]) == len(next(a for a in attacks_for("python") if a.name == n).programs)
               for n in OVER_SSH)  # fmt: skip
    wrong = {n: r["detail"] for n, r in rows.items() if r["contained"] is not True and n not in KNOWN_ESCAPES}
    assert not wrong, wrong
    assert proc.returncode == (1 if any(rows[n]["contained"] is not True for n in rows) else 0)
