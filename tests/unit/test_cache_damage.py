"""Damaged local state of a model cache (a vanished model, a manifest, a copy's state, the storage
side's hash cache) is reported and repaired by the agent, never a traceback. Real files, real
agent processes over loopback."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_cache_plan import MIB, Server, agent, sha


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    (root / "tiny").mkdir(parents=True)
    (root / "tiny" / "model.safetensors").write_bytes(os.urandom(3 * MIB + 7))
    (root / "one.safetensors").write_bytes(os.urandom(MIB))
    return root


def fill(store: Path, cache: Path) -> None:
    cache.mkdir()
    srv = Server(store, ["tiny", "one.safetensors"], MIB)
    done = agent("cache.pull", srv.pull_args(cache, chunk_size=MIB))
    srv.result()
    assert done.returncode == 0, done.stdout + done.stderr


def answer(cmd: str, **args: Any) -> dict[str, Any]:
    proc = agent(cmd, json.dumps(args))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def manifest(cache: Path) -> dict[str, Any]:
    return json.loads((cache / ".labctl" / "manifest.json").read_text())  # type: ignore[no-any-return]


def test_a_vanished_model_is_reported_missing_and_fetched_again(store: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fill(store, cache)
    answer("cache.pin", cache=str(cache), model="tiny")
    shutil.rmtree(cache / "tiny")
    out = answer("cache.verify", cache=str(cache))
    got = {m["name"]: m for m in out["models"]}
    assert got["one.safetensors"]["status"] == "ok"
    assert got["tiny"]["status"] == "missing" and got["tiny"]["moved_to_partial"]
    assert "tiny" not in manifest(cache)["models"]
    # Not forgotten: it waits as a partial copy with nothing done, and the next sync fetches it whole.
    partial = {p["name"]: p for p in answer("cache.state", cache=str(cache))["partials"]}
    assert partial["tiny"]["done_bytes"] == 0 and partial["tiny"]["total_bytes"] == 3 * MIB + 7
    srv = Server(store, ["tiny"], MIB)
    fixed = json.loads(agent("cache.pull", srv.pull_args(cache, chunk_size=MIB)).stdout)
    srv.result()
    assert fixed["fetched_bytes"] == 3 * MIB + 7
    assert sha(cache / "tiny" / "model.safetensors") == sha(store / "tiny" / "model.safetensors")
    assert manifest(cache)["models"]["tiny"]["pinned"] is True  # kept across the repair


def tiny_is_a_string(doc: dict[str, Any]) -> None:
    doc["models"]["tiny"] = "x"


def tiny_s_files_are_a_string(doc: dict[str, Any]) -> None:
    doc["models"]["tiny"]["files"] = "model.safetensors"


@pytest.mark.parametrize(
    ("damage", "kept"),
    [
        ('{"version": 1, "models": []}', set()),
        ("[1, 2]", set()),
        ('{"version": 1, "models": {"tiny": "x"', set()),  # torn: not JSON
        (tiny_is_a_string, {"one.safetensors"}),
        (tiny_s_files_are_a_string, {"one.safetensors"}),
    ],
)
def test_a_damaged_manifest_is_set_aside_rebuilt_and_reported(
    store: Path, tmp_path: Path, damage: Any, kept: set[str]
) -> None:
    cache = tmp_path / "cache"
    fill(store, cache)
    path = cache / ".labctl" / "manifest.json"
    if callable(damage):
        doc = manifest(cache)
        damage(doc)
        text = json.dumps(doc)
    else:
        text = damage
    path.write_text(text)
    for cmd in ("cache.verify", "cache.state"):
        out = answer(cmd, cache=str(cache))
        if cmd == "cache.verify":
            assert {m["name"] for m in out["models"]} == kept
            assert len(out["repairs"]) == 1 and "manifest.json was damaged" in out["repairs"][0]
            damaged = list((cache / ".labctl").glob("manifest.json.damaged-*"))
            assert len(damaged) == 1 and damaged[0].read_text() == text  # kept for a person to see
        else:
            assert "repairs" not in out  # repaired once, sound since
            assert set(out["models"]) == kept
            assert "tiny" in out["untracked"]  # still on the disk: status shows it
    assert set(manifest(cache)["models"]) == kept
    # And a sync brings it back into the listing.
    srv = Server(store, ["tiny"], MIB)
    done = agent("cache.pull", srv.pull_args(cache, chunk_size=MIB))
    srv.result()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tiny" in manifest(cache)["models"]


@pytest.mark.parametrize(
    "state",
    [
        {"files": {"tiny/model.safetensors": "x"}},
        {"files": {"tiny/model.safetensors": {"size": 5, "done": {"zero": "abc"}}}},
        {"files": []},
        "not json",
    ],
)
def test_a_damaged_copy_state_is_set_aside_and_the_copy_starts_over(
    store: Path, tmp_path: Path, state: Any
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    srv = Server(store, ["tiny"], MIB)
    crashed = agent("cache.pull", srv.pull_args(cache, chunk_size=MIB, stop_after_chunks=2))
    assert crashed.returncode == -9
    srv.proc.kill()
    srv.proc.wait()
    st = cache / ".labctl" / "state" / "tiny.json"
    st.write_text(state if isinstance(state, str) else json.dumps(state))
    out = answer("cache.state", cache=str(cache))
    assert len(out["repairs"]) == 1 and "tiny.json was damaged" in out["repairs"][0]
    assert list((cache / ".labctl" / "state").glob("tiny.json.damaged-*"))
    srv = Server(store, ["tiny"], MIB)
    done = agent("cache.pull", srv.pull_args(cache, chunk_size=MIB))
    srv.result()
    assert done.returncode == 0, done.stdout + done.stderr
    assert sha(cache / "tiny" / "model.safetensors") == sha(store / "tiny" / "model.safetensors")


@pytest.mark.parametrize("doc", [{"files": []}, {"files": {"tiny/model.safetensors": "x"}}, [], "{torn"])
def test_a_damaged_hash_cache_on_the_storage_host_is_hashed_again(
    store: Path, tmp_path: Path, doc: Any
) -> None:
    hashes = store / ".labctl" / "hashes" / "tiny.json"
    hashes.parent.mkdir(parents=True)
    hashes.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    listed = answer("cache.list", root=str(store), models=["tiny"], chunk_size=MIB)
    assert [f["hashed"] for f in listed["models"]["tiny"]["files"]] == [False]
    cache = tmp_path / "cache"
    fill(store, cache)  # serving every chunk hashes the file: the cache is written anew
    files = json.loads(hashes.read_text())["files"]
    assert (
        files["tiny/model.safetensors"]["chunks"] == manifest(cache)["models"]["tiny"]["files"][0]["chunks"]
    )
