"""`labctl ckpt` against the simulated lab: backup host to host into irina's library, verify,
retention over a faked calendar, a killed backup, restore and a real resume from it.

Runs are either real (a tiny CPU training run on m5) or records written beside the inventory
with checkpoints made by the trainer's own CheckpointDir on the host (through `labctl exec`).
The library is irina's default, /srv/checkpoints; the tests remove it afterwards.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, TRAIN_TINY, labctl, run_json, sh
from tests.hint_cmds import as_written

pytestmark = pytest.mark.integration
LIB = "/srv/checkpoints"
TRAIN = "/var/lib/labctl/train"
TINY = TRAIN_TINY


def runs_dir(inv: Path) -> Path:
    return Path(inv).parent / ".labctl" / "runs"


@pytest.fixture(scope="module")
def inv(lab: Any) -> Iterator[Path]:
    path = Path(lab.inventory_path)
    try:
        yield path
    finally:
        sh(path, "irina", f"rm -rf {LIB} {TRAIN}/ckpt-test-*")


def fake_run(inv: Path, hosts: list[str], mb: float, *steps: int) -> tuple[str, str]:
    """A run record (hosts, checkpoint folder) and real checkpoints of `mb` MiB for `steps`,
    written by the trainer's CheckpointDir on the first host."""
    run_id = f"ck-{uuid.uuid4().hex[:8]}"
    folder = f"{TRAIN}/ckpt-test-{run_id}"
    (runs_dir(inv) / run_id).mkdir(parents=True)
    record = {"run_id": run_id, "phase": 1, "hosts": hosts, "started": time.time(), "checkpoint_dir": folder}
    (runs_dir(inv) / run_id / "run.json").write_text(json.dumps(record))
    for step in steps:
        write_ckpt(inv, hosts[0], folder, step, mb)
    return run_id, folder


def write_ckpt(inv: Path, host: str, folder: str, step: int, mb: float) -> None:
    code = (
        "import os,sys; from labctl.agent.train.ckpt import CheckpointDir; "
        f"CheckpointDir(sys.argv[1]).save({step}, os.urandom(int({mb} * 2**20)), {{}}, "
        "save=lambda s, f: f.write(s))"
    )
    sh(inv, host, f"cd {REPO} && {sys.executable} -c '{code}' {folder}")


