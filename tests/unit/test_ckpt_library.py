"""The checkpoint library's layout on the storage host (labctl/agent/ckpt_library.py), on real files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from labctl.agent import ckpt_library as lib
from labctl.agent.ckpt import CheckpointDir, manifest_name, pt_name
from labctl.agent.ckpt_lib_cmds import list_command, verify_command
from labctl.ckpt.backup import choose

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
