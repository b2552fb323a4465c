"""The remote watchdog (transport/wrap.py), run here with /bin/sh exactly as sshd would run it."""

from __future__ import annotations

import subprocess
import time

from labctl.transport.wrap import wrap_with_watchdog


def left(tag: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", tag], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if ln.split()[1:2] == ["sleep"]]


def start(command: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["/bin/sh", "-c", wrap_with_watchdog(command)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_output_and_exit_code_pass_through_while_the_channel_is_open() -> None:
    p = start("echo out; echo err >&2; exit 7")
    out, err = p.stdout.read(), p.stderr.read()  # type: ignore[union-attr]
    assert p.wait(timeout=10) == 7
    assert (out, err) == (b"out\n", b"err\n")
    p.stdin.close()  # type: ignore[union-attr]


def test_closing_the_channel_kills_the_command_and_its_children() -> None:
    p = start("sleep 7771 & sleep 7772")
    deadline = time.monotonic() + 5
    while len(left("sleep 777[12]")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(left("sleep 777[12]")) == 2
    p.stdin.close()  # type: ignore[union-attr]
    p.wait(timeout=10)
    deadline = time.monotonic() + 5
    while left("sleep 777[12]") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left("sleep 777[12]") == []


def test_channel_closed_before_the_command_is_set_up_still_kills_it() -> None:
    # The channel can go (Ctrl-C) before the child has called setsid(); its group does
    # not exist yet then, and an early version of the watcher gave up and leaked it.
    for _ in range(30):
        p = start("sleep 7773")
        p.stdin.close()  # type: ignore[union-attr]
        p.wait(timeout=10)
    deadline = time.monotonic() + 5
    while left("sleep 7773") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left("sleep 7773") == []
