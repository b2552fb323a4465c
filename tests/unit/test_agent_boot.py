"""BOOT, the command every labctl call runs on a host, run for real with the system's python3 in a
tmp folder: it checks the zipapp's hash, runs the agent from agent-<digest>/ beside it (extracted
whole by the first call, so CPython keeps bytecode there), and falls back to the zipapp itself
where that folder cannot be made. A missing or damaged zipapp still answers MISSING_RC."""

from __future__ import annotations

import ast
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from labctl.agent.core.boot import BOOT, MISSING_RC
from labctl.hosts.agent_ship import agent_zip

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
# The host's own environment, not this test's: no labctl on PYTHONPATH; PYTHONDONTWRITEBYTECODE
# set, as some hosts have it: BOOT writes bytecode into its own folder all the same.
ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONDONTWRITEBYTECODE": "1"}
# Python run before BOOT (same argv) to make the host's disk refuse: os.mkdir or os.fsync fails.
READ_ONLY = "import errno, os\ndef _refuse(*a, **k): raise OSError(errno.EROFS, 'Read-only file system')\nos.mkdir = _refuse\n"
FULL = "import errno, os\ndef _full(*a, **k): raise OSError(errno.ENOSPC, 'No space left on device')\nos.fsync = _full\n"


@pytest.fixture
def pyz(tmp_path: Path) -> Path:
    folder = tmp_path / "agent"
    folder.mkdir(mode=0o700)
    data, digest = agent_zip()
    path = folder / f"agent-{digest}.pyz"
    path.write_bytes(data)
    return path


def boot(pyz: Path, command: str = "ping", before: str = "") -> subprocess.CompletedProcess[str]:
    digest = agent_zip()[1]
    argv = [PYTHON, "-c", before + BOOT, str(pyz), digest, command, "{}"]
    return subprocess.run(argv, capture_output=True, text=True, env=ENV, cwd=pyz.parent, timeout=60)


