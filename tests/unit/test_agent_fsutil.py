"""The one atomic write (labctl/agent/core/fsutil.py): old or new file, never half, modes and owners kept."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO, Any

import pytest

from labctl.agent.core import fsutil


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_replaces_the_file_and_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "f.conf"
    target.write_text("old")
    target.chmod(0o640)
    assert fsutil.write_atomic(str(target), b"new contents") == len(b"new contents")
    assert target.read_bytes() == b"new contents"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert leftovers(tmp_path) == []


def test_a_new_file_gets_the_umask_mode_or_the_one_asked_for(tmp_path: Path) -> None:
    umask = os.umask(0)
    os.umask(umask)
    fsutil.write_atomic(str(tmp_path / "a"), b"x")
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o666 & ~umask
    fsutil.write_atomic(str(tmp_path / "b"), b"x", mode=0o600)
    assert stat.S_IMODE((tmp_path / "b").stat().st_mode) == 0o600


def test_a_writer_that_fails_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"intact")

    def broken(f: IO[bytes]) -> None:
        f.write(b"half of it")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        fsutil.write_atomic(str(target), broken)
    assert target.read_bytes() == b"intact"
    assert leftovers(tmp_path) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_owner_of_the_old_file_is_kept_and_a_given_one_wins(tmp_path: Path) -> None:
    target = tmp_path / "crontab"
    target.write_text("old")
    os.chown(target, 1234, 4321)
    fsutil.write_atomic(str(target), b"new")
    assert (target.stat().st_uid, target.stat().st_gid) == (1234, 4321)
    fsutil.write_atomic(str(target), b"newer", owner=(0, -1))  # gid left out: the old file's
    assert (target.stat().st_uid, target.stat().st_gid) == (0, 4321)


def test_mount_point_simulated_ebusy_is_written_in_place_only_when_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rename over a bind-mounted file fails with EBUSY in the kernel; here os.replace says so.
    target = tmp_path / "fstab"
    target.write_text("a much longer old line that must be truncated away\n")

    def busy(src: Any, dst: Any) -> None:
        raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(fsutil.os, "replace", busy)
    with pytest.raises(OSError, match="busy"):
        fsutil.write_atomic(str(target), b"new\n")
    assert target.read_text().startswith("a much longer")
    fsutil.write_atomic(str(target), b"new\n", mount_point_ok=True)
    assert target.read_text() == "new\n"
    assert leftovers(tmp_path) == []


def test_write_json_is_compact_and_sorted(tmp_path: Path) -> None:
    fsutil.write_json(str(tmp_path / "s.json"), {"b": 1, "a": [1, 2]})
    assert (tmp_path / "s.json").read_text() == '{"a":[1,2],"b":1}'
