"""`labctl metrics` input errors: exit 2 with a paragraph naming what to fix, before any host is asked
(the inventory named here does not exist, so reaching it would be a different error)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, labctl


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "exactly one of --textfile DIR or --serve ADDR:PORT"),
        (["--textfile", "/tmp", "--serve", "9835"], "exactly one of --textfile DIR or --serve ADDR:PORT"),
        (["--textfile", "/no/such/textfile-dir"], "--textfile /no/such/textfile-dir does not exist"),
        (["--serve", "1.2.3.4:99999"], "port 99999 is outside 1-65535"),
        (["--serve", "::1:9100"], "an IPv6 address goes in brackets"),
        (["--serve", "9835", "--cache-seconds", "0"], "0.0 is not a number above 0"),
    ],
)
def test_bad_input_is_exit_2_before_any_host(tmp_path: Path, args: list[str], says: str) -> None:
    proc = labctl("-i", str(tmp_path / "no-inventory.yaml"), "metrics", *args)
    assert proc.returncode == 2, proc.stderr
    assert says in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr and "no-inventory" not in proc.stderr


def test_help_does_not_import_prometheus_client() -> None:
    code = (
        "import sys\n"
        "from labctl.cli.app import app\n"
        "from typer.testing import CliRunner\n"
        "r = CliRunner().invoke(app, ['metrics', '--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "assert 'prometheus_client' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
