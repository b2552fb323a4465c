"""Every fix a hint names, tried as written: the error is provoked on the simulated lab, the
`labctl ...` command of its hint is run exactly as it reads (shlex split, nothing substituted),
it must exit 0, and then the error is gone.

The user works in a lab folder as `labctl init` makes one: inventory/lab.yaml (the sim's hosts)
beside playbooks/, so the commands run there with no -i; $LABCTL_INVENTORY names the same file
(tests/hint_cmds.py). Where a hint names a change to make first (a line of the inventory), the
test makes exactly that change. The sandbox playbook beside the inventory says
`configure_daemon: false`: this machine's dockerd is shared with other test sessions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.agent.sandbox import image_name
from tests.conftest import REPO, labctl, sh
from tests.hint_cmds import as_written, hinted_all

pytestmark = pytest.mark.integration
HELLO_C = '#include <stdio.h>\nint main(void) { puts("hello"); return 0; }\n'
SANDBOX_PLAYBOOK = (
    "name: sandboxes\nplays:\n  - name: Docker and the sandbox images\n    hosts: role:sandbox\n"
    "    tags: [sandbox]\n    resources:\n      - sandbox: {configure_daemon: false}\n"
)


@pytest.fixture
def lab_dir(lab: Any, tmp_path: Path) -> Path:
    """A lab folder for the sim: its inventory (own known_hosts, irina's sandboxes: python
    only) beside the shipped playbooks."""
    (tmp_path / "inventory" / "keys").mkdir(parents=True)
    shutil.copy(lab.known_hosts_path, tmp_path / "inventory" / "keys" / "known_hosts")
    doc = yaml.safe_load(lab.inventory_path.read_text())
    doc["defaults"]["ssh_key"] = str(lab.key_path)
    doc["defaults"]["known_hosts"] = "keys/known_hosts"
    doc["hosts"]["irina"]["sandbox"] = {"languages": ["python"], "pool": 2}
    write_inventory(tmp_path, doc)
    shutil.copytree(REPO / "playbooks", tmp_path / "playbooks")
    (tmp_path / "playbooks" / "sandbox.yaml").write_text(SANDBOX_PLAYBOOK)
    return tmp_path


def inventory(d: Path) -> dict[str, Any]:
    return dict(yaml.safe_load((d / "inventory" / "lab.yaml").read_text()))


def write_inventory(d: Path, doc: dict[str, Any]) -> None:
    (d / "inventory" / "lab.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def here(d: Path, *args: str, answer: str | None = None) -> subprocess.CompletedProcess[str]:
    """`labctl ARGS` typed in the lab folder `d`."""
    proc = as_written(d / "inventory" / "lab.yaml", ["labctl", *args], d, answer)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def fix(proc: subprocess.CompletedProcess[str], *expected: str) -> list[str]:
    """The one command the error's hint names, which must read `expected` (a wrong flag, a
    missing --limit or a placeholder fails here, with the whole message)."""
    text = proc.stdout + proc.stderr
    commands = hinted_all(text)
    assert commands and commands[0] == list(expected), text
    return commands[0]


def run_fix(d: Path, argv: list[str], answer: str | None = None) -> subprocess.CompletedProcess[str]:
    done = as_written(d / "inventory" / "lab.yaml", argv, d, answer)
    assert done.returncode == 0, (
        f"`{' '.join(argv)}` as written exited {done.returncode}:\n{done.stdout}{done.stderr}"
    )
    return done


# --- sandbox -------------------------------------------------------------------------------


def test_sandbox_language_not_declared_names_the_inventory_line_then_the_playbook_that_builds_it(
    lab_dir: Path, docker_images: dict[str, Any]
) -> None:
    (lab_dir / "hello.c").write_text(HELLO_C)
    proc = here(lab_dir, "sandbox", "run", "--lang", "c", "hello.c")
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 2, text
    assert "c is not among irina's sandbox languages (python)" in text, text
    assert "Add c to hosts.irina.sandbox.languages" in text, text
    cmd = fix(
        proc, "labctl", "provision", "-p", "playbooks/sandbox.yaml", "--tags", "sandbox", "--limit", "irina"
    )
    doc = inventory(lab_dir)
    doc["hosts"]["irina"]["sandbox"]["languages"].append("c")  # the change the hint names
    write_inventory(lab_dir, doc)
    run_fix(lab_dir, cmd)
    again = here(lab_dir, "sandbox", "run", "--lang", "c", "hello.c")
    assert again.returncode == 0 and again.stdout == "hello\n", again.stderr


def test_sandbox_image_not_built_names_the_command_that_really_builds_it(
    docker_images: dict[str, Any], tmp_path: Path
) -> None:
    """On this machine (a `connection: local` host): the sim's namespaces have no route to
    Debian's mirror, and the hint's command builds an image from it. bash's image is the base
    alone, the quickest to build."""
    # A warm pool container of an earlier run would answer without the image: it goes first.
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"ancestor={image_name('bash')}"], capture_output=True, text=True
    ).stdout.split()
    if left:
        subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
    subprocess.run(["docker", "image", "rm", "-f", image_name("bash")], capture_output=True)
    (tmp_path / "inventory").mkdir()
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "sandbox.yaml").write_text(SANDBOX_PLAYBOOK)
    doc = {
        "lab": "hints",
        "hosts": {
            "here": {
                "address": "127.0.0.1",
                "connection": "local",
                "python": sys.executable,
                "roles": ["sandbox"],
                "sandbox": {"languages": ["python", "bash"], "pool": 1},
            }
        },
    }
    write_inventory(tmp_path, doc)
    (tmp_path / "hello.sh").write_text("echo hello\n")
    proc = here(tmp_path, "sandbox", "run", "--lang", "bash", "hello.sh")
    assert proc.returncode == 1 and f"the sandbox image {image_name('bash')} is not built" in proc.stderr, (
        proc.stderr
    )
    cmd = fix(
        proc, "labctl", "provision", "-p", "playbooks/sandbox.yaml", "--tags", "sandbox", "--limit", "here"
    )
    done = run_fix(tmp_path, cmd)
    assert f"build {image_name('bash')}" in done.stderr, done.stderr
    again = here(tmp_path, "sandbox", "run", "--lang", "bash", "hello.sh")
    assert again.returncode == 0 and again.stdout == "hello\n", again.stderr


# --- trust / host keys -----------------------------------------------------------------------


def _known_hosts(d: Path) -> Path:
    return d / "inventory" / "keys" / "known_hosts"


def _lines_of(d: Path, address: str) -> list[str]:
    return [
        line
        for line in _known_hosts(d).read_text().splitlines()
        if line.split(" ", 1)[0].strip("[").split("]")[0] == address
    ]


def test_an_unpinned_host_key_is_pinned_by_the_trust_command_named(lab: Any, lab_dir: Path) -> None:
    m5 = lab.hosts["m5"]
    kept = [
        line for line in _known_hosts(lab_dir).read_text().splitlines() if line not in _lines_of(lab_dir, m5)
    ]
    _known_hosts(lab_dir).write_text("\n".join(kept) + "\n")
    proc = here(lab_dir, "facts", "--limit", "m5", "--no-torch")
    assert proc.returncode == 1 and "is not pinned" in proc.stdout + proc.stderr, proc.stderr
    run_fix(lab_dir, fix(proc, "labctl", "trust", "m5"), answer="y")  # it asks, on a terminal
    assert here(lab_dir, "facts", "--limit", "m5", "--no-torch").returncode == 0


def test_a_changed_host_key_is_replaced_by_the_trust_command_named(lab: Any, lab_dir: Path) -> None:
    m5, irina = lab.hosts["m5"], lab.hosts["irina"]
    # m5 pinned with irina's key: what a reinstalled m5 looks like from here
    others = [
        line for line in _known_hosts(lab_dir).read_text().splitlines() if line not in _lines_of(lab_dir, m5)
    ]
    wrong = [line.replace(irina, m5, 1) for line in _lines_of(lab_dir, irina)]
    _known_hosts(lab_dir).write_text("\n".join(others + wrong) + "\n")
    proc = here(lab_dir, "facts", "--limit", "m5", "--no-torch")
    assert proc.returncode == 1 and "pins" in proc.stdout + proc.stderr, proc.stderr
    run_fix(lab_dir, fix(proc, "labctl", "trust", "m5", "--replace"), answer="y")
    assert here(lab_dir, "facts", "--limit", "m5", "--no-torch").returncode == 0


# --- inventory -------------------------------------------------------------------------------


def test_an_inventory_typo_is_checked_again_by_the_command_named(lab_dir: Path) -> None:
    path = lab_dir / "inventory" / "lab.yaml"
    good = path.read_text()
    path.write_text(good.replace("  pharaoh:\n    address:", "  pharaoh:\n    adress:", 1))
    proc = here(lab_dir, "inventory", "validate")
    assert proc.returncode == 2 and "adress" in proc.stderr, proc.stderr
    cmd = fix(proc, "labctl", "inventory", "validate")
    assert as_written(path, cmd, lab_dir).returncode == 2  # it checks the same file: still wrong
    path.write_text(good)  # the line the error names, fixed
    run_fix(lab_dir, cmd)


def test_no_inventory_at_all_the_starter_command_named_writes_one(tmp_path: Path) -> None:
    """A folder with no lab yet, and no $LABCTL_INVENTORY: the hint's DIR is a folder name
    to pick, and as typed it is one."""
    env = {k: v for k, v in os.environ.items() if k != "LABCTL_INVENTORY"}

    def typed(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, cwd=cwd, env=env)

    proc = typed(["labctl", "inventory", "validate"], tmp_path)
    assert proc.returncode == 2 and "No inventory" in proc.stderr, proc.stderr
    cmd = hinted_all(proc.stderr)[0]
    assert cmd == ["labctl", "init", "DIR"], proc.stderr
    assert typed(cmd, tmp_path).returncode == 0
    # "run labctl in DIR to leave out -i"
    again = typed(["labctl", "inventory", "validate"], tmp_path / "DIR")
    assert again.returncode == 0, again.stderr


# --- provision -------------------------------------------------------------------------------


def test_a_broken_playbook_is_checked_again_by_the_command_named(lab_dir: Path) -> None:
    book = lab_dir / "mine.yaml"
    good = "name: mine\nplays:\n  - hosts: m5\n    resources:\n      - file: {path: /tmp/labctl-hints-mine, content: hi}\n"
    book.write_text(good.replace("resources:", "resourcez:"))
    proc = here(lab_dir, "provision", "-p", "mine.yaml", "--check")
    assert proc.returncode == 2 and "resourcez" in proc.stderr, proc.stderr
    cmd = fix(proc, "labctl", "provision", "-p", "mine.yaml", "--check")
    again = as_written(lab_dir / "inventory" / "lab.yaml", cmd, lab_dir)
    assert again.returncode == 2 and "resourcez" in again.stderr  # it checks that playbook, not the default
    book.write_text(good)
    done = run_fix(lab_dir, cmd)
    assert "would change" in done.stderr and "m5" in done.stderr, done.stderr


# --- cache -----------------------------------------------------------------------------------


@pytest.fixture
def fresh_cache(lab: Any, lab_dir: Path) -> Iterator[str]:
    """m5's model_cache at a path no test has made: what a newly added cache looks like. Unmounted,
    removed and m5's fstab put back afterwards."""
    path = f"/mnt/model-cache-hints-{uuid.uuid4().hex[:8]}"
    doc = inventory(lab_dir)
    doc["hosts"]["m5"]["model_cache"]["path"] = path
    write_inventory(lab_dir, doc)
    inv = lab.inventory_path
    fstab = sh(inv, "m5", "cat /etc/fstab")
    try:
        yield path
    finally:
        sh(inv, "m5", f"umount {path} 2>/dev/null; rmdir {path} 2>/dev/null; true")
        sh(inv, "m5", "cat > /etc/fstab <<'EOF'\n" + fstab + "EOF")


