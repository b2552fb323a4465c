"""The checkpoint library's layout on the storage host (labctl/agent/ckpt/library.py), on real files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.ckpt import library as lib
from labctl.agent.ckpt.library_cmds import list_command, restore_commit_command, verify_command
from labctl.agent.core.errors import AgentError
from labctl.agent.train.ckpt import CheckpointDir, manifest_name, pt_name
from labctl.ckpt.backup import choose, skipped_on_hosts

MODEL = {
    "vocab": 16,
    "d_model": 8,
    "n_layers": 1,
    "n_heads": 1,
    "d_ff": 16,
    "max_seq": 8,
    "tie_embeddings": True,
}


def write_bytes(state: Any, f: Any) -> None:
    f.write(state)


def incoming(root: Path, run: str, step: int, payload: bytes = b"weights" * 1000) -> str:
    path = lib.incoming_dir(str(root), run, step)
    CheckpointDir(path).save(step, payload, MODEL, save=write_bytes)
    return path


def test_commit_verifies_and_makes_the_copy_visible_with_its_record(tmp_path: Path) -> None:
    assert lib.entries(str(tmp_path)) == []
    incoming(tmp_path, "run-a", 120)
    assert lib.entries(str(tmp_path)) == []  # an incoming copy is invisible
    entry = lib.commit(
        str(tmp_path),
        "run-a",
        120,
        {"origin": "backup", "source_host": "m5", "backed_up_at": "2026-11-01T00:00:00Z"},
    )
    assert entry["existed"] is False and entry["path"] == lib.step_dir(str(tmp_path), "run-a", 120)
    assert not os.path.exists(lib.incoming_dir(str(tmp_path), "run-a", 120))
    record = json.loads((Path(entry["path"]) / lib.RECORD).read_text())
    assert record["backed_up_at"] == "2026-11-01T00:00:00Z" and record["bytes"] == 7000
    assert record["run_id"] == "run-a" and record["step"] == 120 and len(record["sha256"]) == 64
    [listed] = lib.entries(str(tmp_path))
    assert (listed["run_id"], listed["step"]) == ("run-a", 120) and lib.check_entry(
        listed["path"], 120
    ) is None
    # Committing the same step again keeps the first copy and drops the new incoming one.
    incoming(tmp_path, "run-a", 120, b"other")
    again = lib.commit(str(tmp_path), "run-a", 120, {})
    assert again["existed"] is True and again["record"]["bytes"] == 7000
    assert not os.path.exists(lib.incoming_dir(str(tmp_path), "run-a", 120))


def test_a_damaged_incoming_copy_is_refused_and_stays_invisible(tmp_path: Path) -> None:
    path = incoming(tmp_path, "run-a", 5)
    with open(os.path.join(path, pt_name(5)), "r+b") as f:
        f.seek(10)
        f.write(b"X")
    with pytest.raises(lib.LibraryError, match="sha256 mismatch"):
        lib.commit(str(tmp_path), "run-a", 5, {})
    assert lib.entries(str(tmp_path)) == [] and os.path.isdir(path)
    os.unlink(os.path.join(path, manifest_name(5)))
    with pytest.raises(lib.LibraryError, match="manifest missing"):
        lib.commit(str(tmp_path), "run-a", 5, {})


def test_entries_skip_incoming_removing_and_foreign_folders(tmp_path: Path) -> None:
    incoming(tmp_path, "run-a", 1)
    lib.commit(str(tmp_path), "run-a", 1, {})
    incoming(tmp_path, "run-a", 2)  # under way
    os.makedirs(tmp_path / "run-a" / ".removing-step-00000003")
    os.makedirs(tmp_path / "run-a" / "notes")
    os.makedirs(tmp_path / ".trash" / "step-00000004")
    (tmp_path / "stray.txt").write_text("x")
    assert [(e["run_id"], e["step"]) for e in lib.entries(str(tmp_path))] == [("run-a", 1)]
    assert list_command({"lib": str(tmp_path)})["incoming"] == ["run-a/.incoming-step-00000002"]


def test_remove_takes_the_copy_out_of_sight(tmp_path: Path) -> None:
    for step in (1, 2):
        incoming(tmp_path, "run-a", step)
        lib.commit(str(tmp_path), "run-a", step, {})
    lib.remove(str(tmp_path), "run-a", 1)
    assert [e["step"] for e in lib.entries(str(tmp_path))] == [2]
    assert sorted(os.listdir(tmp_path / "run-a")) == ["step-00000002"]


def test_run_ids_that_are_not_one_plain_folder_name_are_refused(tmp_path: Path) -> None:
    for bad in ("../etc", ".hidden", "a/b", ""):
        with pytest.raises(lib.LibraryError):
            lib.step_dir(str(tmp_path), bad, 1)


def test_verify_names_the_damaged_copy_and_why(tmp_path: Path) -> None:
    for step in (1, 2):
        incoming(tmp_path, "run-a", step)
        lib.commit(str(tmp_path), "run-a", step, {})
    pt = Path(lib.step_dir(str(tmp_path), "run-a", 2)) / pt_name(2)
    data = bytearray(pt.read_bytes())
    data[100] ^= 0xFF
    pt.write_bytes(bytes(data))
    os.unlink(Path(lib.step_dir(str(tmp_path), "run-a", 1)) / lib.RECORD)
    got = {e["step"]: e for e in verify_command({"lib": str(tmp_path)})["entries"]}
    assert got[2]["status"] == "damaged" and "sha256 mismatch" in got[2]["reason"]
    assert got[1]["status"] == "damaged" and lib.RECORD in got[1]["reason"]


def test_a_damaged_copy_is_marked_and_replaced_only_by_the_same_checkpoint(tmp_path: Path) -> None:
    root = str(tmp_path)
    incoming(tmp_path, "run-a", 5)
    lib.commit(root, "run-a", 5, {"backed_up_at": "2026-11-01T00:00:00Z"})
    final = Path(lib.step_dir(root, "run-a", 5))
    with open(final / pt_name(5), "r+b") as f:
        f.seek(10)
        f.write(b"X")
    [found] = verify_command({"lib": root, "mark": True})["entries"]
    assert found["status"] == "damaged"
    [listed] = list_command({"lib": root})["entries"]
    assert "sha256 mismatch" in listed["damaged"]
    # Other bytes under the same run and step are another checkpoint: the damaged copy stays.
    incoming(tmp_path, "run-a", 5, b"other")
    with pytest.raises(lib.LibraryError, match="left as it is"):
        lib.commit(root, "run-a", 5, {})
    assert lib.check_entry(str(final), 5) is not None
    incoming(tmp_path, "run-a", 5)
    entry = lib.commit(root, "run-a", 5, {"backed_up_at": "2026-12-01T00:00:00Z"})
    assert entry["existed"] is False and "sha256 mismatch" in entry["replaced"]
    assert lib.check_entry(str(final), 5) is None and lib.damaged_reason(str(final)) is None
    assert entry["record"]["backed_up_at"] == "2026-11-01T00:00:00Z"  # retention's date stays
    assert sorted(os.listdir(tmp_path / "run-a")) == ["step-00000005"]


def test_backup_copies_one_step_once_from_the_first_host_holding_it() -> None:
    found = [
        {"host": "m5", "step": 40, "dir": "/c"},
        {"host": "irina", "step": 40, "dir": "/c"},
        {"host": "h3", "error": "unreachable"},
        {"host": "h4", "step": 30, "dir": "/c"},
    ]
    assert [(f["host"], f["step"]) for f in choose(found)] == [("h4", 30), ("m5", 40)]


def test_a_copy_whose_manifest_was_rewritten_to_match_other_bytes_is_damaged(tmp_path: Path) -> None:
    root = str(tmp_path)
    incoming(tmp_path, "run-a", 7)
    lib.commit(root, "run-a", 7, {})
    final = Path(lib.step_dir(root, "run-a", 7))
    # Other bytes, and a manifest made to agree with them: the trainer's check alone passes it.
    CheckpointDir(str(final)).save(7, b"not the weights that were backed up", MODEL, save=write_bytes)
    assert CheckpointDir(str(final)).check(7) is None
    [found] = verify_command({"lib": root, "mark": True})["entries"]
    assert found["status"] == "damaged" and "manifest rewritten" in found["reason"], found
    assert lib.damaged_reason(str(final)) is not None


def staged(folder: Path, step: int, payload: bytes = b"weights" * 1000) -> Path:
    stage = folder / f".labctl-restore-step-{step:08d}"
    CheckpointDir(str(stage)).save(step, payload, MODEL, save=write_bytes)
    return stage


def test_a_restored_copy_is_checked_on_arrival_and_put_in_place_whole_or_not_at_all(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    stage = staged(folder, 30)
    sha = CheckpointDir(str(stage)).manifest(30)["sha256"]
    args = {"dir": str(folder), "staging": stage.name, "step": 30, "sha256": sha}
    done = restore_commit_command(args)
    assert sorted(os.listdir(folder)) == [manifest_name(30), pt_name(30)]
    assert CheckpointDir(str(folder)).check(30) is None and done["sha256"] == sha

    # Damaged on the way: refused, the hidden copy removed, the good step 30 already there kept.
    stage = staged(folder, 30)
    with open(stage / pt_name(30), "r+b") as f:
        f.seek(10)
        f.write(b"X")
    with pytest.raises(AgentError, match=r"does not verify.*sha256 mismatch"):
        restore_commit_command(args)
    assert sorted(os.listdir(folder)) == [manifest_name(30), pt_name(30)]
    assert CheckpointDir(str(folder)).check(30) is None

    # Whole and self-consistent, but not the checkpoint the library holds: refused as well.
    staged(folder, 40, b"other bytes")
    other = {"dir": str(folder), "staging": ".labctl-restore-step-00000040", "step": 40, "sha256": sha}
    with pytest.raises(AgentError, match="library's record"):
        restore_commit_command(other)
    assert sorted(os.listdir(folder)) == [manifest_name(30), pt_name(30)]
    with pytest.raises(AgentError, match="hidden folder"):
        restore_commit_command({**args, "staging": "../elsewhere"})


def test_a_damaged_newer_checkpoint_on_a_host_is_named_with_the_step_taken_instead() -> None:
    hosts = [
        {
            "host": "m5",
            "dir": "/c",
            "step": 600,
            "skipped": [{"step": 800, "reason": "sha256 mismatch: 1234... on disk, manifest says abcd..."}],
        },
        {"host": "irina", "dir": "/c", "step": 800, "skipped": []},
        {"host": "h3", "dir": "/c", "step": None, "skipped": [{"step": 700, "reason": "manifest missing"}]},
    ]
    picks = choose(hosts)
    [m5, h3] = skipped_on_hosts("r1", hosts, picks, dry_run=False)
    assert (m5["host"], m5["step"], m5["instead"]) == ("m5", 800, 600)
    assert m5["text"] == (
        "skipped step 800 of r1 on m5 (/c/step-00000800.pt): sha256 mismatch: 1234... on disk, manifest "
        "says abcd...; backed up step 600 instead (step 800 itself came from irina, where it is valid)"
    )
    assert h3["instead"] is None and "no valid checkpoint is left on h3" in h3["text"]
    [failed, _] = skipped_on_hosts("r1", hosts, picks, dry_run=False, actions={("r1", 600): "failed"})
    assert "step 600, taken instead, failed too" in failed["text"]
    assert "would back up step 600" in skipped_on_hosts("r1", hosts, picks, dry_run=True)[0]["text"]