def answer(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert isinstance(out, dict)
    return out


def folder_of(pyz: Path) -> Path:
    return pyz.with_suffix("")


def siblings(pyz: Path) -> list[str]:
    return sorted(p.name for p in pyz.parent.iterdir())


def test_the_first_call_extracts_the_agent_beside_its_zipapp_and_answers(pyz: Path) -> None:
    out = answer(boot(pyz))
    assert set(out) >= {"agent_version", "pid", "python"}
    root = folder_of(pyz)
    assert siblings(pyz) == sorted([pyz.name, root.name])  # no temporary folder left behind
    assert (root / ".complete").is_file() and (root / "labctl/agent/__main__.py").is_file()
    # Private like the zipapp's folder: nothing in it readable, let alone writable, by others.
    for p in [root, *root.rglob("*")]:
        assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, p
    # Every module the zipapp holds, byte for byte.
    import io
    import zipfile

    with zipfile.ZipFile(io.BytesIO(pyz.read_bytes())) as z:
        for name in z.namelist():
            assert (root / name).read_bytes() == z.read(name), name


def test_later_calls_run_from_the_folder_and_its_bytecode(pyz: Path) -> None:
    answer(boot(pyz))
    root = folder_of(pyz)
    pyc = sorted(p.relative_to(root).as_posix() for p in root.rglob("__pycache__/*.pyc"))
    # ENV may say PYTHONDONTWRITEBYTECODE: BOOT writes bytecode to its own folder regardless.
    assert any(p.startswith("labctl/agent/__pycache__/commands.") for p in pyc), pyc
    inode = root.stat().st_ino
    stamps = {p: p.stat().st_mtime_ns for p in root.glob("labctl/**/*.pyc")}
    # What runs now is the folder, not the zipapp: a changed __main__ there is what answers.
    (root / "__main__.py").write_text('print(\'{"from": "folder"}\')\n')
    assert answer(boot(pyz)) == {"from": "folder"}
    (root / "__main__.py").write_bytes(
        b"from labctl.agent.__main__ import main\nimport sys\nsys.exit(main())\n"
    )
    assert "agent_version" in answer(boot(pyz))
    assert root.stat().st_ino == inode  # not extracted again
    assert {
        p: p.stat().st_mtime_ns for p in root.glob("labctl/**/*.pyc")
    } == stamps  # bytecode read, not rewritten


def test_an_extraction_cut_short_is_never_run(pyz: Path) -> None:
    # Their __main__ would answer {"from": "half"} if either were run.
    bad = 'print(\'{"from": "half"}\')\n'
    # A temporary folder left by a call killed mid-extraction: this call extracts its own.
    half = pyz.parent / (folder_of(pyz).name + ".tmp-99999-0badc0de")
    half.mkdir(mode=0o700)
    (half / "__main__.py").write_text(bad)
    assert "agent_version" in answer(boot(pyz))
    assert (folder_of(pyz) / ".complete").is_file()
    assert sorted(p.name for p in half.iterdir()) == ["__main__.py"]  # another call's: left alone
    # A folder in place without the marker that only a complete extraction has: not run, and not
    # replaced (a process may be using it): the zipapp answers.
    shutil.rmtree(half)
    shutil.rmtree(folder_of(pyz))
    folder_of(pyz).mkdir(mode=0o700)
    (folder_of(pyz) / "__main__.py").write_text(bad)
    assert "agent_version" in answer(boot(pyz))
    assert siblings(pyz) == sorted([pyz.name, folder_of(pyz).name])
    assert sorted(p.name for p in folder_of(pyz).iterdir()) == ["__main__.py"]


def test_the_first_call_after_a_half_extraction_left_behind_extracts_its_own(pyz: Path) -> None:
    half = pyz.parent / (pyz.with_suffix("").name + ".tmp-99999-0badc0de")
    half.mkdir(mode=0o700)
    (half / "labctl").mkdir()
    answer(boot(pyz))
    assert (folder_of(pyz) / ".complete").is_file()
    assert sorted(p.name for p in half.iterdir()) == ["labctl"]  # someone else's, left alone


@pytest.mark.parametrize("disk", [READ_ONLY, FULL], ids=["read_only", "full"])
def test_a_disk_that_refuses_the_folder_runs_the_zipapp_as_before(pyz: Path, disk: str) -> None:
    out = answer(boot(pyz, before=disk))
    assert "agent_version" in out
    assert siblings(pyz) == [pyz.name]  # no folder, and no temporary one left half written


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_folder_this_user_may_not_write_runs_the_zipapp_as_before(pyz: Path) -> None:
    pyz.parent.chmod(0o500)
    try:
        assert "agent_version" in answer(boot(pyz))
        assert siblings(pyz) == [pyz.name]
    finally:
        pyz.parent.chmod(0o700)


def test_a_missing_or_damaged_zipapp_answers_missing_rc_even_beside_its_folder(pyz: Path) -> None:
    answer(boot(pyz))  # the folder is there now
    data = pyz.read_bytes()
    pyz.write_bytes(data[: len(data) // 2])  # cut short
    proc = boot(pyz)
    assert proc.returncode == MISSING_RC and proc.stdout == "", proc.stderr
    pyz.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])  # one bit flipped
    assert boot(pyz).returncode == MISSING_RC
    pyz.unlink()
    assert boot(pyz).returncode == MISSING_RC
    pyz.write_bytes(data)  # uploaded again: answers from the folder
    assert "agent_version" in answer(boot(pyz))


def test_calls_racing_to_extract_all_answer_and_leave_one_folder(pyz: Path) -> None:
    digest = agent_zip()[1]
    argv = [PYTHON, "-c", BOOT, str(pyz), digest, "ping", "{}"]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        for _ in range(6)
    ]
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert "agent_version" in json.loads(out)
    assert siblings(pyz) == sorted([pyz.name, folder_of(pyz).name])
    assert (folder_of(pyz) / ".complete").is_file()


def test_boot_is_python_3_8_and_small() -> None:
    ast.parse(BOOT, feature_version=(3, 8))  # the oldest Python a host may run it with
    assert len(BOOT) < 8 * 1024  # one argument of the login shell, capped at 128 KiB


def test_a_read_only_call_writes_nothing_but_uses_a_whole_folder(pyz: Path) -> None:
    before = "import sys\nsys.argv.insert(1, '--read-only')\n"  # as call_agent(read_only=True) runs it
    assert "agent_version" in answer(boot(pyz, before=before))
    assert siblings(pyz) == [pyz.name]  # nothing extracted
    answer(boot(pyz))  # a call that may write extracts it
    root = folder_of(pyz)
    for pyc in root.rglob("*.pyc"):
        pyc.unlink()
    (root / "__main__.py").write_text('print(\'{"from": "folder"}\')\n')
    assert answer(boot(pyz, before=before)) == {"from": "folder"}  # the whole folder is used
    assert list(root.rglob("*.pyc")) == []  # and no bytecode written into it