def test_a_cache_never_made_is_made_by_the_provision_command_named(lab_dir: Path, fresh_cache: str) -> None:
    proc = here(lab_dir, "cache", "status", "--host", "m5")
    assert proc.returncode == 1 and f"no folder at its model_cache path {fresh_cache}" in proc.stderr.replace(
        "\n", " "
    ), proc.stderr
    run_fix(lab_dir, fix(proc, "labctl", "provision", "--tags", "model_cache", "--limit", "m5"))
    assert here(lab_dir, "cache", "status", "--host", "m5").returncode == 0


# --- ckpt ------------------------------------------------------------------------------------


def test_a_restore_of_a_run_never_backed_up_names_the_backup_of_that_run(lab: Any, lab_dir: Path) -> None:
    run_id = f"hint-{uuid.uuid4().hex[:8]}"
    folder = f"/var/lib/labctl/train/hints-{run_id}"
    runs = lab_dir / "inventory" / ".labctl" / "runs" / run_id
    runs.mkdir(parents=True)
    record = {"run_id": run_id, "phase": 1, "hosts": ["m5"], "started": time.time(), "checkpoint_dir": folder}
    (runs / "run.json").write_text(json.dumps(record))
    code = (
        "import os,sys; from labctl.agent.train.ckpt import CheckpointDir; "
        "CheckpointDir(sys.argv[1]).save(10, os.urandom(4096), {}, save=lambda s, f: f.write(s))"
    )
    inv = lab.inventory_path
    sh(inv, "m5", f"cd {REPO} && {sys.executable} -c '{code}' {folder}")
    try:
        proc = here(lab_dir, "ckpt", "restore", run_id, "--to", "m5")
        assert proc.returncode == 2 and "holds no copy of run" in proc.stderr, proc.stderr
        run_fix(lab_dir, fix(proc, "labctl", "ckpt", "backup", "--run", run_id))
        done = here(lab_dir, "ckpt", "restore", run_id, "--to", "m5")
        assert done.returncode == 0, done.stderr
    finally:
        sh(inv, "m5", f"rm -rf {folder}")
        sh(inv, "irina", f"rm -rf /srv/checkpoints/{run_id}")


