"""Files a command writes for its user (`-o`, `--out`, `--plot`, run records, `init`): a failed
write is named with its fix, and the old file stays whole."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from labctl.output import files as fsutil
from labctl.output.errors import LabctlError


def test_a_folder_that_is_a_file_is_named_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("a file where a folder should be")
    with pytest.raises(LabctlError) as e:
        fsutil.write_output(tmp_path / "out" / "train-phase1.sbatch", "#!/bin/bash\n")
    assert f"{tmp_path / 'out'}: cannot write train-phase1.sbatch there" in e.value.message
    assert "nothing was written" in e.value.message


def test_a_full_disk_mocked_leaves_the_old_file_whole_and_says_df(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "result.json"
    target.write_text("old")

    def full(*a: object, **k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fsutil.fsutil, "write_atomic", full)
    with pytest.raises(LabctlError) as e:
        fsutil.write_output(target, "new", flag="--out")
    assert e.value.message.startswith(f"--out {tmp_path}: cannot write result.json there (No space left")
    assert "the old result.json is left as it was" in e.value.message and "df -h" in e.value.hint
    assert target.read_text() == "old"


def test_a_figure_goes_through_the_same_write(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    fsutil.save_figure(fig, tmp_path / "chart.png", dpi=50)
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "blocked").write_text("")
    with pytest.raises(LabctlError, match=r"cannot write chart\.png there"):
        fsutil.save_figure(fig, tmp_path / "blocked" / "chart.png", dpi=50)
    plt.close(fig)
