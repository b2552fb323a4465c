"""The host-prefixed line printer that `exec` and an attached `train` share (output/lines.py)."""

from __future__ import annotations

import io
import os
import sys

import pytest
from rich.console import Console

from labctl.output.console import has_no_reader
from labctl.output.lines import HostLinePrinter


def test_host_lines_are_padded_barred_and_split_by_stream(capsys: pytest.CaptureFixture[str]) -> None:
    err = io.StringIO()
    printer = HostLinePrinter(Console(file=err, highlight=False, soft_wrap=True, color_system=None), 8)
    printer.print("m5/0", "loss [bold]1.0[/]", "stdout")
    printer.print("irina", "Traceback", "stderr", colour="magenta")
    assert capsys.readouterr().out == "m5/0     │ loss [bold]1.0[/]\n"
    assert err.getvalue() == "irina    │ Traceback\n"


def test_stdout_whose_reader_has_gone_falls_silent_and_stderr_lines_go_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head` has exited
    out = os.fdopen(write_end, "w")
    monkeypatch.setattr(sys, "stdout", out)
    err = io.StringIO()
    printer = HostLinePrinter(Console(file=err, highlight=False, soft_wrap=True, color_system=None), 8)
    printer.print("m5/0", "step 1", "stdout")  # rich's own answer was SystemExit(1), from a host's thread
    printer.print("m5/0", "step 2", "stdout")
    printer.print("irina", "warning", "stderr")
    assert has_no_reader(printer.out_console)
    assert err.getvalue() == "irina    │ warning\n"
    out.close()  # its descriptor now leads to /dev/null: the flush at exit cannot fail either