def ckpt(
    inv: Path, *args: str, now: str | None = None, stop_after: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`labctl ckpt ARGS` with the calendar set (LABCTL_NOW) or the pull told to kill itself
    after `stop_after` verified chunks (SIGKILL, as a crash would)."""
    env = dict(os.environ)
    if now:
        env["LABCTL_NOW"] = now
    if stop_after:
        env["LABCTL_CACHE_TEST_STOP_AFTER"] = stop_after
    return subprocess.run(
        [sys.executable, "-m", "labctl", "-i", str(inv), "ckpt", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )


def backup(inv: Path, *args: str, now: str | None = None, env_stop: str | None = None) -> tuple[int, Any]:
    proc = ckpt(inv, "backup", "--json", *args, now=now, stop_after=env_stop)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def library_steps(inv: Path, run_id: str) -> list[int]:
    rc, doc = run_json(inv, "ckpt", "list", "--run", run_id)
    assert rc == 0, doc
    return [c["step"] for c in doc["copies"]]


def sha(inv: Path, host: str, path: str) -> str:
    return sh(inv, host, f"sha256sum {path}").split()[0]


def test_backup_copies_host_to_host_once_and_verify_names_a_flipped_byte(inv: Path, lab: Any) -> None:
    run_id, folder = fake_run(inv, ["m5", "irina"], 3, 10, 20)
    rc, doc = backup(inv, "--run", run_id)
    assert rc == 0, doc
    [r] = doc["runs"]
    # Both hosts hold step 20: one copy, from the first host, served to irina's address only.
    assert (r["action"], r["step"], r["source_host"]) == ("copied", 20, "m5")
    assert r["fetched_bytes"] == 3 * 2**20 + len(sh(inv, "m5", f"cat {folder}/step-00000020.json"))
    assert r["served"]["peers"] == [lab.hosts["irina"]] and r["served"]["address"] == lab.hosts["m5"]
    copy = f"{LIB}/{run_id}/step-00000020"
    assert sha(inv, "irina", f"{copy}/step-00000020.pt") == sha(inv, "m5", f"{folder}/step-00000020.pt")
    record = json.loads(sh(inv, "irina", f"cat {copy}/backup.json"))
    assert record["origin"] == "backup" and record["source_host"] == "m5" and record["source_path"] == folder
    # The training folder is the trainer's: nothing of the transfer's was left there.
    assert sh(inv, "m5", f"ls -A {folder}").split() == [
        "step-00000010.json", "step-00000010.pt", "step-00000020.json", "step-00000020.pt",
    ]  # fmt: skip

    rc, again = backup(inv, "--run", run_id)
    assert rc == 0 and again["runs"][0]["action"] == "present" and "served" not in again["runs"][0]

    write_ckpt(inv, "m5", folder, 30, 0.1)
    rc, listed = run_json(inv, "ckpt", "list", "--run", run_id)
    assert rc == 0, listed
    assert [(c["step"], c["origin"], c["source_host"]) for c in listed["copies"]] == [(20, "backup", "m5")]
    assert [(o["step"], o["host"]) for o in listed["only_on_hosts"]] == [(30, "m5")]

    sh(inv, "irina", f"printf 'Z' | dd of={copy}/step-00000020.pt bs=1 seek=1000 conv=notrunc 2>/dev/null")
    proc = labctl("-i", str(inv), "ckpt", "verify", "--run", run_id)
    out = (proc.stdout + proc.stderr).replace("\n", "")
    assert proc.returncode == 1, out
    assert "damaged" in out and copy in out and "sha256 mismatch" in out
    rc, doc = run_json(inv, "ckpt", "verify", "--run", run_id)
    assert rc == 1 and [(d["step"], d["path"]) for d in doc["damaged"]] == [(20, copy)]


def test_retention_prunes_over_a_faked_calendar_only_after_the_new_copy(inv: Path) -> None:
    run_id, folder = fake_run(inv, ["m5"], 0.1, 1)
    assert backup(inv, "--run", run_id, now="2026-11-01T03:00:00Z")[0] == 0
    write_ckpt(inv, "m5", folder, 2, 0.1)
    rc, doc = backup(inv, "--run", run_id, now="2026-11-01T15:00:00Z")
    # Same day: the newer copy is that day's (and week's, and month's) one; the older goes.
    assert rc == 0 and doc["pruned"] == [{"run_id": run_id, "step": 1}], doc
    assert library_steps(inv, run_id) == [2]
    write_ckpt(inv, "m5", folder, 3, 0.1)
    rc, doc = backup(inv, "--run", run_id, now="2026-11-02T03:00:00Z")
    assert rc == 0 and doc["pruned"] == [] and library_steps(inv, run_id) == [2, 3]
    rc, listed = run_json(inv, "ckpt", "list", "--run", run_id)
    assert [c["backed_up_at"] for c in listed["copies"]] == ["2026-11-01T15:00:00Z", "2026-11-02T03:00:00Z"]


def test_a_killed_backup_leaves_nothing_visible_and_the_next_one_resumes(inv: Path) -> None:
    run_id, folder = fake_run(inv, ["m5"], 24, 5)
    # The pull on irina kills itself (SIGKILL, as a crash would) after 2 verified 4 MiB chunks.
    rc, doc = backup(inv, "--run", run_id, "--chunk-mb", "4", "--streams", "1", env_stop="2")
    assert rc == 1 and doc["runs"][0]["action"] == "failed" and "again" in doc["runs"][0]["hint"]
    assert library_steps(inv, run_id) == []
    rc, listed = run_json(inv, "ckpt", "list", "--run", run_id)
    assert [o["step"] for o in listed["only_on_hosts"]] == [5]
    assert sh(inv, "irina", f"ls -A {LIB}/{run_id}").split() == [".incoming-step-00000005"]

    rc, doc = backup(inv, "--run", run_id, "--chunk-mb", "4")
    assert rc == 0, doc
    r = doc["runs"][0]
    assert r["action"] == "copied" and r["resumed_bytes"] >= 8 * 2**20
    assert r["fetched_bytes"] + r["resumed_bytes"] > 24 * 2**20
    assert library_steps(inv, run_id) == [5]
    assert sh(inv, "irina", f"ls -A {LIB}/{run_id}").split() == ["step-00000005"]
    assert sorted(sh(inv, "irina", f"ls -A {LIB}/{run_id}/step-00000005").split()) == [
        "backup.json", "step-00000005.json", "step-00000005.pt",
    ]  # fmt: skip
    pt = "step-00000005.pt"
    assert sha(inv, "irina", f"{LIB}/{run_id}/step-00000005/{pt}") == sha(inv, "m5", f"{folder}/{pt}")

    # A restore killed mid-copy leaves the trainer nothing to see there; the next one resumes.
    there = f"{TRAIN}/ckpt-test-back-{uuid.uuid4().hex[:8]}"
    args = ["restore", run_id, "--to", "m5", "--dir", there, "--chunk-mb", "4", "--streams", "1"]
    proc = ckpt(inv, *args, stop_after="2")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "again" in proc.stderr
    assert sh(inv, "m5", f"ls -A {there}").split() == [".labctl-restore-step-00000005"]
    rc, got = run_json(inv, "ckpt", *args)
    assert rc == 0 and got["resumed_bytes"] >= 8 * 2**20, got
    assert sh(inv, "m5", f"ls -A {there}").split() == ["step-00000005.json", pt]
    assert sha(inv, "m5", f"{there}/{pt}") == sha(inv, "m5", f"{folder}/{pt}")


def test_restore_puts_a_checkpoint_back_and_a_real_run_resumes_from_it(inv: Path, lab: Any) -> None:
    first = f"{TRAIN}/ckpt-test-train-{uuid.uuid4().hex[:8]}"
    base = ["-i", str(inv), "--json", "train", "--phase", "1", "--limit", "m5", "--device", "cpu"]
    base += ["--python", sys.executable, *TINY, "--set", "checkpoint_every=10"]
    proc = labctl(*base, "--set", "steps=10", "--set", f"checkpoint_dir={first}", timeout=300)
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout)["run_id"]
    rc, doc = backup(inv, "--run", run_id)
    assert rc == 0 and doc["runs"][0]["step"] == 10, doc

    elsewhere = f"{TRAIN}/ckpt-test-restored-{uuid.uuid4().hex[:8]}"
    rc, got = run_json(inv, "ckpt", "restore", run_id, "--to", "m5", "--dir", elsewhere)
    assert rc == 0, got
    assert got["step"] == 10 and got["host"] == "m5"
    # Only the checkpoint: no partial copy or transfer state is left beside it.
    assert sh(inv, "m5", f"ls -A {elsewhere}").split() == ["step-00000010.json", "step-00000010.pt"]

    proc = labctl(*base, "--set", "steps=15", "--set", f"checkpoint_dir={elsewhere}", timeout=300)
    assert proc.returncode == 0, proc.stderr
    second = json.loads(proc.stdout)["run_id"]
    events = [json.loads(x) for x in (runs_dir(inv) / second / "metrics.jsonl").read_text().splitlines()]
    starts = [e for e in events if e["event"] == "start"]
    assert starts[0]["resumed_from"] == 10
    assert min(e["step"] for e in events if e["event"] == "step") > 10


def test_clear_errors_for_an_unknown_run_and_a_missing_copy(inv: Path) -> None:
    proc = labctl("-i", str(inv), "ckpt", "backup", "--run", "no-such-run")
    assert proc.returncode == 2 and "No run 'no-such-run'" in proc.stderr and "Traceback" not in proc.stderr
    run_id, _ = fake_run(inv, ["m5"], 0.1)
    proc = labctl("-i", str(inv), "ckpt", "restore", run_id, "--to", "m5")
    assert proc.returncode == 2 and "holds no copy" in proc.stderr, proc.stderr
    proc = labctl("-i", str(inv), "ckpt", "restore", run_id, "--to", "nowhere")
    assert proc.returncode == 2 and "No host 'nowhere'" in proc.stderr, proc.stderr


def flip_byte(inv: Path, path: str) -> None:
    sh(inv, "irina", f"printf 'Z' | dd of={path} bs=1 seek=100 conv=notrunc 2>/dev/null")


def hinted(out: str) -> list[str]:
    """The command a hint names (`labctl ...` in backticks), as argv."""
    found = re.findall(r"`(labctl [^`]+)`", " ".join(out.split()))
    assert len(found) == 1, out
    return shlex.split(found[0])


def test_a_damaged_copy_is_mended_by_the_command_verify_names_and_never_trusted(inv: Path) -> None:
    run_id, folder = fake_run(inv, ["m5"], 0.5, 10)
    assert backup(inv, "--run", run_id, now="2026-11-01T03:00:00Z")[0] == 0
    source = sha(inv, "m5", f"{folder}/step-00000010.pt")
    copy = f"{LIB}/{run_id}/step-00000010"
    pt = f"{copy}/step-00000010.pt"
    flip_byte(inv, pt)
    proc = labctl("-i", str(inv), "ckpt", "verify", "--run", run_id)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "damaged" in out and copy in out.replace("\n", ""), out
    fix = hinted(out)
    assert fix == ["labctl", "ckpt", "backup", "--run", run_id], fix
    done = as_written(inv, fix, REPO)
    assert done.returncode == 0 and "replaced" in done.stderr, done.stdout + done.stderr
    assert labctl("-i", str(inv), "ckpt", "verify", "--run", run_id).returncode == 0
    assert sha(inv, "irina", pt) == source
    record = json.loads(sh(inv, "irina", f"cat {copy}/backup.json"))
    # Retention still files it under the day it was first backed up.
    assert (
        record["backed_up_at"] == "2026-11-01T03:00:00Z" and "sha256 mismatch" in record["replaced"]["reason"]
    )

    # Damage no verify has seen yet: the backup re-hashes what it would call present.
    flip_byte(inv, pt)
    rc, doc = backup(inv, "--run", run_id)
    assert rc == 0 and doc["runs"][0]["action"] == "replaced", doc
    assert sha(inv, "irina", pt) == source

    # A restore never puts a damaged copy back; its hint mends the library, then it works.
    flip_byte(inv, pt)
    there = f"{TRAIN}/ckpt-test-back-{uuid.uuid4().hex[:8]}"
    proc = ckpt(inv, "restore", run_id, "--to", "m5", "--dir", there)
    assert proc.returncode == 1 and "damaged" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "restore again" in proc.stderr
    assert sh(inv, "m5", f"ls -A {there} 2>/dev/null || true").split() == []
    assert as_written(inv, hinted(proc.stderr), REPO).returncode == 0
    rc, _ = run_json(inv, "ckpt", "restore", run_id, "--to", "m5", "--dir", there)
    assert rc == 0 and sha(inv, "m5", f"{there}/step-00000010.pt") == sha(
        inv, "m5", f"{folder}/step-00000010.pt"
    )


def test_a_damaged_copy_no_host_holds_any_more_is_named_and_its_hint_drops_it(inv: Path) -> None:
    run_id, folder = fake_run(inv, ["m5"], 0.1, 10)
    assert backup(inv, "--run", run_id, now="2026-11-01T03:00:00Z")[0] == 0
    # The trainer moved on and pruned step 10; step 20 is backed up on the next day.
    sh(inv, "m5", f"rm {folder}/step-00000010.*")
    write_ckpt(inv, "m5", folder, 20, 0.1)
    assert backup(inv, "--run", run_id, now="2026-11-02T03:00:00Z")[0] == 0
    flip_byte(inv, f"{LIB}/{run_id}/step-00000010/step-00000010.pt")
    proc = labctl("-i", str(inv), "ckpt", "verify", "--run", run_id)
    assert proc.returncode == 1 and "No training host holds step 10" in proc.stderr, proc.stderr
    # The next backup says so too (and fails: the library is not whole), rather than "present".
    rc, doc = backup(inv, "--run", run_id, now="2026-11-03T03:00:00Z")
    assert rc == 1 and doc["damaged"] == [{"run_id": run_id, "step": 10}], doc
    fix = hinted(proc.stderr)
    assert fix == ["labctl", "ckpt", "verify", "--run", run_id, "--remove-damaged"], fix
    done = as_written(inv, fix, REPO)
    assert done.returncode == 0 and "removed" in done.stderr, done.stdout + done.stderr
    assert labctl("-i", str(inv), "ckpt", "verify", "--run", run_id).returncode == 0
    assert library_steps(inv, run_id) == [20]


def test_a_damaged_newest_checkpoint_on_the_host_is_named_and_never_costs_the_newer_copy(inv: Path) -> None:
    run_id, folder = fake_run(inv, ["m5"], 0.1, 600, 800)
    rc, doc = backup(inv, "--run", run_id, now="2026-11-01T03:00:00Z")
    assert rc == 0 and doc["runs"][0]["step"] == 800 and doc["warnings"] == [], doc
    sh(inv, "m5", f"printf 'Z' | dd of={folder}/step-00000800.pt bs=1 seek=100 conv=notrunc 2>/dev/null")
    # Later the same day the host's newest valid one is 600: named, backed up, and 800 stays.
    proc = ckpt(inv, "backup", "--run", run_id, now="2026-11-01T15:00:00Z")
    out = " ".join(proc.stderr.split())
    assert proc.returncode == 0 and "Traceback" not in out, out
    assert f"warning: skipped step 800 of {run_id} on m5 ({folder}/step-00000800.pt): sha256 mismatch" in out
    assert "backed up step 600 instead" in out
    assert library_steps(inv, run_id) == [600, 800]
    rc, doc = backup(inv, "--run", run_id, now="2026-11-01T16:00:00Z")
    assert rc == 0 and doc["pruned"] == [] and doc["runs"][0]["action"] == "present", doc
    [w] = doc["warnings"]
    assert (w["host"], w["step"], w["instead"]) == ("m5", 800, 600) and "sha256 mismatch" in w["reason"]
    assert doc["runs"][0]["skipped"] == [w]
    assert "newest copy" in doc["kept"][f"{run_id}/step-00000800"]
    rc, listed = run_json(inv, "ckpt", "list", "--run", run_id)
    assert rc == 0 and [(d["host"], d["step"]) for d in listed["damaged_on_hosts"]] == [("m5", 800)]

    # Nothing valid left on the host: nothing good was backed up, so it fails, naming both.
    sh(inv, "m5", f"printf 'Z' | dd of={folder}/step-00000600.pt bs=1 seek=100 conv=notrunc 2>/dev/null")
    rc, doc = backup(inv, "--run", run_id, now="2026-11-02T03:00:00Z")
    [r] = doc["runs"]
    assert rc == 1 and r["action"] == "failed" and "skipped step 800" in r["error"], doc
    assert "skipped step 600" in r["error"] and "no valid checkpoint is left on m5" in r["error"]
    assert library_steps(inv, run_id) == [600, 800]


def restore_hints(out: str) -> list[list[str]]:
    """Each `labctl ckpt restore ...` command an error names, as argv."""
    return [shlex.split(c) for c in re.findall(r"`(labctl ckpt restore [^`]+)`", " ".join(out.split()))]


def test_restore_refuses_a_damaged_copy_and_names_the_newest_copy_that_verifies(inv: Path) -> None:
    run_id, folder = fake_run(inv, ["m5"], 0.1, 10)
    assert backup(inv, "--run", run_id, now="2026-11-01T03:00:00Z")[0] == 0
    for step, day in ((20, "02"), (30, "03")):
        write_ckpt(inv, "m5", folder, step, 0.1)
        assert backup(inv, "--run", run_id, now=f"2026-11-{day}T03:00:00Z")[0] == 0
    assert library_steps(inv, run_id) == [10, 20, 30]
    flip_byte(inv, f"{LIB}/{run_id}/step-00000030/step-00000030.pt")
    assert labctl("-i", str(inv), "ckpt", "verify", "--run", run_id).returncode == 1
    # Damage after the verify, so no mark says so: step 20 is not the good one to name.
    flip_byte(inv, f"{LIB}/{run_id}/step-00000020/step-00000020.pt")
    there = f"{TRAIN}/ckpt-test-back-{uuid.uuid4().hex[:8]}"
    good = ["labctl", "ckpt", "restore", run_id, "--to", "m5", "--step", "10", "--dir", there]
    for step in ([], ["--step", "20"]):
        proc = ckpt(inv, "restore", run_id, "--to", "m5", "--dir", there, *step)
        assert proc.returncode == 1 and "damaged" in proc.stderr and "Traceback" not in proc.stderr, (
            proc.stderr
        )
        assert restore_hints(proc.stderr) == [good], proc.stderr
        assert sh(inv, "m5", f"ls -A {there} 2>/dev/null || true").split() == []
    done = as_written(inv, good, REPO)
    assert done.returncode == 0, done.stderr
    assert sh(inv, "m5", f"ls -A {there}").split() == ["step-00000010.json", "step-00000010.pt"]
    assert sha(inv, "m5", f"{there}/step-00000010.pt") == sha(inv, "m5", f"{folder}/step-00000010.pt")


def test_a_copy_damaged_after_its_rehash_is_caught_on_arrival_rehash_patched_to_damage_it(inv: Path) -> None:
    """The library's copy goes bad between its re-hash and the transfer (rehash is wrapped to
    flip a byte on irina right after it passed): the restored files are checked on m5 before
    they are renamed in, so nothing reaches the trainer's folder."""
    run_id, _folder = fake_run(inv, ["m5"], 0.5, 10)
    assert backup(inv, "--run", run_id)[0] == 0
    pt = f"{LIB}/{run_id}/step-00000010/step-00000010.pt"
    there = f"{TRAIN}/ckpt-test-back-{uuid.uuid4().hex[:8]}"
    damage = [sys.executable, "-m", "labctl", "-i", str(inv), "exec", "-l", "irina", "--"]
    damage += [f"printf Z | dd of={pt} bs=1 seek=100 conv=notrunc 2>/dev/null"]
    code = (
        "import subprocess, sys\n"
        "import labctl.ckpt.restore as r\n"
        "real, done = r.rehash, []\n"
        "def rehash(*a, **k):\n"
        "    out = real(*a, **k)\n"
        "    if not done:\n"
        f"        done.append(subprocess.run({damage!r}, capture_output=True).returncode)\n"
        "    return out\n"
        "r.rehash = rehash\n"
        f"sys.argv = ['labctl', '-i', {str(inv)!r}, 'ckpt', 'restore', {run_id!r}, '--to', 'm5', '--dir', {there!r}]\n"
        "from labctl.cli.app import main\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    out = " ".join(proc.stderr.split())
    assert proc.returncode == 1 and "Traceback" not in out, out
    assert "did not verify there" in out and "sha256 mismatch" in out and "nothing was restored" in out
    assert sh(inv, "m5", f"ls -A {there} 2>/dev/null || true").split() == []
