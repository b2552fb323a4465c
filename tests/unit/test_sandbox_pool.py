"""The warm pool's lab: which containers a lab claims, creates, counts, reaps and kills, on a
fake dockerd that filters on labels as Docker does. Labs whose sandbox hosts share one dockerd
must never touch each other's containers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from labctl.agent import commands
from labctl.agent.core import paths
from labctl.agent.core.errors import AgentError
from labctl.agent.sandbox import pool as poolmod
from labctl.agent.sandbox.pool import Pool, reap_orphans
from labctl.sandbox.limits import Limits, container_config

CONFIG = container_config("labctl-sandbox/python:latest", "python", Limits(), compiled=False)
POOL = CONFIG["Labels"]["labctl.pool"]


class FakeDocker:
    """Containers by name: their labels, and whether they still run."""

    def __init__(self) -> None:
        self.containers: dict[str, dict[str, str]] = {}
        self.killed: list[str] = []
        self.list_filters: list[list[str]] = []

    def add(self, name: str, lab: str | None, **extra: str) -> None:
        labels = {"labctl.sandbox": "1", "labctl.lang": "python", "labctl.pool": POOL, **extra}
        if lab is not None:
            labels["labctl.lab"] = lab
        self.containers[name] = labels

    def list(self, labels: list[str], running_only: bool = True) -> list[dict[str, Any]]:
        self.list_filters.append(list(labels))
        wanted = [tuple(x.split("=", 1)) for x in labels]
        return [
            {"Id": name, "Names": ["/" + name], "Labels": dict(lb)}
            for name, lb in self.containers.items()
            if all(lb.get(k) == v for k, v in wanted)
        ]

    def create(self, config: dict[str, Any], name: str) -> str:
        self.containers[name] = dict(config["Labels"])
        return name

    def start(self, cid: str) -> None:
        pass

    def rename(self, old: str, new: str) -> bool:
        if old not in self.containers:
            return False
        self.containers[new] = self.containers.pop(old)
        return True

    def kill(self, cid: str) -> None:
        if self.containers.pop(cid, None) is not None:
            self.killed.append(cid)

    def remove(self, cid: str) -> None:
        self.containers.pop(cid, None)


@pytest.fixture(autouse=True)
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(paths, "SANDBOX_RUN_DIR", str(tmp_path))
    monkeypatch.setattr(poolmod, "_CLAIM", poolmod._Flock(str(tmp_path / "claim.lock")))
    return tmp_path


def opened(docker: FakeDocker, lab: str, size: int = 0) -> Pool:
    pool = Pool(docker, "python", CONFIG, size, lab)  # type: ignore[arg-type]
    pool.open()
    pool.wait()
    return pool


def test_a_lab_claims_only_its_own_idle_containers() -> None:
    docker = FakeDocker()
    docker.add("labctl-sbx-python-mine", "lab-a")
    docker.add("labctl-sbx-python-theirs", "lab-b")
    docker.add("labctl-sbx-python-before", None)  # made before containers had a lab
    pool = opened(docker, "lab-a")
    name, warm = pool.claim()
    assert warm and docker.containers[name]["labctl.lab"] == "lab-a"
    name, warm = pool.claim()  # nothing of lab-a's is idle: a cold one, never lab-b's
    assert not warm and docker.containers[name]["labctl.lab"] == "lab-a"
    assert "labctl-sbx-python-theirs" in docker.containers
    assert all("labctl.lab=lab-a" in f for f in docker.list_filters if "labctl.pool=" + POOL in f)


def test_a_lab_creates_and_counts_its_own_containers() -> None:
    docker = FakeDocker()
    docker.add("labctl-sbx-python-theirs-1", "lab-b")
    docker.add("labctl-sbx-python-theirs-2", "lab-b")
    pool = opened(docker, "lab-a", size=2)
    # lab-b's two idle containers do not fill lab-a's pool: lab-a makes its own two
    mine = [n for n, lb in docker.containers.items() if lb.get("labctl.lab") == "lab-a"]
    assert len(mine) == 2 and sorted(pool.idle) == sorted(mine)
    assert all(docker.containers[n]["labctl.pool"] == POOL for n in mine)
    assert "labctl.lab" not in CONFIG["Labels"]  # the controller's config is not changed


def test_a_lab_without_a_name_is_refused() -> None:
    with pytest.raises(AgentError) as e:
        Pool(FakeDocker(), "python", CONFIG, 1, "")  # type: ignore[arg-type]
    assert e.value.kind == "bad_args"
    args = {"programs": [], "langs": {}, "limits": {}}
    with pytest.raises(AgentError) as e:
        commands.call("sandbox.run", args)
    assert e.value.kind == "bad_args" and "lab" in e.value.message


def test_containers_of_no_lab_and_of_another_lab_are_never_killed(run_dir: Path) -> None:
    docker = FakeDocker()
    docker.add("labctl-sbx-python-before", None)
    docker.add("labctl-sbx-python-theirs", "lab-b")
    docker.add("labctl-run-theirs", "lab-b")
    pool = opened(docker, "lab-a", size=1)
    name, _ = pool.claim()
    pool.release(name)
    pool.wait()
    assert docker.killed == [name]  # its own used container, nothing else
    assert {"labctl-sbx-python-before", "labctl-sbx-python-theirs", "labctl-run-theirs"} <= set(
        docker.containers
    )


def test_reaping_kills_this_labs_orphans_only(run_dir: Path) -> None:
    docker = FakeDocker()
    dead = "999999999 0"  # no such process: each of these claims' agents is gone
    for name, lab in (("labctl-run-mine", "lab-a"), ("labctl-run-theirs", "lab-b"), ("labctl-run-old", None)):
        docker.add(name, lab)
        (run_dir / name).write_text(dead)
    with poolmod._CLAIM:
        killed = reap_orphans(docker, "lab-a")  # type: ignore[arg-type]
    assert killed == ["labctl-run-mine"]
    assert {"labctl-run-theirs", "labctl-run-old"} <= set(docker.containers)
    # their records stay for their own agents (or a person) to judge
    records = sorted(n for n in os.listdir(run_dir) if n.startswith("labctl-run-"))
    assert records == ["labctl-run-old", "labctl-run-theirs"]


def test_the_selftest_runs_and_judges_as_its_lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its runs take this lab's pool, and its host check counts this lab's containers only: a
    run of another lab on the same dockerd is not one this lab left behind."""
    from types import SimpleNamespace

    import yaml

    from labctl.hosts import agent_ship
    from labctl.inventory.load import load_inventory
    from labctl.sandbox.selftest import on_hosts

    path = tmp_path / "inv.yaml"
    host = {
        "address": "127.0.0.1",
        "connection": "local",
        "roles": ["sandbox"],
        "sandbox": {"languages": ["python"]},
    }
    path.write_text(yaml.safe_dump({"lab": "lab-a", "hosts": {"here": host}}))
    ctx = SimpleNamespace(inventory=load_inventory(path), inventory_path=path)
    asked: list[tuple[str, dict[str, Any]]] = []

    def ask(ctx: Any, h: Any, command: str, args: dict[str, Any], **kw: Any) -> dict[str, Any]:
        asked.append((command, args))
        if command == "sandbox.run":
            return {"results": [{"exit_code": 0, "stdout": "", "stderr": ""} for _ in args["programs"]]}
        if args["action"] == "snapshot":
            return {"snapshot": {"labels": args["labels"]}}
        return {"clean": True, "problems": []}

    monkeypatch.setattr(agent_ship, "ask_agent", ask)
    on_hosts(ctx, None, "python", only=["fork_bomb"])  # type: ignore[arg-type]
    runs = [a for c, a in asked if c == "sandbox.run"]
    snapshots = [a for c, a in asked if c == "sandbox.hostcheck" and a["action"] == "snapshot"]
    assert runs and all(a["lab"] == "lab-a" for a in runs)
    assert snapshots and all(a["labels"] == ["labctl.lab=lab-a"] for a in snapshots)
