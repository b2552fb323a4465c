"""labctl cache against the simulated lab: host-to-host copies, resume, verify/repair, eviction.

m5 caches (/mnt/model-cache, 2 GiB tmpfs, source irina) and irina stores (/srv/models). The
tests leave m5 as they found it (test_provision expects its cache unprovisioned).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, labctl, m5_cache, run_json, sh

pytestmark = pytest.mark.integration
SEED = str(REPO / "playbooks" / "provision.yaml")
CACHE = "/mnt/model-cache"
SMALL = "/mnt/small-cache"
MODELS = "/srv/models"


def sha(inv: Any, host: str, *paths: str) -> dict[str, str]:
    out = sh(inv, host, "sha256sum " + " ".join(paths))
    return {line.split()[1]: line.split()[0] for line in out.splitlines()}


def status(inv: Any, host: str = "m5") -> dict[str, Any]:
    rc, doc = run_json(inv, "cache", "status", "--host", host)
    assert rc == 0, doc
    return doc["results"][0]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def inv(lab: Any) -> Iterator[Path]:
    """The lab's inventory, with m5's cache mounted by `labctl provision` and test models on irina."""
    path = lab.inventory_path
    with m5_cache(lab):
        sh(
            path,
            "irina",
            f"mkdir -p {MODELS}/tiny && head -c 40M /dev/urandom > {MODELS}/tiny/model.safetensors && "
            f"echo '{{\"hidden_size\": 8}}' > {MODELS}/tiny/config.json && "
            f"head -c 5M /dev/urandom > {MODELS}/one.safetensors && head -c 24M /dev/urandom > {MODELS}/mid.safetensors && "
            f"for m in a b c d; do head -c 80M /dev/urandom > {MODELS}/$m.safetensors; done && "
            f"head -c 300M /dev/zero > {MODELS}/huge.bin",
        )
        try:
            yield path
        finally:
            sh(path, "irina", f"rm -rf {MODELS}")
            sh(path, "m5", f"umount {SMALL} 2>/dev/null; true")


def test_sync_copies_host_to_host_and_lists_verified_models(inv: Path, lab: Any) -> None:
    rc, doc = run_json(inv, "cache", "sync", "tiny", "one.safetensors", "--host", "m5", "--streams", "2")
    assert rc == 0, doc
    r = doc["results"][0]
    assert r["status"] == "changed"
    assert {m["name"]: m["action"] for m in r["models"]} == {"tiny": "fetch", "one.safetensors": "fetch"}
    assert r["fetched_bytes"] == 45 * 2**20 + len('{"hidden_size": 8}\n')
    # Host to host: irina served it, to m5's address (not to this controller on the bridge),
    # exactly the bytes m5 received.
    served = r["served"]
    assert r["source"] == "irina" and served["address"] == lab.hosts["irina"]
    assert served["peers"] == [lab.hosts["m5"]] and lab.bridge_address not in served["peers"]
    assert served["bytes_sent"] == r["fetched_bytes"] and served["reason"] == "shutdown"
    assert r["streams"] == 2

    src = sha(
        inv,
        "irina",
        f"{MODELS}/tiny/model.safetensors",
        f"{MODELS}/tiny/config.json",
        f"{MODELS}/one.safetensors",
    )
    dst = sha(
        inv, "m5", f"{CACHE}/tiny/model.safetensors", f"{CACHE}/tiny/config.json", f"{CACHE}/one.safetensors"
    )
    assert {p.replace(MODELS, ""): h for p, h in src.items()} == {
        p.replace(CACHE, ""): h for p, h in dst.items()
    }

    st = status(inv)
    models = {m["name"]: m for m in st["models"]}
    assert set(models) == {"tiny", "one.safetensors"}
    for m in models.values():
        assert m["verified_at"] and m["pinned"] is False and m["source"].startswith("irina:/srv/models/")
    assert models["tiny"]["files"] == 2 and st["mounted"] and st["capacity_bytes"] == 2 * 2**30

    # Nothing to do the second time: no server started, no byte moved.
    rc, again = run_json(inv, "cache", "sync", "tiny", "one.safetensors", "--host", "m5")
    a = again["results"][0]
    assert rc == 0 and a["status"] == "ok" and a["fetched_bytes"] == 0 and "served" not in a
    assert {m["action"] for m in a["models"]} == {"cached"}


def test_an_interrupted_sync_is_not_listed_and_resumes(inv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The pull kills itself (SIGKILL, as a crash would) after 3 verified 4 MiB chunks.
    monkeypatch.setenv("LABCTL_CACHE_TEST_STOP_AFTER", "3")
    proc = labctl("-i", str(inv), "cache", "sync", "mid.safetensors", "--host", "m5", "--chunk-mb", "4")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "stopped" in proc.stderr and "resume" in proc.stderr
    monkeypatch.delenv("LABCTL_CACHE_TEST_STOP_AFTER")
    st = status(inv)
    assert "mid.safetensors" not in {m["name"] for m in st["models"]}
    partial = {p["name"]: p for p in st["partials"]}["mid.safetensors"]
    assert partial["done_bytes"] >= 3 * 4 * 2**20
    assert sh(inv, "m5", f"ls {CACHE}").split() == ["one.safetensors", "tiny"]

    rc, doc = run_json(inv, "cache", "sync", "mid.safetensors", "--host", "m5", "--chunk-mb", "4")
    assert rc == 0, doc
    m = doc["results"][0]["models"][0]
    assert m["action"] == "resume" and m["verified"]
    assert m["resumed_bytes"] >= 12 * 2**20 and m["fetched_bytes"] == 24 * 2**20 - m["resumed_bytes"]
    assert doc["results"][0]["served"]["bytes_sent"] == m["fetched_bytes"]
    src = sha(inv, "irina", f"{MODELS}/mid.safetensors")[f"{MODELS}/mid.safetensors"]
    assert sha(inv, "m5", f"{CACHE}/mid.safetensors")[f"{CACHE}/mid.safetensors"] == src
    assert status(inv)["partials"] == []


def test_verify_finds_corruption_and_refetches_only_bad_chunks(inv: Path) -> None:
    # tiny was cached in 64 MiB chunks (its 40 MiB file is one), mid in 4 MiB chunks.
    sh(
        inv,
        "m5",
        f"printf XXXX | dd of={CACHE}/tiny/model.safetensors bs=1 seek=1000 conv=notrunc 2>/dev/null",
    )
    sh(
        inv,
        "m5",
        f"printf X | dd of={CACHE}/mid.safetensors bs=1 seek={5 * 2**20 + 7} conv=notrunc 2>/dev/null",
    )
    rc, doc = run_json(inv, "cache", "verify", "--host", "m5")
    assert rc == 0, doc
    by = {m["name"]: m for m in doc["results"][0]["models"]}
    assert by["one.safetensors"]["status"] == "ok"
    tiny, mid = by["tiny"], by["mid.safetensors"]
    assert tiny["status"] == "corrupt" and tiny["repaired"] is True
    assert tiny["bad"] == [
        {"path": "tiny/model.safetensors", "chunks": [0], "size": 40 * 2**20, "expected_size": 40 * 2**20}
    ]
    assert tiny["refetched_bytes"] == 40 * 2**20
    assert mid["status"] == "corrupt" and mid["repaired"] is True and mid["bad"][0]["chunks"] == [1]
    assert mid["refetched_bytes"] == 4 * 2**20  # only the bad chunk crossed the network
    for rel in ("tiny/model.safetensors", "mid.safetensors"):
        src = sha(inv, "irina", f"{MODELS}/{rel}")[f"{MODELS}/{rel}"]
        assert sha(inv, "m5", f"{CACHE}/{rel}")[f"{CACHE}/{rel}"] == src
    rc, again = run_json(inv, "cache", "verify", "tiny", "mid.safetensors", "--host", "m5")
    assert rc == 0 and {m["status"] for m in again["results"][0]["models"]} == {"ok"}


def small_cache(lab: Any, tmp_path: Path) -> Path:
    doc = yaml.safe_load(lab.inventory_path.read_text())
    doc["defaults"]["ssh_key"] = str(lab.key_path)
    doc["defaults"]["known_hosts"] = str(lab.known_hosts_path)
    doc["hosts"]["m5"]["model_cache"] = {"path": SMALL, "size_gb": 0.25, "source": "irina"}
    out = tmp_path / "small.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


def touch(inv: Path, model: str) -> None:
    """What the loader does on m5 when it loads a model: the agent's cache.touch."""
    from labctl.hosts.agent_ship import ask_agent
    from labctl.hosts.context import Context

    ctx = Context.create(inventory_path=inv)
    try:
        out = ask_agent(ctx, ctx.inventory.host("m5"), "cache.touch", {"cache": SMALL, "model": model})
    finally:
        ctx.close()
    assert out["touched"] is True