# --- cron ------------------------------------------------------------------------------------


def test_a_purge_other_jobs_still_need_names_removals_that_work(lab: Any, lab_dir: Path) -> None:
    try:
        for job in (["facts", "--every", "30m"], ["ckpt-backup", "--daily"]):
            assert here(lab_dir, "cron", "install", *job).returncode == 0
        proc = here(lab_dir, "cron", "remove", "facts", "--purge")
        assert proc.returncode == 2 and "--purge would remove" in proc.stderr, proc.stderr
        # ckpt-verify came with ckpt-backup and goes with it: one command, and no --purge yet
        run_fix(lab_dir, fix(proc, "labctl", "cron", "remove", "ckpt-backup"))
        assert here(lab_dir, "cron", "remove", "facts", "--purge").returncode == 0
    finally:
        for job in ("ckpt-backup", "facts"):
            labctl(
                "-i", str(lab_dir / "inventory" / "lab.yaml"), "cron", "remove", job, "--purge", timeout=600
            )


# --- orchestra and train -------------------------------------------------------------------


def tiny_orchestra(d: Path, *models: str) -> None:
    """The lab's orchestra file, beside its inventory: m5 keeps two tiny models warm."""
    (d / "playbooks" / "orchestra.yaml").write_text(
        yaml.safe_dump(
            {
                "hosts": "m5",
                "warm": 2,
                "rotate": 1,
                "every": "4h",
                "server": {"python": sys.executable, "start_timeout": 180, "stop_grace": 10},
                "models": [{"name": m, "size_gb": 0.004} for m in models],
            }
        )
    )


