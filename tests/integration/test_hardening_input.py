"""Input that reaches system files, checked on real hosts of the simulated lab: a cron entry
with `%` run by Debian's own cron, and a RAM cache at a path with a space and a fractional
size, mounted from fstab as written and unchanged on the second run."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import labctl

pytestmark = pytest.mark.integration


def on_host(lab: Any, host: str, cmd: str, timeout: float = 120) -> str:
    proc = labctl("-i", str(lab.inventory_path), "--json", "exec", "-l", host, "--", cmd, timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    return str(json.loads(proc.stdout)["results"][0]["stdout"])


def provision(lab: Any, book: Path, *args: str) -> dict[str, Any]:
    proc = labctl("-i", str(lab.inventory_path), "--json", "provision", "-p", str(book), *args, timeout=300)
    assert "Traceback" not in proc.stderr and proc.returncode == 0, proc.stdout + proc.stderr
    return dict(json.loads(proc.stdout))


@pytest.mark.skipif(shutil.which("cron") is None, reason="needs Debian's cron (apt-get install cron)")
def test_a_cron_job_with_a_percent_sign_really_runs(lab: Any, tmp_path: Path) -> None:
    out = "/var/lib/labctl/stamp.out"
    job = f"{{name: stamp, schedule: '* * * * *', command: 'date +%F > {out}', backend: cron}}"
    book = tmp_path / "cron.yaml"
    book.write_text(f"plays:\n  - hosts: pharaoh\n    resources:\n      - cron: {job}\n")
    try:
        provision(lab, book)
        # cron reads the sim host's private /etc/cron.d; it starts jobs on the minute, so wait
        # for the file (at most two minutes), then stop this cron with the command.
        stamp = on_host(
            lab,
            "pharaoh",
            f"rm -f {out}; cron -f >/dev/null 2>&1 & pid=$!; "
            f"for i in $(seq 120); do test -s {out} && break; sleep 1; done; kill $pid; cat {out}",
            timeout=180,
        )
        assert re.fullmatch(r"\d{4}-\d\d-\d\d\n", stamp), stamp  # `date +%F`, not a job cut at the %
    finally:
        book.write_text(
            "plays:\n  - hosts: pharaoh\n    resources:\n      - cron: {name: stamp, state: absent}\n"
        )
        provision(lab, book)
        on_host(lab, "pharaoh", f"rm -f {out} /var/log/labctl/stamp.log; true")


def test_a_cache_path_with_a_space_and_a_fractional_size_mounts_and_converges(
    lab: Any, tmp_path: Path
) -> None:
    book = tmp_path / "cache.yaml"
    book.write_text(
        "plays:\n  - hosts: pharaoh\n    resources:\n"
        "      - model_cache: {path: /mnt/model cache, size_gb: 0.3, reserve_gb: 0}\n"
    )
    fstab = on_host(lab, "pharaoh", "cat /etc/fstab")
    try:
        first = provision(lab, book)
        assert first["results"][0]["status"] == "changed", first
        # fstab as the host's own tools read it: one field with the space, 307 MiB (0.3 GiB rounded once).
        # (Only this cache's line: another test may have left pharaoh's /mnt/model-cache in fstab.)
        seen = on_host(
            lab,
            "pharaoh",
            "findmnt --fstab -n -o TARGET,OPTIONS | grep '^/mnt/model cache '; "
            "df -B1M --output=size '/mnt/model cache' | tail -1",
        )
        assert len(seen.splitlines()) == 2 and "size=307M" in seen.splitlines()[0], seen
        assert seen.splitlines()[1].strip() == "307", seen
        again = provision(lab, book)
        assert [r["status"] for r in again["results"]] == ["ok"], again
    finally:
        on_host(lab, "pharaoh", "umount '/mnt/model cache'; rmdir '/mnt/model cache'; true")
        on_host(
            lab,
            "pharaoh",
            f"cat > /etc/fstab <<'EOF'\n{fstab.rstrip(chr(10))}\nEOF" if fstab else ": > /etc/fstab",
        )
        assert on_host(lab, "pharaoh", "cat /etc/fstab") == fstab