def test_cache_stays_within_its_size_lru_goes_pinned_stays(inv: Path, lab: Any, tmp_path: Path) -> None:
    small = small_cache(lab, tmp_path)
    sh(small, "m5", f"mkdir -p {SMALL} && mount -t tmpfs -o size=256M tmpfs {SMALL}")
    for m in ("a", "b", "c"):
        rc, doc = run_json(small, "cache", "sync", f"{m}.safetensors", "--host", "m5")
        assert rc == 0, doc
    rc, _ = run_json(small, "cache", "pin", "a.safetensors", "--host", "m5")
    assert rc == 0
    touch(small, "b.safetensors")  # b is now the most recently used: c is the LRU unpinned one

    rc, doc = run_json(small, "cache", "sync", "d.safetensors", "--host", "m5")
    assert rc == 0, doc
    r = doc["results"][0]
    assert [e["name"] for e in r["evicted"]] == ["c.safetensors"]
    st = status(small)
    assert {m["name"] for m in st["models"]} == {"a.safetensors", "b.safetensors", "d.safetensors"}
    assert st["used_bytes"] <= st["capacity_bytes"] == 256 * 2**20
    assert {m["name"]: m["pinned"] for m in st["models"]}["a.safetensors"] is True

    # Larger than the whole cache: a clear error before any byte moves, and nothing evicted.
    proc = labctl("-i", str(small), "cache", "sync", "huge.bin", "--host", "m5")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "more than the whole cache" in proc.stderr and "Nothing was copied" in proc.stderr
    after = status(small)
    assert {m["name"] for m in after["models"]} == {m["name"] for m in st["models"]}
    assert after["partials"] == [] and after["used_bytes"] == st["used_bytes"]

    # Evict by hand; a pinned model needs --force.
    rc, doc = run_json(small, "cache", "evict", "a.safetensors", "--host", "m5")
    assert rc == 1 and "pinned" in doc["results"][0]["error"]
    rc, doc = run_json(small, "cache", "evict", "b.safetensors", "--host", "m5")
    assert rc == 0 and doc["results"][0]["evicted"][0]["name"] == "b.safetensors"
    assert sh(small, "m5", f"ls {SMALL}").split() == ["a.safetensors", "d.safetensors"]


