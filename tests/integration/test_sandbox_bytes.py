"""Sandbox programs are bytes from end to end, against the real dockerd on this machine: a
source in Latin-1, a C string literal holding a byte that is not UTF-8, binary stdin, and output
that is not UTF-8 come through unchanged (`--json` carries the exact bytes as base64 beside the
text), through a `connection: local` host and a simulated host over SSH."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.sandbox import run_many
from tests.conftest import ON_THIS_MACHINE, REPO

pytestmark = [pytest.mark.integration, ON_THIS_MACHINE]

LATIN1_PY = b'# -*- coding: latin-1 -*-\nprint("caf\xe9 cr\xe8me")\n'
LATIN1_C = b'#include <stdio.h>\nint main(void) { fputs("caf\xe9\\n", stdout); return 0; }\n'


@pytest.fixture(scope="module")
def local_inv(docker_images: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    inv = tmp_path_factory.mktemp("sbx-bytes") / "local.yaml"
    host = {
        "address": "127.0.0.1",
        "connection": "local",
        "python": "/usr/bin/python3",
        "roles": ["sandbox"],
        "sandbox": {"languages": ["python", "c"], "pool": 2},
    }
    inv.write_text(yaml.safe_dump({"lab": "l", "hosts": {"here": host}}))
    return inv


@pytest.fixture(scope="module")
def sim_inv(docker_images: dict[str, Any], lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sim's inventory with irina as the sandbox host, reached over SSH."""
    doc = yaml.safe_load(lab.inventory_path.read_text())
    doc["defaults"]["ssh_key"] = str(lab.key_path)
    doc["defaults"]["known_hosts"] = str(lab.known_hosts_path)
    doc["hosts"]["irina"]["roles"] = ["storage", "sandbox"]
    doc["hosts"]["irina"]["sandbox"] = {"languages": ["python", "c"], "pool": 2}
    out = tmp_path_factory.mktemp("sbx-bytes-sim") / "inventory.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


@pytest.fixture(params=["local", "sim"])
def inv(request: pytest.FixtureRequest) -> Path:
    return Path(request.getfixturevalue("local_inv" if request.param == "local" else "sim_inv"))


def cli(
    inv: Path, source: bytes, *args: str, as_json: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    path = inv.parent / f"prog-{uuid.uuid4().hex[:8]}"
    path.write_bytes(source)
    first = ["--json"] if as_json else []
    return subprocess.run(
        [sys.executable, "-m", "labctl", *first, "-i", str(inv), "sandbox", "run", str(path), *args],
        capture_output=True,
        timeout=180,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def json_run(inv: Path, source: bytes, *args: str) -> tuple[int, dict[str, Any]]:
    proc = cli(inv, source, *args, as_json=True)
    assert b"Traceback" not in proc.stderr, proc.stderr.decode(errors="replace")
    return proc.returncode, json.loads(proc.stdout)


def test_a_latin1_python_source_runs_as_written(inv: Path) -> None:
    rc, doc = json_run(inv, LATIN1_PY, "--lang", "python")
    assert (rc, doc["exit_code"], doc["stdout"], doc["stderr"]) == (0, 0, "café crème\n", ""), doc
    assert "stdout_b64" not in doc  # UTF-8 output: the text is exact, the shape unchanged


def test_a_c_string_literal_with_a_latin1_byte_compiles_runs_and_comes_back_exactly(inv: Path) -> None:
    rc, doc = json_run(inv, LATIN1_C, "--lang", "c")
    assert (rc, doc["exit_code"]) == (0, 0), doc
    assert doc["stdout"] == "caf\ufffd\n"
    assert base64.b64decode(doc["stdout_b64"]) == b"caf\xe9\n"


def test_binary_stdin_reaches_the_program_and_invalid_utf8_output_comes_back(local_inv: Path) -> None:
    stdin = local_inv.parent / "in.bin"
    stdin.write_bytes(b"\xff\xfe\x00A\xe9")
    src = b"import sys\nd = sys.stdin.buffer.read()\nsys.stdout.buffer.write(d[::-1])\nsys.stderr.buffer.write(b'\\x80')\n"
    rc, doc = json_run(local_inv, src, "--lang", "python", "--stdin", str(stdin))
    assert rc == 0, doc
    assert base64.b64decode(doc["stdout_b64"]) == b"\xe9A\x00\xfe\xff"
    assert base64.b64decode(doc["stderr_b64"]) == b"\x80" and doc["stderr"] == "\ufffd"


def test_output_shows_on_a_terminal_that_cannot_encode_it(local_inv: Path) -> None:
    """Without --json, on an ASCII stdout (PYTHONIOENCODING=ascii): '?' where it cannot show."""
    proc = cli(local_inv, LATIN1_PY, "--lang", "python", env={"PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr.decode(errors="replace")
    assert proc.stdout == b"caf? cr?me\n"
    proc = cli(local_inv, LATIN1_PY, "--lang", "python")
    assert proc.returncode == 0 and proc.stdout.decode() == "café crème\n"


def test_the_python_api_takes_bytes(local_inv: Path) -> None:
    (res,) = run_many([{"lang": "python", "source": LATIN1_PY, "stdin": b"\xe9"}], inventory=local_inv)
    assert res["exit_code"] == 0 and res["stdout"] == "café crème\n"
