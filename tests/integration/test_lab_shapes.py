"""Labs of every shape (issue 24): the shipped playbooks and read-only commands on generated labs.

Each shape is a valid inventory of 1-6 hosts with any subset of labctl's roles (none
included), with or without GPUs, torch, a model cache, storage, a sandbox or a bond. Every
host is this machine (`connection: local`, distinct names), so no SSH is needed. On each shape
every shipped provision playbook runs with `--check`, every phase of playbooks/train.yaml with
`train --dry-run`, then `orchestra plan`, `doctor`, `monitor.status`, `cron list` and `ckpt list`, all
with --json. None may print a traceback, and a refusal (exit 1 or 2) must name a precondition
of the lab.

Nothing may change this machine: the commands run in their own mount namespace with overlays
over /var and /etc, so whatever they write there lands in a folder of the test, which is then
checked: --check, --dry-run, plan and list write nothing at all; doctor and status only
labctl's own records (the status history, the torch probe's cache). HOME is a folder of the
test too, for the agent that labctl caches in a local user's home.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.inventory.select import KNOWN_ROLES
from tests.conftest import REPO

pytestmark = pytest.mark.integration

SEED = 24
SHAPES = 10  # plus the fixed ones: about 2 minutes in all on 2 cores
GPU_MODELS = [("Tesla V100", 32), ("Tesla P40", 24), ("NVIDIA H100 80GB HBM3", 80)]
BARE_PYTHON = str(Path(sys.base_prefix, "bin", "python3"))
PLAYBOOKS = sorted(
    p for p in (REPO / "playbooks").glob("*.yaml") if "plays" in (yaml.safe_load(p.read_text()) or {})
)
PHASES = yaml.safe_load((REPO / "playbooks" / "train.yaml").read_text())["phases"]

# What a refusal (exit 1 or 2) may name: a precondition this lab or this machine does not meet.
# A selector or document error, an agent that crashed or an unnamed failure is none of these.
PRECONDITIONS = {
    "a role no host has": r"no host has (role \w+|the `?\w+`? role)",
    "GPUs and their driver": r"NVIDIA driver|no GPU|GPUs? declared",
    "torch where training runs": r"torch is not installed|no torch",
    "the NICs a bond is made of": r"no bonding driver|has no NIC|declared but not on the host",
    "Docker and the sandbox images": r"no Docker engine|sandbox image",
    "the orchestra's warm set": r"warm set|has not been rotated",
    "a model cache to serve from": r"no model_cache",
    "a storage host for checkpoints": r"(has|have) a 'storage' section",
    "a CUDA toolkit that compiles for the GPUs": r"needs nvcc|CUDA [0-9.]+ cannot compile for",
}
# What doctor and status may write on a host: labctl's own records of what they saw.
RECORDS = ("var/lib/labctl/status/", "var/lib/labctl/cache/torch-probe/")
OVERLAID = ("var", "etc")


def isolation_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root for a mount namespace with overlays over /var and /etc"
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    return None


def host_doc(rng: random.Random, name: str, tmp: Path, storage_hosts: list[str]) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "address": "127.0.0.1",
        "roles": [r for r in KNOWN_ROLES if rng.random() < 0.3],
        "python": BARE_PYTHON,
    }
    if rng.random() < 0.5:
        model, memory = rng.choice(GPU_MODELS)
        doc["gpus"] = [{"model": model, "memory_gb": memory, "count": rng.randint(1, 4)}]
    if rng.random() < 0.4 or ("storage" in doc["roles"] and rng.random() < 0.7):
        doc["storage"] = {"models": str(tmp / name / "models")}
        storage_hosts.append(name)
    if rng.random() < 0.4:
        source = rng.choice(storage_hosts) if storage_hosts and rng.random() < 0.7 else None
        doc["model_cache"] = {"path": f"/mnt/labctl-shape-{name}", "size_gb": 1, "source": source}
    if rng.random() < 0.3:
        doc["sandbox"] = {"languages": ["python"], "pool": 2}
    if rng.random() < 0.3:
        doc["nics"] = [{"name": "shp0", "speed_mbps": 1000}, {"name": "shp1", "speed_mbps": 1000}]
        doc["bond"] = {"interfaces": ["shp0", "shp1"], "address": "10.99.0.2/24", "mode": "802.3ad"}
    return doc


def random_shape(rng: random.Random, tmp: Path) -> dict[str, Any]:
    storage_hosts: list[str] = []
    hosts = {f"h{i}": host_doc(rng, f"h{i}", tmp, storage_hosts) for i in range(rng.randint(1, 6))}
    if rng.random() < 0.5:
        # One host with torch (this venv's interpreter; the others have the one it was made
        # from, without torch), a trainer where there is one: importing torch costs seconds a
        # host, and one is enough to take `train --dry-run` past its preflight.
        trainers = [h for h in hosts.values() if "train" in h["roles"]]
        rng.choice(trainers or list(hosts.values()))["python"] = sys.executable
    return shape_doc(hosts)


def shape_doc(hosts: dict[str, Any]) -> dict[str, Any]:
    return {
        "lab": "shape",
        "defaults": {"connection": "local", "python": BARE_PYTHON, "user": "root"},
        "hosts": hosts,
    }


def fixed_shapes(tmp: Path) -> list[dict[str, Any]]:
    return [
        # The issue's lab: a cache host and a storage host, nothing else.
        shape_doc(
            {
                "cache": {
                    "address": "127.0.0.1",
                    "roles": ["cache"],
                    "model_cache": {"path": "/mnt/labctl-shape-cache", "size_gb": 1, "source": "store"},
                },
                "store": {
                    "address": "127.0.0.1",
                    "roles": ["storage"],
                    "storage": {"models": str(tmp / "store" / "models")},
                },
            }
        ),
        # One host with no role at all.
        shape_doc({"solo": {"address": "127.0.0.1"}}),
        # An inference host with a cache, no trainer: the orchestra places without training claims.
        shape_doc(
            {
                "serve": {
                    "address": "127.0.0.1",
                    "roles": ["inference", "cache"],
                    "gpus": [{"model": "Tesla P40", "memory_gb": 24, "count": 4}],
                    "model_cache": {"path": "/mnt/labctl-shape-serve", "size_gb": 1},
                }
            }
        ),
    ]


def shapes(tmp: Path) -> list[dict[str, Any]]:
    rng = random.Random(SEED)
    return fixed_shapes(tmp) + [random_shape(rng, tmp) for _ in range(SHAPES)]


def train(phase: int) -> list[str]:
    # port=0: the rendezvous port is free whatever else runs on this machine.
    return ["train", "--phase", str(phase), "--dry-run", "--set", "port=0"]


def commands() -> list[tuple[list[str], bool]]:
    """(arguments, whether it must write nothing at all) for every command run on a shape."""
    out: list[tuple[list[str], bool]] = [
        (["provision", "--check", "-p", str(p.relative_to(REPO))], True) for p in PLAYBOOKS
    ]
    out += [(train(n), False) for n in sorted(PHASES)]
    out += [(["orchestra", "plan"], True), (["doctor"], False), (["status"], False)]
    out += [(["cron", "list"], True), (["ckpt", "list"], True)]
    return out


def run_shape(tmp: Path, inventory: Path, runs: list[list[str]]) -> list[dict[str, Any]]:
    """Each of `runs` as `labctl --json -i INVENTORY ARGS` with /var and /etc overlaid: what
    `drive` found.

    One process per shape runs every command through labctl's own entry point, so Python's
    start-up is paid once a shape rather than once a command.
    """
    layers, answers = tmp / "layers", tmp / "answers.jsonl"
    shutil.rmtree(layers, ignore_errors=True)
    for tree in OVERLAID:
        (layers / tree / "upper").mkdir(parents=True)
        (layers / tree / "work").mkdir()
    script = (
        "for t in $OVERLAID; do mount -t overlay overlay "
        '-o "lowerdir=/$t,upperdir=$LAYERS/$t/upper,workdir=$LAYERS/$t/work" "/$t" || exit 97; done; exec "$@"'
    )
    driver = "import sys; from tests.integration.test_lab_shapes import drive; drive(*sys.argv[1:])"
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
         sys.executable, "-c", driver, str(inventory), str(layers), str(answers), json.dumps(runs)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env={**os.environ, "HOME": str(tmp / "home"), "COLUMNS": "200", "LAYERS": str(layers),
             "OVERLAID": " ".join(OVERLAID)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads(line) for line in answers.read_text().splitlines()]


def drive(inventory: str, layers: str, answers: str, runs: str) -> None:
    """In the overlaid namespace: run each command as the `labctl` script does, and write one
    line per command: its arguments, exit code, stdout, stderr and the files it wrote under
    the overlaid trees (`var/lib/...`)."""
    import contextlib
    import io
    import traceback

    from labctl.cli.app import main

    def files() -> dict[str, tuple[int, int]]:
        found = {}
        for tree in OVERLAID:
            upper = os.path.join(layers, tree, "upper")
            for d, _, names in os.walk(upper):
                for f in names:
                    st = os.lstat(os.path.join(d, f))
                    found[os.path.join(tree, os.path.relpath(os.path.join(d, f), upper))] = (
                        st.st_mtime_ns,
                        st.st_size,
                    )
        return found

    with open(answers, "w") as out:
        for args in json.loads(runs):
            before, start = files(), time.monotonic()
            stdout, stderr = io.StringIO(), io.StringIO()
            sys.argv = ["labctl", "--json", "-i", inventory, *args]
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                code: int | str | None
                try:
                    main()
                    code = 0
                except SystemExit as e:
                    code = e.code if isinstance(e.code, (int, str)) else 0
                except BaseException:  # what the `labctl` script would show as a traceback
                    code = None
                    stderr.write(traceback.format_exc())
            after = files()
            line = {
                "args": args,
                "rc": code,
                "seconds": round(time.monotonic() - start, 2),
                "stdout": stdout.getvalue(),
                "stderr": stderr.getvalue(),
                "written": sorted(k for k, v in after.items() if before.get(k) != v),
            }
            out.write(json.dumps(line) + "\n")
            out.flush()


def refusals(doc: dict[str, Any]) -> list[str]:
    """The texts a --json answer gives for what failed: its error, failed resources, failed checks."""
    if "error" in doc:
        return [f"{doc['error']} {doc.get('hint') or ''}"]
    out = [
        f"{r.get('error')} {r.get('hint') or ''}"
        for r in doc.get("results", [])
        if r.get("status") == "failed"
    ]
    out += [
        f"{c['check']}: {c['found']} {c['fix']}" for c in doc.get("lines", []) if c.get("status") == "fail"
    ]
    return out


@pytest.mark.skipif(isolation_unavailable() is not None, reason=str(isolation_unavailable()))
def test_every_shipped_playbook_and_read_only_command_on_generated_lab_shapes(tmp_path: Path) -> None:
    problems: list[str] = []
    runs = commands()
    succeeded: set[str] = set()
    for i, doc in enumerate(shapes(tmp_path)):
        inv = tmp_path / f"shape{i}.yaml"
        inv.write_text(yaml.safe_dump(doc, sort_keys=False))
        for (args, read_only), got in zip(runs, run_shape(tmp_path, inv, [a for a, _ in runs]), strict=True):
            what = f"shape {i} ({inv}): labctl {' '.join(args)} exited {got['rc']}"
            out = got["stdout"] + got["stderr"]
            if "Traceback" in out or got["rc"] not in (0, 1, 2):
                problems.append(f"{what}:\n{out[-3000:]}")
                continue
            try:
                answer = json.loads(got["stdout"])
            except json.JSONDecodeError:
                problems.append(f"{what}: stdout is not one JSON document:\n{got['stdout'][-2000:]}")
                continue
            if got["rc"] == 0:
                succeeded.add(" ".join(args))
            else:
                texts = refusals(answer) or ["(no error named)"]
                unnamed = [t for t in texts if not any(re.search(p, t) for p in PRECONDITIONS.values())]
                if unnamed:
                    problems.append(f"{what}, refusing for no named precondition: {unnamed}")
            stray = [w for w in got["written"] if read_only or not w.startswith(RECORDS)]
            if stray:
                problems.append(f"{what}: it wrote on this machine: {stray}")
    assert not problems, "\n\n".join(problems)
    # The shapes are varied enough that every command gets past its preconditions somewhere,
    # but for a phase that trains against the orchestra's warm set: only loading it (which
    # changes the host) would meet that one.
    warm = {" ".join(train(n)) for n, phase in PHASES.items() if phase.get("requires_orchestra")}
    assert warm and succeeded == {" ".join(a) for a, _ in runs} - warm


def test_the_issue_lab_provisions_with_the_default_playbook_and_says_what_it_skipped(tmp_path: Path) -> None:
    """A cache host and a storage host, no trainer: `provision --check` with the default
    playbooks/provision.yaml exits 0 and names the play it skipped and why."""
    reason = isolation_unavailable()
    if reason:
        pytest.skip(reason)
    inv = tmp_path / "lab.yaml"
    inv.write_text(yaml.safe_dump(fixed_shapes(tmp_path)[0], sort_keys=False))
    [got] = run_shape(tmp_path, inv, [["provision", "--check"]])
    assert got["rc"] == 0, got["stdout"] + got["stderr"]
    doc = json.loads(got["stdout"])
    assert [(p["hosts"], p["reason"]) for p in doc["skipped_plays"]] == [
        ("role:train", "no host has role train")
    ]
    assert {r["host"] for r in doc["results"]} == {"cache", "store"} and got["written"] == []
