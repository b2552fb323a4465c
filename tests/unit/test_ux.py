"""What a person reads: output in pipes and files, recaps that say why, defaults found from anywhere."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_cli(
    *args: str, cwd: Path = REPO, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess, its output going to pipes (not a terminal)."""
    base = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "LABCTL_INVENTORY")}
    base["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "labctl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**base, **(env or {})},
    )


def test_tables_in_a_pipe_are_not_wrapped_at_80_columns() -> None:
    proc = run_cli("-i", str(REPO / "inventory/lab.yaml"), "inventory", "show")
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stderr.splitlines() if "192.168.1." in line]
    assert len(rows) == 4, proc.stderr
    m5 = next(r for r in rows if " m5 " in r)
    # One row per host: every cell whole on the host's one line.
    for cell in ("192.168.1.10", "train, inference, cache", "4x Tesla P40 24GB", "/mnt/model-cache 200GB"):
        assert cell in m5, proc.stderr
    # ... and no line padded out to some huge width.
    assert max(len(line) for line in proc.stderr.splitlines()) < 250


def test_provision_recap_says_why_a_host_failed_before_any_resource(tmp_path: Path) -> None:
    (tmp_path / "kh").write_text("")
    (tmp_path / "lab.yaml").write_text(
        "lab: t\n"
        "defaults: {connection: local, python: /nonexistent/python3}\n"
        "hosts:\n"
        "  here: {address: 127.0.0.1}\n"
        "  gone: {address: 127.0.0.1, port: 1, connection: ssh, python: /usr/bin/python3, known_hosts: kh}\n"
    )
    (tmp_path / "pb.yaml").write_text(
        "name: t\nplays:\n  - hosts: all\n    resources:\n"
        f"      - file: {{path: {tmp_path}/out.txt, content: x}}\n"
    )
    proc = run_cli("-i", str(tmp_path / "lab.yaml"), "provision", "-p", str(tmp_path / "pb.yaml"))
    assert proc.returncode == 1, proc.stderr
    rows = {line.split()[1]: line for line in proc.stderr.splitlines() if line.startswith("│")}
    assert "no Python at /nonexistent/python3" in rows["here"], proc.stderr
    assert "set `python:`" in rows["here"], proc.stderr
    assert "unreachable" in rows["gone"] and "Cannot reach gone" in rows["gone"], proc.stderr
    assert not (tmp_path / "out.txt").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["cache", "evict", ".bad", "--host", "m5"],
        ["cache", "verify", "a/b", "--host", "m5"],
        ["cache", "pin", "../x", "--host", "m5"],
        ["cache", "unpin", ".x", "--host", "m5"],
        ["cache", "sync", ".x", "--host", "m5"],
    ],
)
def test_a_cache_command_s_error_shows_an_example_of_that_command(args: list[str]) -> None:
    proc = run_cli("-i", str(REPO / "inventory/lab.yaml"), *args)
    assert proc.returncode == 2, proc.stderr
    assert "not a model name" in proc.stderr
    assert f"For example: labctl cache {args[1]} " in proc.stderr, proc.stderr


def test_a_failed_run_op_shows_an_inline_script_in_short_and_its_last_lines() -> None:
    from labctl.agent.core.errors import AgentError
    from labctl.agent.provision.commands import apply_command

    # (torch_env's own failures lead with their cause: tests/unit/test_torch_env.py)
    script = "import json, sys, tempfile\nwant = sys.argv[1]\njson.dumps({})\nsys.exit('wanted %s' % want)\n"
    argv = [sys.executable, "-c", script, "0.0.0-none", "0", "/var/lib/labctl/envs/torch.json"]
    with pytest.raises(AgentError) as e:
        apply_command({"ops": [{"op": "run", "argv": argv}]})
    message = e.value.message
    assert "tempfile" not in message and "json.dump" not in message  # not the script itself
    assert re.search(
        r" -c <\d+-line script> 0\.0\.0-none 0 /var/lib/labctl/envs/torch\.json exited 1: ", message
    )
    assert "wanted 0.0.0-none" in message
    assert len(message) < 600