def test_an_orchestra_host_without_a_cache_gets_one_by_the_command_named(
    lab_dir: Path, fresh_cache: str
) -> None:
    tiny_orchestra(lab_dir, "hint-none-a", "hint-none-b")
    doc = inventory(lab_dir)
    cache = doc["hosts"]["m5"].pop("model_cache")
    write_inventory(lab_dir, doc)
    proc = here(lab_dir, "orchestra", "status")
    assert proc.returncode == 2 and "no model_cache" in proc.stderr, proc.stderr
    cmd = fix(proc, "labctl", "provision", "--tags", "model_cache", "--limit", "m5")
    doc["hosts"]["m5"]["model_cache"] = cache  # "give each serving host a model_cache"
    write_inventory(lab_dir, doc)
    run_fix(lab_dir, cmd)
    assert here(lab_dir, "orchestra", "status").returncode == 0


def test_phase3_without_the_warm_set_starts_it_by_the_command_named(
    lab: Any, lab_dir: Path, fresh_cache: str, docker_images: dict[str, Any]
) -> None:
    models = [f"hint-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    tiny_orchestra(lab_dir, *models)
    inv = lab.inventory_path
    assert here(lab_dir, "provision", "--tags", "model_cache", "--limit", "m5").returncode == 0
    for model in models:
        made = here(lab_dir, "bench", "make-model", "--size-gb", "0.004", "--name", model, "--host", "irina")
        assert made.returncode == 0, made.stderr
    phase3 = [
        "train",
        "--phase",
        "3",
        "--limit",
        "m5",
        "--device",
        "cpu",
        "--python",
        sys.executable,
        "--dry-run",
    ]
    try:
        proc = here(lab_dir, *phase3)
        assert proc.returncode == 1 and "warm set" in proc.stderr, proc.stderr
        run_fix(lab_dir, fix(proc, "labctl", "orchestra", "start"))
        # Warm, but no sandbox service for the trainers' code: its command, as written, starts it.
        proc = here(lab_dir, *phase3)
        assert proc.returncode == 1 and "labctl sandbox serve" in proc.stderr, proc.stderr
        run_fix(lab_dir, fix(proc, "labctl", "sandbox", "serve"))
        done = here(lab_dir, *phase3)
        assert done.returncode == 0, done.stderr
        # The warm set up, but the trainers' endpoints file gone (a host given the train role
        # since): the same command writes it again, changing no server.
        sh(inv, "m5", "rm /var/lib/labctl/orchestra/endpoints.json")
        proc = here(lab_dir, *phase3)
        assert proc.returncode == 1 and "endpoints.json, and there is none" in proc.stderr, proc.stderr
        run_fix(lab_dir, fix(proc, "labctl", "orchestra", "start"))
        assert here(lab_dir, *phase3).returncode == 0
    finally:
        here(lab_dir, "orchestra", "stop")
        here(lab_dir, "sandbox", "serve", "--stop")
        sh(inv, "m5", "rm -rf /var/lib/labctl/orchestra")
        sh(inv, "irina", "rm -rf " + " ".join(f"/srv/models/{m}" for m in models))


# --- a file given with -f is the one the hint checks again ---------------------------------------


def test_a_broken_phases_file_given_with_f_is_checked_again_by_the_command_named(lab_dir: Path) -> None:
    mine = lab_dir / "mine-train.yaml"
    mine.write_text((REPO / "playbooks" / "train.yaml").read_text() + "stray: 1\n")
    proc = here(lab_dir, "train", "--phase", "1", "-f", "mine-train.yaml", "--dry-run")
    assert proc.returncode == 2 and "stray" in proc.stderr, proc.stderr
    again = as_written(lab_dir / "inventory" / "lab.yaml", hinted_all(proc.stderr)[0], lab_dir)
    assert again.returncode == 2 and "stray" in again.stderr, again.stderr  # the same file, checked


def test_a_broken_orchestra_file_given_with_f_is_checked_again_by_the_command_named(lab_dir: Path) -> None:
    mine = lab_dir / "mine-orchestra.yaml"
    mine.write_text((REPO / "playbooks" / "orchestra.yaml").read_text() + "stray: 1\n")
    proc = here(lab_dir, "orchestra", "plan", "-f", "mine-orchestra.yaml")
    assert proc.returncode == 2 and "stray" in proc.stderr, proc.stderr
    again = as_written(lab_dir / "inventory" / "lab.yaml", hinted_all(proc.stderr)[0], lab_dir)
    assert again.returncode == 2 and "stray" in again.stderr, again.stderr


# --- a sanity check of the helper the tests above stand on -------------------------------------


def test_hinted_all_reads_commands_across_line_breaks() -> None:
    text = "error: irina: ...\nBuild it: `labctl provision -p playbooks/sandbox.yaml\n--tags sandbox --limit irina`."
    assert hinted_all(text) == [
        ["labctl", "provision", "-p", "playbooks/sandbox.yaml", "--tags", "sandbox", "--limit", "irina"]
    ]