def test_errors_are_one_paragraph_with_exit_codes(inv: Path, lab: Any, tmp_path: Path) -> None:
    def err(inv_path: Path, *args: str) -> tuple[int, str]:
        proc = labctl("-i", str(inv_path), "cache", *args)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc.returncode, proc.stderr

    rc, out = err(inv, "sync", "no-such-model", "--host", "m5")
    assert rc == 2 and "irina has no model no-such-model in /srv/models" in out and "tiny" in out
    rc, out = err(inv, "sync", "tiny", "--host", "pharaoh")
    assert rc == 2 and "pharaoh has no model_cache" in out

    def edited(name: str, fn: Any) -> Path:
        doc = yaml.safe_load(lab.inventory_path.read_text())
        doc["defaults"]["ssh_key"] = str(lab.key_path)
        doc["defaults"]["known_hosts"] = str(lab.known_hosts_path)
        fn(doc["hosts"])
        p = tmp_path / f"{name}.yaml"
        p.write_text(yaml.safe_dump(doc))
        return p

    no_storage = edited("nostorage", lambda h: h["m5"]["model_cache"].update(source="pharaoh"))
    rc, out = err(no_storage, "sync", "tiny", "--host", "m5")
    # The inventory check already refuses it, naming the line.
    assert rc == 2 and "model_cache.source: host 'pharaoh' has no 'storage' section" in out
    down = edited("down", lambda h: h["irina"].update(port=1))
    rc, out = err(down, "sync", "tiny", "--host", "m5")
    assert rc == 1 and "Cannot reach irina" in out
    unprovisioned = edited("unprov", lambda h: h["m5"]["model_cache"].update(path="/mnt/not-there"))
    rc, out = err(unprovisioned, "sync", "tiny", "--host", "m5")
    assert rc == 1 and "no folder at its model_cache path /mnt/not-there" in out and "provision" in out
