"""The process entry (labctl.cli.app.entry: the `labctl` script, `python -m labctl`) ends the
process with os._exit after main(): the exit code, all the output and the atexit handlers as an
ordinary exit gives them, without tearing the interpreter down."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def entry_with(body: str, *, tail: str = "") -> subprocess.CompletedProcess[str]:
    """Run labctl's entry in a fresh python with main() replaced by `body` (its lines, indented
    by the test); `tail` runs before, at module level (atexit handlers, threads)."""
    code = (
        "import atexit, os, sys, threading, time\n"
        "import labctl.cli.app as cli\n"
        f"{tail}\n"
        "def fake_main():\n" + "".join(f"    {line}\n" for line in body.splitlines()) + "    return None\n"
        "cli.main = fake_main\n"
        "cli.entry()\n"
        "print('entry returned')\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)


@pytest.mark.parametrize("code", [0, 1, 2, 130])
def test_exit_code_is_kept(code: int) -> None:
    proc = entry_with(f"print('out'); sys.exit({code})")
    assert (proc.returncode, proc.stdout, proc.stderr) == (code, "out\n", "")


def test_main_returning_exits_0_without_returning_to_the_caller() -> None:
    proc = entry_with("print('done')")
    assert (proc.returncode, proc.stdout) == (0, "done\n")  # not 'entry returned': os._exit


def test_exit_with_a_message_and_a_traceback_take_the_ordinary_way() -> None:
    proc = entry_with("sys.exit('bad thing')")
    assert (proc.returncode, proc.stderr) == (1, "bad thing\n")
    proc = entry_with("raise RuntimeError('boom')")
    assert proc.returncode == 1 and "RuntimeError: boom" in proc.stderr


def test_large_output_to_a_pipe_is_complete_and_atexit_handlers_run() -> None:
    proc = entry_with(
        "sys.stdout.write('x' * 5_000_000 + '\\n'); sys.stderr.write('e' * 100_000); sys.exit(1)",
        tail="atexit.register(lambda: print('atexit ran'))",
    )
    assert proc.returncode == 1
    assert proc.stdout == "x" * 5_000_000 + "\natexit ran\n"
    assert proc.stderr == "e" * 100_000


def test_a_running_non_daemon_thread_is_waited_for() -> None:
    proc = entry_with(
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread done', flush=True))).start(); sys.exit(2)"
    )
    assert (proc.returncode, proc.stdout) == (2, "thread done\n")


def labctl_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "labctl", *args], capture_output=True, text=True, timeout=60, cwd=REPO
    )


def test_python_m_labctl_exits_through_the_entry() -> None:
    from labctl import __version__

    version = labctl_script("--version")
    assert (version.returncode, version.stdout) == (0, f"labctl {__version__}\n")
    unknown = labctl_script("no-such-command")
    assert unknown.returncode == 2 and "No such command" in unknown.stderr
    missing = labctl_script("-i", "/nonexistent/lab.yaml", "--json", "exec", "--", "true")
    assert missing.returncode == 2 and '"exit_code": 2' in missing.stdout


def test_json_output_of_a_command_through_a_pipe_is_complete(tmp_path: Path) -> None:
    inv = tmp_path / "lab.yaml"
    inv.write_text("lab: t\ndefaults: {connection: local}\nhosts:\n  a: {address: 127.0.0.1}\n")
    proc = labctl_script("-i", str(inv), "--json", "exec", "--", "head -c 300000 /dev/zero | tr '\\0' y")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    assert doc["results"][0]["stdout"] == "y" * 300000
