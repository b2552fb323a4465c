"""`labctl metrics --textfile` into a folder that is full: a real 64 KiB tmpfs, filled up. The
command names the folder and the fix (exit 1), and node_exporter keeps reading the old file whole:
no half-written labctl.prom, no hidden temporary file left beside it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ON_THIS_MACHINE, REPO

pytestmark = [pytest.mark.integration, ON_THIS_MACHINE]
OLD = '# the scrape before\nlabctl_host_up{host="here"} 1.0\n'


@pytest.fixture
def full_folder(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    folder = tmp_path / "textfile"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], check=True)
    try:
        (folder / "labctl.prom").write_text(OLD)
        with open(folder / "filler", "wb", buffering=0) as f:
            try:
                while f.write(b"\0" * 4096):
                    pass
            except OSError:
                pass  # full: what the test wants
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_full_textfile_folder_is_named_and_keeps_the_old_file_whole(
    full_folder: Path, tmp_path: Path
) -> None:
    inv = tmp_path / "lab.yaml"
    inv.write_text(
        f"lab: l\nhosts:\n  here: {{address: 127.0.0.1, connection: local, python: {sys.executable}}}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", "-i", str(inv), "metrics", "--textfile", str(full_folder)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "HOME": str(tmp_path), "COLUMNS": "200"},  # the local host's agent cache
    )
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"--textfile {full_folder}: cannot write labctl.prom there (No space left on device)" in said
    assert "the old labctl.prom is left as it was" in said and f"df -h {full_folder}" in said
    assert (full_folder / "labctl.prom").read_text() == OLD
    assert sorted(p.name for p in full_folder.iterdir()) == ["filler", "labctl.prom"]
