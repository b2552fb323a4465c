"""The `sandbox` resource writing this machine's real /etc/docker/daemon.json and restarting
its real dockerd, through `labctl provision` on a `connection: local` host.

The dockerd here is shared with other test sessions: the module saves daemon.json (and
labctl's backup of it) as it found them, puts them back byte for byte at the end and restarts
dockerd once more with the original file, so it is left running as it was. Remapping is never
turned on here: it would hide every other session's images.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.core import paths
from labctl.agent.sandbox import image_name
from labctl.agent.sandbox.daemon import DAEMON_JSON, dockerd_op, userns_support
from tests.conftest import ON_THIS_MACHINE
from tests.integration.test_sandbox_images import docker, provision, sandbox_result

pytestmark = [pytest.mark.integration, ON_THIS_MACHINE]
BACKUP = Path(paths.BACKUP_DIR) / "daemon.json"


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def _put_back(path: Path, data: bytes | None) -> None:
    if data is None:
        path.unlink(missing_ok=True)
    else:
        path.write_bytes(data)


@pytest.fixture(scope="module")
def daemon_json_restored(docker_images: dict[str, Any]) -> Iterator[Path]:
    """/etc/docker/daemon.json, given back at the end with dockerd running on it again."""
    path = Path(DAEMON_JSON)
    found, found_backup = _read(path), _read(BACKUP)
    try:
        yield path
    finally:
        changed = _read(path) != found
        _put_back(path, found)
        _put_back(BACKUP, found_backup)
        if changed:
            dockerd_op({"action": "restart", "systemd": Path("/run/systemd/system").is_dir(), "wait": 90})


def local_lab(tmp_path: Path, params: str) -> tuple[Path, Path]:
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        "lab: local\nhosts:\n"
        f"  here: {{address: 127.0.0.1, connection: local, python: {sys.executable},"
        " sandbox: {languages: [python]}}\n"
    )
    pb = tmp_path / "sandbox.yaml"
    pb.write_text(
        "name: sandbox here\nplays:\n  - name: docker\n    hosts: all\n    resources:\n"
        f"      - sandbox: {params}\n"
    )
    return inv, pb


def test_existing_daemon_json_converges_and_keeps_its_other_keys(
    daemon_json_restored: Path, tmp_path: Path
) -> None:
    # Keys that change nothing in how this shared daemon behaves (both are dockerd's defaults).
    daemon_json_restored.write_text(json.dumps({"log-level": "info", "max-concurrent-downloads": 3}))
    os.chmod(daemon_json_restored, 0o600)
    inv, pb = local_lab(tmp_path, "{userns_remap: 'off'}")

    rc, doc = provision(inv, pb)
    first = sandbox_result(doc)
    assert rc == 0 and first["status"] == "changed", first
    assert any(s.startswith("restart ") for s in first["summary"]), first
    written = json.loads(daemon_json_restored.read_text())
    assert written["log-level"] == "info" and written["max-concurrent-downloads"] == 3
    assert written["live-restore"] is True and "userns-remap" not in written
    assert daemon_json_restored.stat().st_mode & 0o777 == 0o644
    # The daemon runs with the file labctl wrote.
    assert docker("info", "--format", "{{.LiveRestoreEnabled}}").stdout.strip() == "true"

    rc, doc = provision(inv, pb)
    again = sandbox_result(doc)
    assert rc == 0 and again["status"] == "ok" and not again["changed"], again


def test_a_daemon_holding_foreign_things_keeps_remap_off_and_them_listed(
    daemon_json_restored: Path, tmp_path: Path
) -> None:
    why = userns_support()
    if not why["ok"]:
        pytest.skip(f"remapping is off here whatever Docker holds: {why['why']}")
    foreign_image = f"labctl-test-foreign/py{os.getpid()}:1"
    foreign_box = f"labctl-test-foreign-{os.getpid()}"
    docker("tag", image_name("python"), foreign_image)
    try:
        docker("create", "--name", foreign_box, foreign_image, "true")
        # Not what labctl writes: the plan changes the file, and applying restarts dockerd.
        daemon_json_restored.write_text(json.dumps({"max-concurrent-downloads": 3}))
        inv, pb = local_lab(tmp_path, "{}")

        rc, doc = provision(inv, pb, "--check")
        planned = sandbox_result(doc)
        assert rc == 0, planned
        said = " ".join(planned["summary"])
        assert "userns-remap left off" in said, said
        assert foreign_box in said and foreign_image in said
        assert "userns_remap: force" in said
        assert '"userns-remap"' not in planned["diff"]

        rc, doc = provision(inv, pb)
        applied = sandbox_result(doc)
        assert rc == 0 and applied["status"] == "changed", applied
        assert "userns-remap" not in json.loads(daemon_json_restored.read_text())
        listed = docker("ps", "-a", "--format", "{{.Names}}").stdout.split()
        assert foreign_box in listed
        assert foreign_image in docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
        # labctl's own image is still there too: nothing to rebuild.
        assert not any("build" in s for s in applied["summary"]), applied
    finally:
        docker("rm", "-f", foreign_box, check=False)
        docker("image", "rm", foreign_image, check=False)