def test_init_writes_a_lab_that_validates_and_whose_playbooks_are_found_from_anywhere(tmp_path: Path) -> None:
    lab = tmp_path / "mylab"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = run_cli("init", str(lab), cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert "edit " in proc.stderr and "inventory validate" in proc.stderr
    inv = lab / "inventory/lab.yaml"  # the repository's layout, so the default inventory is it
    for rel in ("playbooks/provision.yaml", "playbooks/train.yaml"):
        assert (lab / rel).read_bytes() == (REPO / rel).read_bytes()  # the repository's own files
    assert run_cli("-i", str(inv), "inventory", "validate", cwd=elsewhere).returncode == 0
    # In the lab's folder nothing needs naming: the default inventory and playbooks are the new ones.
    here = run_cli("--json", "inventory", "show", cwd=lab)
    assert here.returncode == 0, here.stderr
    assert "m5" in json.loads(here.stdout)["hosts"], here.stdout
    dry = run_cli("--json", "provision", "--check", "-l", "workstation", cwd=lab)
    assert json.loads(dry.stdout)["playbook"] == str(lab / "playbooks/provision.yaml"), dry.stderr
    # Again: nothing is overwritten without --force, and nothing is half-written.
    (lab / "playbooks/train.yaml").write_text("mine\n")
    again = run_cli("init", str(lab), cwd=elsewhere)
    assert again.returncode == 2 and "Not overwriting" in again.stderr
    assert (lab / "playbooks/train.yaml").read_text() == "mine\n"
    assert run_cli("init", str(lab), "--force", cwd=elsewhere).returncode == 0
    assert (lab / "playbooks/train.yaml").read_bytes() == (REPO / "playbooks/train.yaml").read_bytes()

    # provision --check from another folder, the inventory from $LABCTL_INVENTORY: the default
    # playbook beside it is used. pharaoh made this machine, so nothing needs a network.
    inv.write_text(
        inv.read_text().replace(
            "    address: 192.168.1.30\n", "    address: 127.0.0.1\n    connection: local\n"
        )
    )
    check = run_cli(
        "--json", "provision", "--check", "-l", "pharaoh", cwd=elsewhere, env={"LABCTL_INVENTORY": str(inv)}
    )
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["playbook"] == str(lab / "playbooks/provision.yaml")


def test_the_default_phases_file_is_found_beside_the_inventory_and_the_error_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from labctl.output.errors import InputError
    from labctl.train.phases import load_phases

    lab = tmp_path / "lab"
    (lab / "playbooks").mkdir(parents=True)
    shutil.copy(REPO / "playbooks/train.yaml", lab / "playbooks/train.yaml")
    monkeypatch.chdir(tmp_path)
    assert load_phases(None, lab / "lab.yaml").path == lab / "playbooks/train.yaml"
    (lab / "playbooks/train.yaml").unlink()
    with pytest.raises(InputError) as e:
        load_phases(None, lab / "lab.yaml")
    assert str(lab / "playbooks/train.yaml") in e.value.message
    assert str(tmp_path / "playbooks/train.yaml") in e.value.message
    assert "labctl init" in e.value.hint


def test_bench_model_load_with_a_file_and_no_host_loads_on_this_machine(tmp_path: Path) -> None:
    import importlib.util
    import socket

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed in this interpreter")
    from labctl.agent.modelload.modelgen import make_model

    make_model(str(tmp_path / "tiny"), 2 << 20, seed=3)
    # No inventory anywhere: a file on this machine needs none.
    proc = run_cli(
        "--json", "bench", "model-load", "--file", str(tmp_path / "tiny"), "--device", "cpu", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["host"] == socket.gethostname() and result["path"] == str(tmp_path / "tiny")
    stages = {s["name"]: s for s in result["stages"]}
    assert stages["ram_cache"]["seconds"] > 0 and stages["ram_cache"]["bytes"] > 1 << 20


def test_provision_recap_names_the_resource_that_failed_and_why(tmp_path: Path) -> None:
    (tmp_path / "lab.yaml").write_text(
        f"lab: t\nhosts:\n  here: {{address: 127.0.0.1, connection: local, python: {sys.executable}}}\n"
    )
    (tmp_path / "afile").write_text("a file, not a folder\n")
    (tmp_path / "pb.yaml").write_text(
        "name: t\nplays:\n  - hosts: all\n    resources:\n"
        f"      - file: {{path: {tmp_path}/afile/inside.txt, content: x}}\n"
    )
    proc = run_cli("-i", str(tmp_path / "lab.yaml"), "provision", "-p", str(tmp_path / "pb.yaml"))
    assert proc.returncode == 1, proc.stderr
    row = next(line for line in proc.stderr.splitlines() if line.startswith("│ here "))
    assert f"file {tmp_path}/afile/inside.txt:" in row and "Not a directory" in row, proc.stderr


def test_train_status_says_why_a_host_could_not_answer(tmp_path: Path) -> None:
    (tmp_path / "kh").write_text("")
    (tmp_path / "lab.yaml").write_text(
        "lab: t\nhosts:\n  gone: {address: 127.0.0.1, port: 1, known_hosts: kh, roles: [train]}\n"
    )
    run = tmp_path / ".labctl" / "runs" / "p1-test"
    run.mkdir(parents=True)
    record = {"run_id": "p1-test", "phase": 1, "state": "running", "hosts": ["gone"], "log_dir": "/tmp/x"}
    (run / "run.json").write_text(json.dumps(record))
    proc = run_cli("-i", str(tmp_path / "lab.yaml"), "train", "status", "p1-test")
    row = next(line for line in proc.stderr.splitlines() if "p1-test" in line)
    assert "gone: unreachable (Cannot reach gone at 127.0.0.1:1" in row, proc.stderr
