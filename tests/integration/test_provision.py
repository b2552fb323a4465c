"""labctl provision against the simulated lab, over real SSH: check, apply, re-run, failures."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, labctl

pytestmark = pytest.mark.integration
SEED = str(REPO / "playbooks" / "provision.yaml")


def run_json(*args: str, timeout: float = 300) -> tuple[int, dict[str, Any]]:
    proc = labctl("--json", *args, timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def results(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["host"], r["type"]): r for r in doc["results"]}


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under a sim host's private root: content hash, mode and owner."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            p = Path(dirpath) / name
            st = p.lstat()
            body = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else ""
            out[str(p.relative_to(root))] = f"{st.st_mode:o} {st.st_uid} {st.st_gid} {body}"
    return out


def mount_tables(lab: Any) -> dict[str, str]:
    _, doc = run_json(
        "-i", str(lab.inventory_path), "exec", "--", "grep -v ' /proc' /proc/self/mounts | sort"
    )
    return {r["host"]: r["stdout"] for r in doc["results"]}


def inv_with(lab: Any, tmp_path: Path, edit: Any) -> Path:
    doc = yaml.safe_load(lab.inventory_path.read_text())
    doc["defaults"]["ssh_key"] = str(lab.key_path)
    doc["defaults"]["known_hosts"] = str(lab.known_hosts_path)
    edit(doc)
    out = tmp_path / "inventory.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


def test_check_changes_nothing_on_any_host(lab: Any) -> None:
    before = {h: tree_digest(lab.dir / "hosts" / h / "root") for h in lab.hosts}
    mounts = mount_tables(lab)
    rc, doc = run_json("-i", str(lab.inventory_path), "provision", "-p", SEED, "--check", "--diff")
    assert rc == 0, doc
    by = results(doc)
    assert doc["check"] is True
    assert by[("m5", "model_cache")]["status"] == "changed"  # it would change ...
    assert "+tmpfs /mnt/model-cache tmpfs size=2G" in by[("m5", "model_cache")]["diff"]
    assert "torch 2.13.0+cu126" in by[("m5", "torch_env")]["summary"][0]  # V100 + P40s: the 12.6 build
    assert (
        by[("workstation", "file")]["status"] == "skipped"
        and "windows" in by[("workstation", "file")]["error"]
    )
    # ... and nothing did.
    assert {h: tree_digest(lab.dir / "hosts" / h / "root") for h in lab.hosts} == before
    assert mount_tables(lab) == mounts


def test_seed_playbook_applies_then_changes_nothing(lab: Any) -> None:
    inv = str(lab.inventory_path)
    _, before = run_json("-i", inv, "exec", "-l", "m5", "--", "cat /etc/fstab")
    old_fstab = before["results"][0]["stdout"]
    rc, doc = run_json("-i", inv, "provision", "-p", SEED, "--skip-tags", "torch")
    assert rc == 0, doc
    by = results(doc)
    assert by[("m5", "model_cache")]["status"] == "changed"
    assert ("m5", "torch_env") not in by  # --skip-tags torch
    assert {by[(h, "file")]["status"] for h in ("m5", "irina", "pharaoh")} == {"changed"}

    rc, again = run_json("-i", inv, "provision", "-p", SEED, "--skip-tags", "torch")
    assert rc == 0
    assert {r["status"] for r in again["results"]} <= {"ok", "skipped"}
    assert not any(r["changed"] for r in again["results"])

    _, doc = run_json(
        "-i",
        inv,
        "exec",
        "--",
        "stat -f -c %T /mnt/model-cache 2>/dev/null; df -B1 --output=size /mnt/model-cache 2>/dev/null | tail -1; grep -c 'tmpfs /mnt/model-cache' /etc/fstab; ls /etc/cron.d; cat /var/lib/labctl/backup/fstab 2>/dev/null",
    )
    out = {r["host"]: r["stdout"].split("\n") for r in doc["results"]}
    assert out["m5"][0] == "tmpfs" and int(out["m5"][1]) == 2 * 2**30  # the sim's 2 GiB cache, on m5 only
    assert out["m5"][2] == "1"  # one fstab line after two runs
    assert "labctl-facts-snapshot" in out["m5"]
    assert "\n".join(out["m5"][4:]).strip() == old_fstab.strip()  # the backup is the fstab before the change
    for h in ("irina", "pharaoh"):
        assert out[h][0] == "0" and "labctl-facts-snapshot" in out[h]  # no cache there, the cron job is
    _, env = run_json("-i", inv, "exec", "-l", "irina", "--", "cat /var/lib/labctl/host.env")
    assert (
        "LABCTL_HOST=irina" in env["results"][0]["stdout"]
        and "LABCTL_ROLES=storage,sandbox" in env["results"][0]["stdout"]
    )


def test_cron_job_runs_and_never_overlaps(lab: Any) -> None:
    inv = str(lab.inventory_path)
    run_json("-i", inv, "provision", "-p", SEED, "--tags", "cron", "-l", "pharaoh")
    line = (
        "cmd=$(grep -v '^#' /etc/cron.d/labctl-facts-snapshot | grep flock | sed -E 's/^([^ ]+ ){6}//'); "
        "rm -f /var/lib/labctl/facts.json; "
        "flock /var/lib/labctl/locks/facts-snapshot.lock sleep 3 & sleep 0.5; "
        'sh -c "$cmd"; echo "held:$? $(test -e /var/lib/labctl/facts.json && echo ran || echo skipped)"; wait; '
        'sh -c "$cmd"; echo "free:$? $(test -e /var/lib/labctl/facts.json && echo ran || echo skipped)"'
    )
    _, doc = run_json("-i", inv, "exec", "-l", "pharaoh", "--", line)
    out = doc["results"][0]["stdout"]
    assert "held:1 skipped" in out  # flock -n: a run while the last one holds the lock gives way
    assert "free:0 ran" in out
    _, facts = run_json("-i", inv, "exec", "-l", "pharaoh", "--", "cat /var/lib/labctl/facts.json")
    assert json.loads(facts["results"][0]["stdout"])["memory"]["total_bytes"] > 0


def test_torch_build_lacking_a_gpu_arch_is_refused_and_others_finish(lab: Any, tmp_path: Path) -> None:
    book = tmp_path / "torch.yaml"
    book.write_text(
        "plays:\n  - hosts: m5,irina\n    resources:\n      - file: {path: /var/lib/labctl/t.txt, content: x}\n"
        "      - torch_env: {cuda: cu128}\n"
    )
    rc, doc = run_json("-i", str(lab.inventory_path), "provision", "-p", str(book))
    by = results(doc)
    assert rc == 1
    m5, irina = by[("m5", "torch_env")], by[("irina", "torch_env")]
    assert m5["status"] == "failed" and "sm_61" in m5["error"] and "cuda: cu126" in m5["hint"]
    assert irina["status"] == "failed" and "Tesla P4 (sm_61)" in irina["error"]
    assert by[("m5", "file")]["status"] in ("changed", "ok")  # earlier resources were applied
    proc = labctl("-i", str(lab.inventory_path), "provision", "-p", str(book), "--check")
    assert proc.returncode == 1 and "sm_61" in proc.stderr and "Traceback" not in proc.stderr


def test_one_host_failing_does_not_stop_the_others(lab: Any, tmp_path: Path) -> None:
    def huge_cache(doc: dict[str, Any]) -> None:
        doc["hosts"]["m5"]["model_cache"]["size_gb"] = 100_000
        doc["hosts"]["pharaoh"]["model_cache"] = {"path": "/mnt/model-cache", "size_gb": 1}
        doc["hosts"]["pharaoh"]["roles"].append("cache")

    inv = inv_with(lab, tmp_path, huge_cache)
    rc, doc = run_json("-i", str(inv), "provision", "-p", SEED, "--tags", "model_cache")
    by = results(doc)
    assert rc == 1
    assert by[("m5", "model_cache")]["status"] == "failed" and "reserve" in by[("m5", "model_cache")]["error"]
    assert by[("pharaoh", "model_cache")]["status"] == "changed"
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert hosts["m5"]["status"] == "failed" and hosts["pharaoh"]["status"] == "changed"
    _, mounted = run_json("-i", str(inv), "exec", "-l", "pharaoh", "--", "stat -f -c %T /mnt/model-cache")
    assert mounted["results"][0]["stdout"].strip() == "tmpfs"


def test_bad_playbook_is_rejected_with_file_line_field(lab: Any, tmp_path: Path) -> None:
    book = tmp_path / "bad.yaml"
    book.write_text(
        "plays:\n  - hosts: all\n    resources:\n      - cron: {name: x, schedule: '* * *', command: 'true'}\n"
    )
    proc = labctl("-i", str(lab.inventory_path), "provision", "-p", str(book))
    assert proc.returncode == 2
    assert f"{book}:4: plays[0].resources[0].cron.schedule:" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_torch_env_installs_and_verifies_real_torch(lab: Any, tmp_path: Path) -> None:
    """A CPU-only host gets the CPU build from this machine's wheel cache; the host checks it by importing."""

    def no_gpus(doc: dict[str, Any]) -> None:
        doc["hosts"]["irina"]["gpus"] = []

    inv = inv_with(lab, tmp_path, no_gpus)
    book = tmp_path / "torch.yaml"
    book.write_text(
        "plays:\n  - hosts: irina\n    resources:\n      - torch_env: {version: '2.13.0', index_url: ''}\n"
    )
    start = time.monotonic()
    rc, doc = run_json("-i", str(inv), "provision", "-p", str(book), timeout=900)
    r = doc["results"][0]
    assert rc == 0, r
    assert r["status"] == "changed" and "torch 2.13.0+cpu" in r["summary"][0]
    assert {"venv", "pip", "verify", "done"} <= {e["step"] for e in r["events"]}  # progress over SSH
    print(f"torch_env install took {time.monotonic() - start:.0f} s")
    rc, again = run_json("-i", str(inv), "provision", "-p", str(book))
    assert rc == 0 and again["results"][0]["status"] == "ok"
    _, facts = run_json("-i", str(inv), "facts", "--no-torch", "-l", "irina")
    env = facts["results"][0]["facts"]["torch_env"]
    assert env["provisioned"] and env["version"].startswith("2.13.0")
    assert env["python"] == "/var/lib/labctl/envs/torch-2.13.0-cpu/bin/python"
