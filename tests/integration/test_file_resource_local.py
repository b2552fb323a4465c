"""`labctl provision` of `file` and `line` on this machine (`connection: local`), through the
real CLI and agent: a file over 1 MiB converges, and a line edit keeps every other byte. And the
agent's mount probe, on real mounts, reads each line of /proc/self/mounts whole."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ON_THIS_MACHINE, REPO, run_json

pytestmark = [pytest.mark.integration, ON_THIS_MACHINE]


def test_provision_a_large_file_and_a_line_then_nothing_to_do(tmp_path: Path) -> None:
    inv = tmp_path / "local.yaml"
    inv.write_text(
        f"lab: l\nhosts:\n  here: {{address: 127.0.0.1, connection: local, python: {sys.executable}}}\n"
    )
    big = "".join(f"row {i:07d} of a generated table\n" for i in range(40_000))
    assert len(big) > 1 << 20
    conf = tmp_path / "app.conf"
    before = b"# caf\xe9\r\n# pasted:\xe2\x80\xa8mode = slow\r\nmode = slow\r\nlast = 1"
    conf.write_bytes(before)
    book = tmp_path / "files.yaml"
    resources = [
        {"file": {"path": str(tmp_path / "table.txt"), "content": big}},
        {"line": {"path": str(conf), "line": "mode = fast", "regexp": "^mode ="}},
    ]
    # JSON is YAML: the 1.3 MB content goes in as one quoted scalar.
    book.write_text(json.dumps({"name": "files", "plays": [{"hosts": "all", "resources": resources}]}))

    rc, doc = run_json(inv, "provision", "-p", str(book), timeout=300)
    assert rc == 0, doc
    assert [r["status"] for r in doc["results"]] == ["changed", "changed"], doc["results"]
    assert (tmp_path / "table.txt").read_text() == big
    assert conf.read_bytes() == before.replace(b"\r\nmode = slow\r\n", b"\r\nmode = fast\r\n")

    rc, doc = run_json(inv, "provision", "-p", str(book), "--check", timeout=300)
    assert rc == 0 and [r["status"] for r in doc["results"]] == ["ok", "ok"], doc["results"]


def test_the_mount_probe_reads_past_a_mount_point_holding_cr_u2028_or_nbsp(tmp_path: Path) -> None:
    # Someone else's mount point may hold any byte but "/" and NUL; /proc/self/mounts escapes only
    # blanks, "\n" and "\\". A private mount namespace keeps these mounts off this machine.
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    odd = [tmp_path / "a\rb", tmp_path / "c\u2028d", tmp_path / "e\xa0f"]
    ours = tmp_path / "cache"
    for d in [*odd, ours]:
        d.mkdir()
    mounts = " && ".join(f"mount -t tmpfs -o size=1m tmpfs {shlex.quote(str(d))}" for d in [*odd, ours])
    probes = {str(d): {"kind": "mount", "path": str(d)} for d in [*odd, ours]}
    code = f"import json; from labctl.agent.provision.commands import probe_command as p; print(json.dumps(p({{'probes': {probes!r}}})))"
    proc = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f"{mounts} && {sys.executable} -c {shlex.quote(code)}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)["results"]
    for d in [*odd, ours]:
        assert found[str(d)].get("fstype") == "tmpfs" and found[str(d)]["size_bytes"] == 1 << 20, found
