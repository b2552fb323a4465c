"""`labctl ckpt pull` against the simulated lab: a cloud session's output (made here by the real
reference trainer on the CPU) brought into irina's checkpoint library, as a folder while irina's
sshd has no SFTP, and as a tarball; a damaged one refused with the file named; a re-pull changes
nothing; `--model` puts the weights into irina's model library, where `cache sync` and
`cache verify` on m5 take them like any other model."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.ckpt_session import session
from tests.conftest import REPO, labctl, m5_cache, run_json, sh
from tests.hint_cmds import as_written

pytestmark = pytest.mark.integration
LIB = "/srv/checkpoints"
MODELS = "/srv/models"


@pytest.fixture(scope="module")
def working(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return session(tmp_path_factory.mktemp("kaggle"), run_id="kaggle-week1")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_folder_without_sftp_then_a_tarball_then_a_no_op_re_pull(
    lab: Any, working: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = lab.inventory_path
    assert lab.set_sftp("irina", False)
    try:
        rc, plan = run_json(inv, "ckpt", "pull", str(working), "--check", timeout=300)
        assert rc == 0, plan
        assert [c["action"] for c in plan["checkpoints"]] == ["would commit"] * 2
        assert sh(inv, "irina", f"test -e {LIB} && echo yes || echo no").strip() == "no"
        rc, doc = run_json(inv, "ckpt", "pull", str(working), timeout=300)
        assert rc == 0, doc
        assert doc["run_id"] == "kaggle-week1" and doc["storage"] == "irina" and doc["library"] == LIB
        assert [(c["step"], c["action"]) for c in doc["checkpoints"]] == [(2, "committed"), (4, "committed")]
        for step in (2, 4):
            folder = f"{LIB}/kaggle-week1/step-{step:08d}"
            listed = sh(inv, "irina", f"ls -A {folder}").split()
            assert listed == ["backup.json", f"step-{step:08d}.json", f"step-{step:08d}.pt"], listed
            there = sh(inv, "irina", f"sha256sum {folder}/step-{step:08d}.pt").split()[0]
            assert there == sha(working / "checkpoints" / f"step-{step:08d}.pt")
            record = json.loads(sh(inv, "irina", f"cat {folder}/backup.json"))
            assert record["origin"] == "pull" and record["source_path"].endswith(f"step-{step:08d}.pt")
        assert sh(inv, "irina", f"ls -A {LIB}/kaggle-week1").split() == ["step-00000002", "step-00000004"]

        # Again: nothing sent, nothing changed.
        rc, again = run_json(inv, "ckpt", "pull", str(working), timeout=300)
        assert rc == 0, again
        assert [c["action"] for c in again["checkpoints"]] == ["present", "present"]
    finally:
        lab.set_sftp("irina", True)
    try:
        tgz = tmp_path / "output.tar.gz"
        with tarfile.open(tgz, "w:gz") as tar:
            tar.add(working / "checkpoints", arcname="checkpoints")  # no settings file: the .pt names the run
        # An earlier pull that stopped after sending step 4's part: that part is not sent again.
        parts = f"{LIB}/sagemaker-1/.incoming-step-00000004/.parts"
        first = f"{LIB}/kaggle-week1/step-00000004/step-00000004.pt"
        sh(inv, "irina", f"mkdir -p {parts} && cp {first} {parts}/step-00000004.pt.00000")
        monkeypatch.setenv("LABCTL_NOW", "2027-01-02T03:04:05Z")  # the copy's date, as retention reads it
        rc, doc = run_json(inv, "ckpt", "pull", str(tgz), "--run", "sagemaker-1", timeout=300)
        assert rc == 0, doc
        assert (
            doc["run_id"] == "sagemaker-1" and [c["action"] for c in doc["checkpoints"]] == ["committed"] * 2
        )
        sent = {c["step"]: c["sent_bytes"] for c in doc["checkpoints"]}
        assert sent == {2: (working / "checkpoints" / "step-00000002.pt").stat().st_size, 4: 0}
        assert sh(inv, "irina", f"ls -A {LIB}/sagemaker-1").split() == ["step-00000002", "step-00000004"]
        assert sh(inv, "irina", f"ls -A {LIB}/sagemaker-1/step-00000004").split() == [
            "backup.json",
            "step-00000004.json",
            "step-00000004.pt",
        ]
        record = json.loads(sh(inv, "irina", f"cat {LIB}/sagemaker-1/step-00000004/backup.json"))
        assert record["source_path"] == f"{tgz}::checkpoints/step-00000004.pt"
        assert record["backed_up_at"] == "2027-01-02T03:04:05Z"
    finally:
        sh(inv, "irina", f"rm -rf {LIB}")


def test_a_damaged_checkpoint_is_named_and_nothing_is_pulled(lab: Any, working: Path, tmp_path: Path) -> None:
    inv = lab.inventory_path
    copy = tmp_path / "w"
    shutil.copytree(working, copy)
    pt = copy / "checkpoints" / "step-00000002.pt"
    data = bytearray(pt.read_bytes())
    data[100] ^= 0x01
    pt.write_bytes(bytes(data))
    rc, doc = run_json(inv, "ckpt", "pull", str(copy), timeout=300)
    assert rc == 2, doc
    assert (
        "checkpoints/step-00000002.pt: sha256 mismatch" in doc["error"]
        and "nothing was pulled" in doc["error"]
    )
    assert sh(inv, "irina", f"test -e {LIB} && echo yes || echo no").strip() == "no"


def test_model_export_reaches_the_ram_cache_through_cache_sync(lab: Any, working: Path) -> None:
    inv = lab.inventory_path
    name = "kaggle-week1-tinylm"
    try:
        with m5_cache(lab):
            rc, doc = run_json(inv, "ckpt", "pull", str(working), "--model", name, timeout=300)
            assert rc == 0, doc
            assert doc["model"]["action"] == "published" and doc["model"]["step"] == 4
            assert sh(inv, "irina", f"ls -A {MODELS}/{name}").split() == ["config.json", "model.safetensors"]
            rc, again = run_json(inv, "ckpt", "pull", str(working), "--model", name, timeout=300)
            assert rc == 0 and again["model"]["action"] == "present", again

            rc, synced = run_json(inv, "cache", "sync", name, "--host", "m5", timeout=300)
            assert rc == 0, synced
            rc, verified = run_json(inv, "cache", "verify", "--host", "m5", timeout=300)
            assert rc == 0, verified
            assert name in json.dumps(verified["results"][0])
            rc, status = run_json(inv, "cache", "status", "--host", "m5")
            assert rc == 0 and [m["name"] for m in status["results"][0]["models"]] == [name], status
            config = json.loads(sh(inv, "m5", f"cat /mnt/model-cache/{name}/config.json"))
            assert config["model_type"] == "tinylm" and config["d_model"] == 32
    finally:
        sh(inv, "irina", f"rm -rf {LIB} {MODELS}/{name} {MODELS}/.incoming-{name}")


def test_a_damaged_pulled_copy_is_replaced_by_the_pull_verify_names(lab: Any, working: Path) -> None:
    inv = lab.inventory_path
    copy = f"{LIB}/kaggle-mend/step-00000004"
    try:
        rc, doc = run_json(inv, "ckpt", "pull", str(working), "--run", "kaggle-mend", timeout=300)
        assert rc == 0, doc
        sh(inv, "irina", f"printf 'Z' | dd of={copy}/step-00000004.pt bs=1 seek=100 conv=notrunc 2>/dev/null")
        proc = labctl("-i", str(inv), "ckpt", "verify", "--run", "kaggle-mend")
        assert proc.returncode == 1 and "damaged" in proc.stderr, proc.stderr
        [hint] = re.findall(r"`(labctl [^`]+)`", " ".join(proc.stderr.split()))
        argv = shlex.split(hint)
        assert argv == ["labctl", "ckpt", "pull", str(working / "checkpoints"), "--run", "kaggle-mend"], argv
        # Run as written, the inventory from $LABCTL_INVENTORY (hints name no -i).
        done = as_written(inv, argv, REPO)
        assert done.returncode == 0 and "replaced" in done.stderr, done.stdout + done.stderr
        assert labctl("-i", str(inv), "ckpt", "verify", "--run", "kaggle-mend").returncode == 0
        there = sh(inv, "irina", f"sha256sum {copy}/step-00000004.pt").split()[0]
        assert there == sha(working / "checkpoints" / "step-00000004.pt")
    finally:
        sh(inv, "irina", f"rm -rf {LIB}")
