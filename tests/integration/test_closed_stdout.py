"""A reader that goes away (`labctl train ... | head -4`) never reaches the hosts.

rich answers a write to a closed pipe with SystemExit(1) from whichever thread printed: a host's
thread then ended without a result, fan_out waited for it for ever (labctl hung), and over SSH
the channel closed, whose watchdog killed the command (a training run without its checkpoint).
Now the console falls silent, the command runs to its end, and labctl exits with its code.

Each test reads a few lines from labctl's stdout, closes it as `head` does, and then only waits
(a bounded wait: labctl must exit by itself) and looks at what the hosts did.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ON_THIS_MACHINE, REPO, TRAIN_TINY

pytestmark = [pytest.mark.integration, ON_THIS_MACHINE]

# Generous: torch's import and a tiny run on a busy 2-core machine. Only a hang reaches it.
EXIT_WAIT_S = 240
STEPS = 20


def local_inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        f"lab: l\nhosts:\n  here: {{address: 127.0.0.1, connection: local, python: {sys.executable}}}\n"
    )
    return inv


def start(*args: str, stderr: int = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "labctl", *args],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        cwd=REPO,
    )


def read_then_close(proc: subprocess.Popen[str], n: int) -> list[str]:
    """`| head -n`: the first `n` lines of labctl's stdout, then the pipe closed."""
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(n)]
    proc.stdout.close()
    return lines


def finish(proc: subprocess.Popen[str]) -> str:
    """labctl's stderr once it has exited by itself (it hung here before)."""
    try:
        _, err = proc.communicate(timeout=EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"labctl did not exit within {EXIT_WAIT_S} s of its stdout's reader going away")
    return err or ""


def train_with_head(inv: Path, host: str, ckpt: str) -> None:
    """`labctl train ... | head -3` on `host`: the run ends at its last step, with its checkpoint."""
    runs = inv.parent / ".labctl" / "runs"
    before = set(runs.iterdir()) if runs.exists() else set()
    proc = start(
        "-i", str(inv), "train", "--phase", "1", "--limit", host, "--device", "cpu",
        "--python", sys.executable, *TRAIN_TINY, "--set", "gpus=[]", "--set", "port=0",
        "--set", f"steps={STEPS}", "--set", "log_every=1", "--set", "checkpoint_every=100000",
        "--set", f"checkpoint_dir={ckpt}",
    )  # fmt: skip
    head = read_then_close(proc, 3)
    assert all(line.startswith(f"{host}/0") for line in head), head  # rank 0's lines, as printed
    err = finish(proc)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    assert "the reader of stdout has gone" in err
    (run,) = set(runs.iterdir()) - before
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "done" and events[-1]["step"] == STEPS, events[-1]
    assert f"no process of {run.name} remains on {host}" in err  # the recap still reached stderr


def test_train_here_goes_on_to_its_last_step_and_checkpoint_when_stdout_is_closed(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    train_with_head(local_inventory(tmp_path), "here", str(ckpt))
    assert (ckpt / f"step-{STEPS:08d}.pt").is_file()


def test_train_over_ssh_is_not_stopped_by_the_watchdog_when_stdout_is_closed(
    lab: Any, tmp_path: Path
) -> None:
    # Before, the channel closed when labctl's thread died, and m5's watchdog killed torchrun.
    ckpt = tmp_path / "ckpt"  # the sim's hosts share this machine's files
    train_with_head(lab.inventory_path, "m5", str(ckpt))
    assert (ckpt / f"step-{STEPS:08d}.pt").is_file()


def exec_script(tmp_path: Path) -> tuple[str, Path]:
    """Two lines, then (once the test has closed the pipe) twenty more over two seconds, and a marker
    file: over SSH, labctl leaving early closed the channel, and the watchdog stopped it before."""
    go, marker = tmp_path / "go", tmp_path / "finished"
    line = (
        f"echo one; echo two; while [ ! -e {go} ]; do sleep 0.05; done; "
        f"for i in $(seq 20); do echo line $i; sleep 0.1; done; echo done > {marker}"
    )
    return line, marker


def test_exec_runs_to_its_end_here_when_stdout_is_closed(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path)
    line, marker = exec_script(tmp_path)
    proc = start("-i", str(inv), "exec", "--", line)
    assert [s.split("│")[-1].strip() for s in read_then_close(proc, 2)] == ["one", "two"]
    (tmp_path / "go").touch()
    err = finish(proc)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    assert marker.read_text() == "done\n"


def test_exec_over_ssh_is_not_stopped_on_the_host_when_stdout_is_closed(
    through: str, lab: Any, tmp_path: Path
) -> None:
    # The sim's hosts share this machine's files: the go file and the marker are the host's.
    line, marker = exec_script(tmp_path)
    proc = start("-i", str(lab.inventory_path), "exec", "-l", "m5", "--", line)
    assert [s.split("│")[-1].strip() for s in read_then_close(proc, 2)] == ["one", "two"]
    (tmp_path / "go").touch()
    err = finish(proc)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    assert marker.read_text() == "done\n"  # the watchdog did not stop it: its channel stayed open


def test_a_json_answer_nobody_reads_keeps_the_command_s_exit_code(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path)
    proc = start("-i", str(inv), "--json", "exec", "--", "true")
    read_then_close(proc, 0)  # `| true`: nobody reads the document
    err = finish(proc)
    assert proc.returncode == 0, err  # exec's own code, not 1 for the broken pipe
    assert "Traceback" not in err, err


def test_status_watch_ends_when_its_reader_has_gone(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path)
    # `2>&1 | head`: the watch's table goes to stderr, here the same pipe as stdout.
    proc = start("-i", str(inv), "status", "--watch", "1", stderr=subprocess.STDOUT)
    assert read_then_close(proc, 1)[0].strip()
    finish(proc)
    assert proc.returncode == 0  # ended as Ctrl-C ends a watch, instead of refreshing for ever
