"""The trainer's checkpoint folder: atomic writes, manifest hashes, pruning, choosing a common step."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.models.tinylm import make_config
from labctl.agent.train.ckpt import CheckpointDir, choose_common, config_mismatch, manifest_name, pt_name

CONFIG = make_config(vocab=256, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq=32, dtype="fp32")


def raw_save(state: Any, f: Any) -> None:
    """A stand-in for torch.save: the state is the bytes to write."""
    f.write(state)


def payload(step: int) -> bytes:
    return hashlib.sha256(str(step).encode()).digest() * 64


def save_steps(ck: CheckpointDir, steps: list[int]) -> None:
    for step in steps:
        ck.save(step, payload(step), CONFIG, save=raw_save)


def test_save_writes_checkpoint_and_manifest_and_no_temp_files(tmp_path: Path) -> None:
    ck = CheckpointDir(str(tmp_path / "ck"))
    info = ck.save(7, payload(7), CONFIG, save=raw_save)
    names = sorted(os.listdir(tmp_path / "ck"))
    assert names == [manifest_name(7), pt_name(7)] == ["step-00000007.json", "step-00000007.pt"]
    data = (tmp_path / "ck" / pt_name(7)).read_bytes()
    manifest = json.loads((tmp_path / "ck" / manifest_name(7)).read_text())
    assert data == payload(7)
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest() == info["sha256"]
    assert manifest["bytes"] == len(data) and manifest["step"] == 7
    assert manifest["model"]["d_model"] == 32 and manifest["time"].endswith("Z")
    assert info["path"] == str(tmp_path / "ck" / pt_name(7))
    assert ck.check(7) is None


def test_torch_state_round_trips_with_the_streamed_hash(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    ck = CheckpointDir(str(tmp_path))
    state: dict[str, Any] = {
        "model": {"w": torch.arange(1000, dtype=torch.float32)},
        "step": 3,
        "betas": (0.9, 0.999),
    }
    info = ck.save(3, state, CONFIG)
    assert hashlib.sha256(Path(info["path"]).read_bytes()).hexdigest() == info["sha256"]
    loaded = torch.load(info["path"], weights_only=True)
    assert torch.equal(loaded["model"]["w"], state["model"]["w"]) and loaded["betas"] == (0.9, 0.999)


def test_a_failed_save_leaves_nothing_behind(tmp_path: Path) -> None:
    ck = CheckpointDir(str(tmp_path))
    save_steps(ck, [1])

    def dies_halfway(state: Any, f: Any) -> None:
        f.write(b"x" * 1000)
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        ck.save(2, None, CONFIG, save=dies_halfway)
    assert sorted(os.listdir(tmp_path)) == [manifest_name(1), pt_name(1)]
    assert ck.scan() == ([1], [])


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


CORRUPTIONS = {
    "flipped": (lambda d, s: flip(d / pt_name(s)), "sha256 mismatch"),
    "truncated": (lambda d, s: os.truncate(d / pt_name(s), 100), "truncated"),
    "no manifest": (lambda d, s: os.unlink(d / manifest_name(s)), "manifest missing"),
    "no checkpoint": (lambda d, s: os.unlink(d / pt_name(s)), "checkpoint file missing"),
    "bad manifest": (lambda d, s: (d / manifest_name(s)).write_text("{not json"), "manifest unreadable"),
    "manifest of another step": (
        lambda d, s: (d / manifest_name(s)).write_text(
            json.dumps({"step": s + 1, "sha256": "0", "bytes": 1})
        ),
        "manifest incomplete",
    ),
}


@pytest.mark.parametrize("how", list(CORRUPTIONS))
def test_check_names_what_is_wrong(tmp_path: Path, how: str) -> None:
    ck = CheckpointDir(str(tmp_path))
    save_steps(ck, [2, 4])
    corrupt, reason = CORRUPTIONS[how]
    corrupt(tmp_path, 4)
    why = ck.check(4)
    assert why is not None and reason in why
    valid, skipped = ck.scan()
    assert valid == [2]
    assert [(e["step"], e["path"]) for e in skipped] == [(4, str(tmp_path / pt_name(4)))]
    assert reason in skipped[0]["reason"]


def test_trusting_own_writes_skips_the_rehash_but_scan_does_not(tmp_path: Path) -> None:
    ck = CheckpointDir(str(tmp_path))
    save_steps(ck, [5])
    path = tmp_path / pt_name(5)
    st = os.stat(path)
    flip(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: only a hash sees it
    assert ck.check(5, trust_own=True) is None
    assert "sha256 mismatch" in (ck.check(5) or "")
    # A fresh process (resuming) knows nothing it wrote: it always hashes.
    assert CheckpointDir(str(tmp_path)).scan(trust_own=True)[0] == []


def test_prune_keeps_the_newest_valid_ones(tmp_path: Path) -> None:
    ck = CheckpointDir(str(tmp_path))
    save_steps(ck, [1, 2, 3, 4, 5])
    assert ck.prune(3) == [1, 2]
    assert ck.steps_present() == [3, 4, 5]
    flip(tmp_path / pt_name(5))
    # 5 is corrupt: the newest 2 valid are 3 and 4, and the newer invalid 5 stays to be reported.
    assert ck.prune(2) == []
    assert ck.steps_present() == [3, 4, 5]
    save_steps(ck, [6])
    assert ck.prune(2) == [3]
    assert ck.scan()[0] == [4, 6]
    with pytest.raises(ValueError, match="at least 1"):
        ck.prune(0)


def test_prune_deletes_invalid_ones_older_than_what_is_kept(tmp_path: Path) -> None:
    ck = CheckpointDir(str(tmp_path))
    save_steps(ck, [1, 2, 3])
    os.unlink(tmp_path / manifest_name(1))
    assert ck.prune(2) == [1]
    assert sorted(os.listdir(tmp_path)) == sorted(n for s in (2, 3) for n in (pt_name(s), manifest_name(s)))


def test_clean_temp_removes_only_leftovers_of_crashed_writes(tmp_path: Path) -> None:
    ck = CheckpointDir(str(tmp_path))
    save_steps(ck, [1])
    (tmp_path / ".step-00000002.pt.abc123.tmp").write_bytes(b"half")
    (tmp_path / ".step-00000002.json.x.tmp").write_text("{")
    (tmp_path / "notes.tmp").write_text("mine")
    assert sorted(ck.clean_temp()) == [".step-00000002.json.x.tmp", ".step-00000002.pt.abc123.tmp"]
    assert sorted(os.listdir(tmp_path)) == sorted([manifest_name(1), pt_name(1), "notes.tmp"])


def test_scan_of_a_missing_folder_is_empty(tmp_path: Path) -> None:
    assert CheckpointDir(str(tmp_path / "nope")).scan() == ([], [])


@pytest.mark.parametrize(
    ("hosts", "want"),
    [
        ([[2, 4, 6], [2, 4, 6]], 6),
        ([[2, 4, 6], [2, 4]], 4),  # 6 missing on the second host
        ([[2, 4, 6], [2, 6], [4, 6, 8]], 6),
        ([[2, 4], [6]], None),  # nothing in common: start over
        ([[2, 4, 6]], 6),
        ([[], [2]], None),
        ([], None),
    ],
)
def test_choose_common_picks_the_newest_step_valid_everywhere(
    hosts: list[list[int]], want: int | None
) -> None:
    assert choose_common(hosts) == want


def test_config_mismatch_names_each_differing_field() -> None:
    other = dict(CONFIG, d_model=64, n_heads=4)
    diffs = config_mismatch(CONFIG, other)
    assert len(diffs) == 2
    assert "d_model 32 in the checkpoint vs 64 in the settings" in diffs
    assert config_mismatch(CONFIG, dict(CONFIG, dtype="bf16")) == []  # storage dtype is not the model
    assert config_mismatch(CONFIG, dict(CONFIG, tie_embeddings=None)) == []
