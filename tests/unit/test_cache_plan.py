"""labctl cache: pure planning (eviction, sync plans, chunks, model names), and the agent's
copy protocol between two local processes over loopback (no simulated lab needed)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.cache.manifest import chunk_ranges
from labctl.cache.plan import SLACK, CacheFull, Evictable, plan_eviction, plan_sync
from labctl.cache.targets import check_models
from labctl.output.errors import InputError

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# chunks and names


def test_chunk_ranges_cover_the_file_exactly() -> None:
    assert chunk_ranges(0, 4) == []
    assert chunk_ranges(8, 4) == [(0, 4), (4, 4)]
    assert chunk_ranges(10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert chunk_ranges(3, 64 * MIB) == [(0, 3)]
    with pytest.raises(ValueError):
        chunk_ranges(10, 0)


@pytest.mark.parametrize("bad", ["", "../etc", "a/b", ".hidden", "x\0y", "a" * 300])
def test_model_names_are_one_plain_path_component(bad: str) -> None:
    with pytest.raises(InputError) as e:
        check_models([bad], "sync")
    assert "not a model name" in e.value.message


def test_model_names_are_deduplicated_in_order() -> None:
    assert check_models(["b", "a", "b"], "sync") == ["b", "a"]
    with pytest.raises(InputError):
        check_models([], "sync")


# ---------------------------------------------------------------------------------------------
# eviction


def ev(name: str, mib: int, last: float | None, pinned: bool = False, partial: bool = False) -> Evictable:
    return Evictable(name, mib * MIB, last, pinned, partial)


def test_nothing_is_evicted_when_it_fits() -> None:
    assert plan_eviction(100 * MIB, 100 * MIB, [ev("a", 50, 1.0)]) == []


def test_least_recently_used_unpinned_go_first_and_only_as_many_as_needed() -> None:
    cands = [
        ev("old", 40, 1.0),
        ev("pinned-oldest", 500, 0.5, pinned=True),
        ev("mid", 40, 2.0),
        ev("new", 40, 3.0),
    ]
    chosen = plan_eviction(10 * MIB, 80 * MIB, cands)
    assert [c.name for c in chosen] == ["old", "mid"]  # 10 + 40 + 40 >= 80; "new" stays


def test_abandoned_partial_copies_go_before_cached_models() -> None:
    cands = [ev("model", 40, 1.0), ev("half-copy", 40, 5.0, partial=True)]
    assert [c.name for c in plan_eviction(0, 30 * MIB, cands)] == ["half-copy"]


def test_never_used_models_are_the_least_recently_used() -> None:
    assert [c.name for c in plan_eviction(0, 1, [ev("used", 1, 5.0), ev("never", 1, None)])] == ["never"]


def test_pinned_models_make_it_impossible_and_nothing_is_chosen() -> None:
    cands = [ev("a", 100, 1.0, pinned=True), ev("b", 50, 2.0)]
    with pytest.raises(CacheFull) as e:
        plan_eviction(
            10 * MIB, 100 * MIB, cands, capacity=200 * MIB, where="m5: the cache /mnt/c", what="big"
        )
    msg = e.value.message
    assert msg.startswith("m5: the cache /mnt/c has no room: big needs 100.0 MiB")
    assert "would free only 50.0 MiB more" in msg and "(a is pinned)" in msg
    assert "Nothing was copied and nothing was evicted" in msg
    assert "unpin" in e.value.hint


def test_a_model_larger_than_the_cache_says_so() -> None:
    with pytest.raises(CacheFull) as e:
        plan_eviction(0, 300 * MIB, [ev("a", 100, 1.0)], capacity=256 * MIB, what="huge.bin")
    assert "huge.bin needs 300.0 MiB, more than the whole cache (256.0 MiB)" in e.value.message


# ---------------------------------------------------------------------------------------------
# sync plans


def listing_of(**models: list[tuple[str, int]]) -> dict[str, Any]:
    out = {}
    for name, files in models.items():
        fs = [{"path": p, "size": s, "mtime_ns": 7} for p, s in files]
        out[name] = {"name": name, "kind": "dir", "files": fs, "bytes": sum(s for _, s in files)}
    return out


def state_of(
    free: int, models: dict[str, Any] | None = None, partials: list[Any] | None = None
) -> dict[str, Any]:
    return {
        "exists": True,
        "capacity_bytes": 1024 * MIB,
        "free_bytes": free,
        "models": models or {},
        "partials": partials or [],
    }


def cached(files: list[tuple[str, int]], last: float, pinned: bool = False) -> dict[str, Any]:
    return {
        "files": [{"path": p, "size": s, "mtime_ns": 7} for p, s in files],
        "bytes": sum(s for _, s in files),
        "disk_bytes": sum(s for _, s in files),
        "last_used": last,
        "pinned": pinned,
        "present": True,
        "chunk_size": 4 * MIB,
    }


def test_a_cached_model_with_the_sources_files_needs_nothing() -> None:
    files = [("m/model.safetensors", 40 * MIB), ("m/config.json", 100)]
    plan = plan_sync(state_of(0, {"m": cached(files, 1.0)}), listing_of(m=files), ["m"], 4 * MIB)
    assert [(m.name, m.action) for m in plan.models] == [("m", "cached")]
    assert plan.to_fetch == [] and plan.need_bytes == 0 and plan.evict == []


def test_a_model_whose_source_changed_is_replaced() -> None:
    old = [("m/model.safetensors", 40 * MIB)]
    new = [("m/model.safetensors", 41 * MIB)]
    plan = plan_sync(state_of(500 * MIB, {"m": cached(old, 1.0)}), listing_of(m=new), ["m"], 4 * MIB)
    assert plan.models[0].action == "replace" and plan.need_bytes == 41 * MIB


def test_a_partial_copy_of_the_same_files_resumes_and_needs_less_room() -> None:
    files = [("m/model.safetensors", 40 * MIB)]
    partial = {
        "name": "m",
        "files": {"m/model.safetensors": {"size": 40 * MIB, "mtime_ns": 7}},
        "done_bytes": 12 * MIB,
        "disk_bytes": 12 * MIB,
        "chunk_size": 4 * MIB,
        "updated": 9.0,
    }
    plan = plan_sync(state_of(500 * MIB, partials=[partial]), listing_of(m=files), ["m"], 64 * MIB)
    m = plan.models[0]
    assert (m.action, m.resumed_bytes, m.need_bytes, m.chunks) == ("resume", 12 * MIB, 28 * MIB, 10)


def test_a_stale_partial_does_not_count_as_resumed() -> None:
    partial = {"name": "m", "files": {"m/x": {"size": 1, "mtime_ns": 1}}, "done_bytes": 1, "disk_bytes": 4096}
    plan = plan_sync(state_of(500 * MIB, partials=[partial]), listing_of(m=[("m/y", 10 * MIB)]), ["m"], MIB)
    assert plan.models[0].action == "fetch" and plan.models[0].resumed_bytes == 0


def test_room_is_planned_for_all_models_at_once_and_requested_ones_are_never_evicted() -> None:
    state = state_of(
        50 * MIB,
        {
            "a": cached([("a", 100 * MIB)], 1.0),  # requested and cached: kept
            "b": cached([("b", 100 * MIB)], 2.0),
            "c": cached([("c", 100 * MIB)], 3.0, pinned=True),
            "d": cached([("d", 100 * MIB)], 4.0),
        },
    )
    listing = listing_of(a=[("a", 100 * MIB)], x=[("x", 60 * MIB)], y=[("y", 60 * MIB)])
    plan = plan_sync(state, listing, ["a", "x", "y"], 64 * MIB)
    assert plan.to_fetch == ["x", "y"] and plan.need_bytes == 120 * MIB
    assert [e.name for e in plan.evict] == ["b"]  # 50 + 100 - slack >= 120; d is newer, c pinned, a asked for
    with pytest.raises(CacheFull):
        plan_sync(state, listing_of(z=[("z", 400 * MIB)]), ["z"], 64 * MIB)


def test_the_plan_keeps_slack_for_the_manifest() -> None:
    state = state_of(10 * MIB, {"old": cached([("old", MIB)], 1.0)})
    plan = plan_sync(state, listing_of(n=[("n", 10 * MIB)]), ["n"], MIB)
    assert [e.name for e in plan.evict] == ["old"]  # 10 MiB free is not 10 MiB + SLACK
    assert SLACK > 0


# ---------------------------------------------------------------------------------------------
# the agent's copy protocol, between two local processes


def agent(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "labctl.agent", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        **kw,
    )


class Server:
    def __init__(self, root: Path, models: list[str], chunk: int) -> None:
        args = {
            "root": str(root),
            "models": models,
            "chunk_size": chunk,
            "bind": "127.0.0.1",
            "idle_timeout": 20,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "labctl.agent", "cache.serve", json.dumps(args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()
        assert line.startswith("{"), line + self.proc.communicate()[0]
        self.info = json.loads(line)
        self.chunk = chunk

    def pull_args(self, cache: Path, **kw: Any) -> str:
        args = {
            "cache": str(cache),
            "address": "127.0.0.1",
            "port": self.info["port"],
            "token": self.info["token"],
            "models": list(self.info["models"].values()),
            "source": "store:/srv",
            "chunk_size": self.chunk,
            **kw,
        }
        return json.dumps(args)

    def result(self) -> dict[str, Any]:
        out, _ = self.proc.communicate(timeout=30)
        return json.loads(out)  # type: ignore[no-any-return]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    (root / "tiny").mkdir(parents=True)
    (root / "tiny" / "model.safetensors").write_bytes(os.urandom(5 * MIB + 123))
    (root / "tiny" / "config.json").write_text("{}")
    (root / "tiny" / ".cache").mkdir()
    (root / "tiny" / ".cache" / "junk").write_text("tool metadata, not served")
    (root / "one.safetensors").write_bytes(os.urandom(2 * MIB))
    (tmp_path / "secret").write_text("outside the storage folder")
    os.symlink(tmp_path / "secret", root / "escape")
    return root


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_loopback_copy_resume_and_verify(store: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    srv = Server(store, ["tiny", "one.safetensors"], MIB)
    assert sorted(f["path"] for f in srv.info["models"]["tiny"]["files"]) == [
        "tiny/config.json",
        "tiny/model.safetensors",
    ]
    # A crash after 3 chunks (2 MiB + config.json): nothing is listed as cached, they are kept.
    crashed = agent("cache.pull", srv.pull_args(cache, streams=2, chunk_size=MIB, stop_after_chunks=3))
    assert crashed.returncode == -9
    srv.proc.kill()
    srv.proc.wait()
    state = json.loads(agent("cache.state", json.dumps({"cache": str(cache)})).stdout)
    assert state["models"] == {} and sum(p["done_bytes"] for p in state["partials"]) >= 2 * MIB
    assert not (cache / "tiny").exists() and not (cache / "one.safetensors").exists()

    srv = Server(store, ["tiny", "one.safetensors"], MIB)
    done = agent("cache.pull", srv.pull_args(cache, streams=3, chunk_size=MIB))
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout)
    assert out["resumed_bytes"] >= 2 * MIB and out["fetched_bytes"] + out["resumed_bytes"] == 7 * MIB + 125
    served = srv.result()
    assert served["reason"] == "shutdown" and served["bytes_sent"] == out["fetched_bytes"]
    assert served["peers"] == ["127.0.0.1"]
    assert sha(cache / "tiny" / "model.safetensors") == sha(store / "tiny" / "model.safetensors")
    assert sha(cache / "one.safetensors") == sha(store / "one.safetensors")
    assert not (cache / "tiny" / ".cache").exists()
    progress = [json.loads(x) for x in done.stderr.splitlines() if '"progress"' in x]
    assert progress[-1]["final"] and progress[-1]["done"] == progress[-1]["total"]
    manifest = json.loads((cache / ".labctl" / "manifest.json").read_text())["models"]
    assert set(manifest) == {"tiny", "one.safetensors"}
    assert (
        manifest["tiny"]["source"] == "store:/srv/tiny" and len(manifest["tiny"]["files"][1]["chunks"]) == 6
    )

    # Corrupt one byte: verify finds the chunk, takes the model out of the listing, keeps the rest.
    with open(cache / "tiny" / "model.safetensors", "r+b") as f:
        f.seek(3 * MIB + 5)
        f.write(b"X")
    ver = json.loads(agent("cache.verify", json.dumps({"cache": str(cache)})).stdout)
    bad = {m["name"]: m for m in ver["models"]}
    assert bad["one.safetensors"]["status"] == "ok"
    assert bad["tiny"]["status"] == "corrupt" and bad["tiny"]["bad"][0]["chunks"] == [3]
    assert "tiny" not in json.loads((cache / ".labctl" / "manifest.json").read_text())["models"]
    srv = Server(store, ["tiny"], MIB)
    fixed = json.loads(agent("cache.pull", srv.pull_args(cache, chunk_size=MIB)).stdout)
    srv.result()
    assert fixed["fetched_bytes"] == MIB  # only the bad chunk crossed the network
    assert sha(cache / "tiny" / "model.safetensors") == sha(store / "tiny" / "model.safetensors")


def test_server_refuses_bad_tokens_unlisted_files_and_symlinks_out(store: Path) -> None:
    escape = agent("cache.list", json.dumps({"root": str(store), "models": ["escape"]}))
    assert escape.returncode == 1 and "outside the storage folder" in json.loads(escape.stdout)["error"]
    srv = Server(store, ["one.safetensors"], MIB)
    port = srv.info["port"]

    def ask(hello: dict[str, Any], req: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            f = s.makefile("rb")
            s.sendall(json.dumps(hello).encode() + b"\n")
            out = [json.loads(f.readline())]
            if req and out[0].get("ok"):
                s.sendall(json.dumps(req).encode() + b"\n")
                out.append(json.loads(f.readline()))
            return out

    assert ask({"token": "wrong"}) == [{"ok": False, "error": "bad token"}]
    token = {"token": srv.info["token"]}
    for path in ("tiny/model.safetensors", "../secret", "/etc/passwd", "escape"):
        reply = ask(token, {"op": "get", "path": path, "offset": 0, "length": 10})
        assert reply[1]["ok"] is False and "not served here" in reply[1]["error"]
    reply = ask(token, {"op": "get", "path": "one.safetensors", "offset": 2 * MIB - 5, "length": 10})
    assert "bad range" in reply[1]["error"]
    ask(token, {"op": "shutdown"})
    result = srv.result()
    assert result["refused"] == 1 and result["bytes_sent"] == 0


def test_missing_model_and_missing_cache_are_named(store: Path, tmp_path: Path) -> None:
    listed = json.loads(
        agent("cache.list", json.dumps({"root": str(store), "models": ["nope", "tiny"]})).stdout
    )
    assert listed["missing"] == ["nope"] and "tiny" in listed["available"]
    assert json.loads(agent("cache.state", json.dumps({"cache": str(tmp_path / "no")})).stdout) == {
        "cache": str(tmp_path / "no"),
        "exists": False,
    }


def test_touch_and_pin_update_the_manifest(store: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    srv = Server(store, ["one.safetensors"], MIB)
    assert agent("cache.pull", srv.pull_args(cache)).returncode == 0
    srv.result()
    # The source cached the chunk hashes of the file it served whole; a new listing carries them.
    listed = json.loads(
        agent(
            "cache.list", json.dumps({"root": str(store), "models": ["one.safetensors"], "chunk_size": MIB})
        ).stdout
    )
    assert listed["models"]["one.safetensors"]["files"][0]["hashed"] is True
    from labctl.agent.cache.manifest import touch, touch_path

    before = json.loads((cache / ".labctl" / "manifest.json").read_text())["models"]["one.safetensors"][
        "last_used"
    ]
    assert touch(str(cache), "nope") is None
    when = touch_path(str(cache / "one.safetensors"))
    assert when is not None and when >= before
    pin = json.loads(agent("cache.pin", json.dumps({"cache": str(cache), "model": "one.safetensors"})).stdout)
    assert pin == {"changed": True, "model": "one.safetensors", "pinned": True}
    evict = json.loads(
        agent("cache.evict", json.dumps({"cache": str(cache), "models": ["one.safetensors"]})).stdout
    )
    assert evict["pinned"] == ["one.safetensors"] and (cache / "one.safetensors").exists()
    evict = json.loads(
        agent(
            "cache.evict", json.dumps({"cache": str(cache), "models": ["one.safetensors"], "force": True})
        ).stdout
    )
    assert evict["evicted"][0]["name"] == "one.safetensors" and not (cache / "one.safetensors").exists()


def test_protected_models_are_never_evicted_for_room_as_if_pinned() -> None:
    """The orchestra's warm models are protected while a joining model is synced: room comes
    from cold models only, and when cold ones are not enough, nothing moves."""
    files = [("new/model.safetensors", 60 * MIB)]
    state = state_of(
        10 * MIB + SLACK,
        {
            "warm": cached([("warm/model.safetensors", 50 * MIB)], 1.0),
            "cold": cached([("cold/x", 55 * MIB)], 5.0),
        },
    )
    plan = plan_sync(state, listing_of(new=files), ["new"], 4 * MIB)
    assert [e.name for e in plan.evict] == ["warm"]  # least recently used, without protection
    plan = plan_sync(state, listing_of(new=files), ["new"], 4 * MIB, protect={"warm"})
    assert [e.name for e in plan.evict] == ["cold"]
    with pytest.raises(CacheFull):
        plan_sync(state, listing_of(new=files), ["new"], 4 * MIB, protect={"warm", "cold"})
