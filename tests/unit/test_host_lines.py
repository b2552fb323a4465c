"""The host-prefixed line printer that `exec` and an attached `train` share (cli/lines.py)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from labctl.cli.lines import HostLinePrinter


def test_host_lines_are_padded_barred_and_split_by_stream(capsys: pytest.CaptureFixture[str]) -> None:
    err = io.StringIO()
    printer = HostLinePrinter(Console(file=err, highlight=False, soft_wrap=True, color_system=None), 8)
    printer.print("m5/0", "loss [bold]1.0[/]", "stdout")
    printer.print("irina", "Traceback", "stderr", colour="magenta")
    assert capsys.readouterr().out == "m5/0     │ loss [bold]1.0[/]\n"
    assert err.getvalue() == "irina    │ Traceback\n"
