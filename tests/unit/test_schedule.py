"""`labctl cron install` planned without a host: schedules, the generated playbook, the
launcher, the files labctl ships, the inventory copy, and the host-side pieces run on real files."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.agent.core import paths
from labctl.agent.core.errors import AgentError
from labctl.agent.cron import cronjobs
from labctl.agent.provision import commands as agent_provision
from labctl.cron import plan
from labctl.cron.every import every_to_schedule, resolve_schedule
from labctl.cron.jobs import JOBS, get_job
from labctl.inventory.load import load_inventory
from labctl.inventory.model import Host, Inventory
from labctl.output.errors import InputError
from labctl.provision.resource import PlanError, load_registry
from labctl.provision.resources import bundle
from labctl.provision.resources.controller import (
    AuthorizedKey,
    AuthorizedKeyParams,
    ControllerInstall,
    InstallParams,
    KeypairParams,
    SshKeypair,
)
from labctl.provision.resources.cron import CronParams, cron_file, systemd_units
from labctl.sim.plan import MANAGED_PATHS

REPO = Path(__file__).resolve().parents[2]
PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBuV0yq2Qk0mN3mZb2xkT1pQ6v7m9l8fGk3r2s1t0u9w"


def host(name: str = "pharaoh", **kw: Any) -> Host:
    return Host(name=name, address="10.0.0.3", **kw)


def lab(*hosts: Host) -> Inventory:
    return Inventory(lab="t", path=Path("/x/inventory.yaml"), hosts={h.name: h for h in hosts})


# -- schedules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("every", "schedule"),
    [
        ("30m", "*/30 * * * *"),
        ("1m", "* * * * *"),
        ("60m", "0 * * * *"),
        ("4h", "0 */4 * * *"),
        ("24h", "0 0 * * *"),
        ("1d", "0 0 * * *"),
        ("7d", "0 0 * * 0"),
    ],
)
def test_every_becomes_the_cron_schedule_of_that_period(every: str, schedule: str) -> None:
    assert every_to_schedule(every) == schedule


@pytest.mark.parametrize(
    ("every", "nearest"),
    [
        ("90m", "--every 1h"),
        ("45m", "--every 30m"),
        ("5h", "--every 4h"),
        ("2d", "--every 1d"),
        ("7h", "--every 6h"),
    ],
)
def test_a_period_cron_cannot_say_is_refused_with_the_nearest(every: str, nearest: str) -> None:
    with pytest.raises(InputError) as e:
        every_to_schedule(every)
    assert nearest in e.value.hint and "cannot be said in cron" in e.value.message


@pytest.mark.parametrize("every", ["0m", "4x", "h", "-1h", "1.5h"])
def test_an_every_that_is_no_period_is_refused(every: str) -> None:
    with pytest.raises(InputError, match="not a period"):
        every_to_schedule(every)


def test_schedule_or_every_but_one_of_them() -> None:
    assert resolve_schedule(None, "0  */4 * * *") == "0 */4 * * *"
    for every, schedule, words in (
        (None, None, "When"),
        ("4h", "0 * * * *", "not both"),
        (None, "* * *", "5 fields"),
    ):
        with pytest.raises(InputError, match=words):
            resolve_schedule(every, schedule)


def test_an_unknown_job_names_the_known_ones() -> None:
    with pytest.raises(InputError) as e:
        get_job("rotat")
    assert "rotate:" in e.value.hint and "facts:" in e.value.hint


# -- the orchestrator ------------------------------------------------------------------------


def test_the_orchestrator_is_the_one_host_with_the_role() -> None:
    inv = lab(host(roles=["orchestrator"]), host("m5", roles=["train"]))
    assert plan.orchestrator(inv).name == "pharaoh"
    assert plan.orchestrator(inv, "m5").name == "m5"
    with pytest.raises(InputError, match="no such host"):
        plan.orchestrator(inv, "nope")
    with pytest.raises(InputError) as none:
        plan.orchestrator(lab(host(roles=[])))
    assert "No host has the role orchestrator" in none.value.message and "--host" in none.value.hint
    with pytest.raises(InputError, match=r"2 hosts have \(pharaoh, m5\)"):
        plan.orchestrator(lab(host(roles=["orchestrator"]), host("m5", roles=["orchestrator"])))
    with pytest.raises(InputError, match="Linux host"):
        plan.orchestrator(lab(host(roles=["orchestrator"], os="windows")))


# -- the generated playbook ------------------------------------------------------------------


def test_install_playbook_as_data() -> None:
    orch = host(roles=["orchestrator"])
    hosts = [host("m5"), host("irina"), orch]
    doc = {"lab": "t", "defaults": {"ssh_key": "keys/id"}, "hosts": {"m5": {"address": "10.0.0.1"}}}
    book = plan.install_playbook(
        get_job("facts"),
        orch,
        hosts,
        doc,
        "10.0.0.1 ssh-ed25519 AAAA\n",
        {"train.yaml": "x: 1\n"},
        PUB,
    )
    on_orch, authorise = book.plays
    assert on_orch.hosts == "pharaoh"
    assert [e.type_name for e in on_orch.entries] == [
        "controller_install",
        "file",
        "ssh_keypair",
        "file",
        "file",
        "file",
    ]
    paths_written = [e.params.get("path") for e in on_orch.entries if e.type_name == "file"]
    assert paths_written == [plan.BIN, plan.INVENTORY, plan.KNOWN_HOSTS, plan.PLAYBOOKS + "/train.yaml"]
    (cron_play,) = plan.cron_playbook(get_job("facts"), "*/30 * * * *", orch).plays
    assert cron_play.hosts == "pharaoh" and [e.type_name for e in cron_play.entries] == ["cron"]
    cron = cron_play.entries[0].params
    assert cron["name"] == "facts" and cron["schedule"] == "*/30 * * * *"
    assert cron["command"].startswith(
        f"{paths.CONTROLLER_DIR}/bin/labctl -i {paths.CONTROLLER_DIR}/lab/inventory.yaml facts --no-torch --json >"
    )
    assert authorise.hosts == "m5,irina,pharaoh"
    assert authorise.entries[0].params == {"mark": "labctl-orchestrator@pharaoh", "key": PUB}
    # Every entry is one the engine builds for its host (params valid for its resource type).
    for play in [*book.plays, cron_play]:
        for e in play.entries:
            load_registry()[e.type_name].from_playbook(orch, e.params)
    # --check before the key exists: nothing to authorise yet.
    assert len(plan.install_playbook(get_job("rotate"), orch, hosts, doc, "", {}, None).plays) == 1


def test_remove_playbook_purges_only_when_asked() -> None:
    orch = host(roles=["orchestrator"])
    plain = plan.remove_playbook("facts", orch, [host("m5")], purge=False)
    assert [(e.type_name, e.params.get("state")) for p in plain.plays for e in p.entries] == [
        ("cron", "absent")
    ]
    purge = plan.remove_playbook("facts", orch, [host("m5")], purge=True)
    assert [(p.hosts, e.type_name) for p in purge.plays for e in p.entries] == [
        ("pharaoh", "cron"),
        ("pharaoh", "controller_install"),
        ("m5", "authorized_key"),
    ]


def test_the_rotate_job_runs_the_installed_labctl_on_the_lab_copy() -> None:
    from labctl.documents.defaults import default_places
    from labctl.orchestra.spec import DEFAULT_ORCHESTRA

    copy = f"{paths.CONTROLLER_DIR}/lab/playbooks/orchestra.yaml"
    assert plan.job_command(JOBS["rotate"]) == (
        f"{paths.CONTROLLER_DIR}/bin/labctl -i {paths.CONTROLLER_DIR}/lab/inventory.yaml rotate -f {copy}"
    )
    # The copy is also what labctl on the orchestrator finds by default beside the lab copy.
    assert str(default_places(DEFAULT_ORCHESTRA, Path(plan.INVENTORY))[0]) == copy


def test_launcher_runs_labctl_from_its_lib_folder_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = plan.launcher("/usr/bin/python3")
    assert text.startswith("#!/usr/bin/python3 -I\n")
    assert f"sys.path.insert(0, '{paths.CONTROLLER_DIR}/current/lib')" in text
    # Run for real, with this checkout as its lib folder and PYTHONPATH pointing nowhere useful:
    # -I ignores it, so labctl is found through the launcher's own path entry.
    monkeypatch.setattr(plan, "LIB", str(REPO))
    script = tmp_path / "labctl"
    script.write_text(plan.launcher(sys.executable))
    script.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([str(script), "--version"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("labctl ")


# -- what labctl ships ------------------------------------------------------------------------


def test_dependencies_are_the_installed_closure_without_extras() -> None:
    names = {bundle.canonical(d.metadata["Name"]) for d in bundle.dependencies()}
    assert {"typer", "rich", "paramiko", "pydantic", "pydantic-core", "pyyaml", "cryptography"} <= names
    assert not names & {"labctl", "pytest", "ruff", "mypy", "torch", "ansible-core"}


def test_distribution_files_are_its_package_files_only() -> None:
    typer = next(d for d in bundle.dependencies() if bundle.canonical(d.metadata["Name"]) == "typer")
    rels = [rel for rel, _ in bundle.dist_files(typer)]
    assert "typer/__init__.py" in rels
    assert any(r.endswith(".dist-info/METADATA") for r in rels)  # importlib.metadata works there too
    assert not [r for r in rels if r.startswith("..") or "__pycache__" in r or r.endswith(".pyc")]
    own = [rel for rel, _ in bundle.package_files()]
    assert "labctl/agent/core/paths.py" in own and "labctl/data/lab.yaml" in own
    assert not [r for r in own if "__pycache__" in r]


def test_bundle_copy_or_pip_and_reproducible() -> None:
    pip = bundle.make_bundle(False)
    assert "typer==0.29.2" in pip.pip and "pydantic==2.14.3" in pip.pip
    assert all(arc.startswith("lib/labctl/") for arc, _ in pip.files)
    assert pip.tar_gz() == pip.tar_gz()
    copy = bundle.make_bundle(True)
    assert not copy.pip and "lib/typer/__init__.py" in {arc for arc, _ in copy.files}
    assert (
        copy.tag.startswith("0.")
        and copy.record["mode"] == "copy"
        and pip.record["digest"] != copy.record["digest"]
    )


# -- the inventory copy -------------------------------------------------------------------------


def test_inventory_copy_uses_the_orchestrators_key_and_keeps_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = {
        "lab": "t",
        "defaults": {"user": "root", "ssh_key": "keys/id", "known_hosts": "keys/known_hosts"},
        "hosts": {
            "m5": {"address": "10.0.0.1", "roles": ["train"], "ssh_key": "/other/key"},
            "pharaoh": {"address": "10.0.0.3", "roles": ["orchestrator"], "known_hosts": "/k"},
        },
    }
    out = plan.rewrite_inventory(doc)
    assert doc["hosts"]["m5"]["ssh_key"] == "/other/key"  # the controller's own is untouched
    assert out["defaults"] == {"user": "root", "ssh_key": plan.KEY, "known_hosts": plan.KNOWN_HOSTS}
    assert out["hosts"] == {
        "m5": {"address": "10.0.0.1", "roles": ["train"]},
        "pharaoh": {"address": "10.0.0.3", "roles": ["orchestrator"]},
    }
    # It loads as an inventory where those files are (on the orchestrator; here, in tmp_path).
    key, known = tmp_path / "id", tmp_path / "known_hosts"
    key.write_text("k")
    known.write_text("")
    monkeypatch.setattr(plan, "KEY", str(key))
    monkeypatch.setattr(plan, "KNOWN_HOSTS", str(known))
    f = tmp_path / "inventory.yaml"
    f.write_text(yaml.safe_dump(plan.rewrite_inventory(doc)))
    inv = load_inventory(f)
    assert {h.ssh_key for h in inv.hosts.values()} == {key}


def test_known_hosts_copy_merges_each_pinned_line_once(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("10.0.0.1 ssh-ed25519 AAAA\n10.0.0.2 ssh-ed25519 BBBB\n")
    b.write_text("10.0.0.2 ssh-ed25519 BBBB\n10.0.0.3 ssh-ed25519 CCCC\n")
    text = plan.known_hosts_copy(
        [host("m5", known_hosts=a), host("x", known_hosts=b), host("y", known_hosts=a)]
    )
    assert text.splitlines() == [
        "10.0.0.1 ssh-ed25519 AAAA",
        "10.0.0.2 ssh-ed25519 BBBB",
        "10.0.0.3 ssh-ed25519 CCCC",
    ]
    with pytest.raises(InputError) as e:
        plan.known_hosts_copy([host("m5", known_hosts=tmp_path / "missing")])
    assert "missing" in e.value.message and "labctl trust" in e.value.hint


# -- resources ----------------------------------------------------------------------------------


def keys_state(text: str | None, ssh_dir: bool = True) -> dict[str, Any]:
    file = {"exists": text is not None, "text": text or "", "mode": 0o600, "uid": 0, "gid": 0}
    return {
        "keys": {
            "uid": 1000,
            "user_gid": 1000,
            "home": "/home/ann",
            "path": "/home/ann/.ssh/authorized_keys",
            "ssh_dir": {"exists": ssh_dir, "is_dir": ssh_dir},
            "file": file,
        }
    }


def test_authorized_key_is_one_marked_line_replaced_in_place() -> None:
    mark = "labctl-orchestrator@pharaoh"
    res = AuthorizedKey(host(user="ann"), AuthorizedKeyParams(mark=mark, key=PUB + " old comment"))
    fresh = res.plan(keys_state(None, ssh_dir=False))
    assert fresh.ops[0] == {"op": "mkdir", "path": "/home/ann/.ssh", "mode": 0o700}
    assert fresh.ops[1]["uid"] == 1000 and fresh.ops[1]["gid"] == 1000
    write = fresh.ops[-1]
    assert (write["path"], write["text"], write["mode"], write["uid"]) == (
        "/home/ann/.ssh/authorized_keys",
        f"{PUB} {mark}\n",
        0o600,
        1000,
    )
    other = "ssh-rsa AAAAB3 ann@laptop"
    old = f"{other}\nssh-ed25519 AAAAold {mark}\n"
    replaced = res.plan(keys_state(old)).ops[-1]["text"]
    assert replaced == f"{other}\n{PUB} {mark}\n"
    assert not res.plan(keys_state(replaced)).changed
    gone = AuthorizedKey(host(), AuthorizedKeyParams(mark=mark, state="absent")).plan(keys_state(replaced))
    assert gone.ops[-1]["text"] == other + "\n"


def test_keypair_is_made_on_the_host_and_its_private_half_never_read() -> None:
    res = SshKeypair(host(), KeypairParams(path="/k/id", comment="labctl-orchestrator@pharaoh"))
    assert res.probes()["key"] == {"kind": "file", "path": "/k/id", "content": False}
    missing = res.plan({"key": {"exists": False}, "pub": {"exists": False}, "dir": {"exists": False}})
    assert missing.ops[0] == {"op": "mkdir", "path": "/k", "mode": 0o700}
    assert missing.ops[1]["argv"][:4] == ["ssh-keygen", "-q", "-t", "ed25519"]
    loose = res.plan(
        {
            "key": {"exists": True, "mode": 0o644},
            "pub": {"exists": True},
            "dir": {"is_dir": True, "mode": 0o700},
        }
    )
    assert loose.ops == [{"op": "chmod", "path": "/k/id", "mode": 0o600}]


def test_controller_install_changes_nothing_at_the_recorded_version_and_pips_elsewhere() -> None:
    res = ControllerInstall(host(), InstallParams())
    mine = bundle.runtime()
    here = f"{mine['python']} {mine['platform']}"
    record = json.dumps({**bundle.make_bundle(True).record, "host": here})
    state = {
        "record": {"exists": True, "text": record},
        "root": {"exists": True, "is_dir": True},
        "runtime": {"rc": 0, "stdout": here + "\n"},
    }
    assert not res.plan(state).changed
    other = res.plan({**state, "runtime": {"rc": 0, "stdout": "3.12 linux-aarch64\n"}})
    (op,) = other.ops
    assert op["op"] == "install_tree" and "pip install --target" in other.summary[0]
    assert op["pip"] == {"python": "/usr/bin/python3", "requirements": list(bundle.make_bundle(False).pip)}
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(op["b64"]))) as tar:
        assert all(n.startswith("lib/labctl/") for n in tar.getnames())
    with pytest.raises(PlanError) as old:
        res.plan({**state, "runtime": {"rc": 0, "stdout": "3.8 linux-x86_64\n"}})
    assert "needs Python 3.11 or newer" in old.value.message and "`python:` of pharaoh" in old.value.hint
    gone = ControllerInstall(host(), InstallParams(state="absent")).plan(state)
    assert gone.ops == [{"op": "remove_tree", "path": paths.CONTROLLER_DIR}]


# -- host side ------------------------------------------------------------------------------------


def tar_of(files: dict[str, bytes]) -> str:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(raw.getvalue()).decode()


def test_install_tree_swaps_releases_whole(tmp_path: Path) -> None:
    root = str(tmp_path / "controller")
    for tag, body in (("v1", b"one"), ("v2", b"two")):
        op = {
            "op": "install_tree",
            "root": root,
            "tag": tag,
            "record": {"t": tag},
            "b64": tar_of({"lib/m.py": body}),
        }
        agent_provision.apply_command({"ops": [op]})
        assert (Path(root) / "current" / "lib" / "m.py").read_bytes() == body
        assert json.loads((Path(root) / "current" / "install.json").read_text()) == {"t": tag}
    assert os.readlink(Path(root) / "current") == "releases/v2"
    assert sorted(os.listdir(Path(root) / "releases")) == ["v2"]
    # The same tag again (a damaged release put back) goes to a folder of its own first.
    again = {
        "op": "install_tree",
        "root": root,
        "tag": "v2",
        "record": {"t": "v2"},
        "b64": tar_of({"lib/m.py": b"2"}),
    }
    agent_provision.apply_command({"ops": [again]})
    assert os.readlink(Path(root) / "current") == "releases/v2-1"
    assert sorted(os.listdir(Path(root) / "releases")) == ["v2-1"]
    bad = {"op": "install_tree", "root": root, "tag": "v3", "record": {}, "b64": tar_of({"../escape": b"x"})}
    with pytest.raises(AgentError, match="outside its folder"):
        agent_provision.apply_command({"ops": [bad]})
    assert not (tmp_path / "escape").exists() and os.readlink(Path(root) / "current") == "releases/v2-1"


def test_a_file_probe_can_leave_a_secret_unread(tmp_path: Path) -> None:
    key = tmp_path / "id"
    key.write_text("PRIVATE")
    found = agent_provision.probe_command(
        {"probes": {"k": {"kind": "file", "path": str(key), "content": False}}}
    )
    assert "text" not in found["results"]["k"] and found["results"]["k"]["size"] == 7


def test_cron_entry_records_its_last_run_and_gives_way_to_a_held_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(paths, "LOCK_DIR", str(tmp_path))
    monkeypatch.setattr(paths, "LOG_DIR", str(tmp_path))
    text = cron_file(CronParams(name="j", schedule="*/30 * * * *", command="echo 50% done; exit 3"))
    job = cronjobs.parse_job_file(text)
    assert (
        job["schedule"] == "*/30 * * * *"
        and job["command"] == "echo 50% done; exit 3"
        and job["user"] == "root"
    )
    rc = subprocess.run(["sh", "-c", job["line"]]).returncode
    assert rc == 3
    assert (tmp_path / "j.log").read_text() == "50% done\n"
    last = cronjobs.last_run("j")
    assert last is not None and last["rc"] == 3 and last["end"] > 0
    (tmp_path / "j.last").unlink()
    holder = subprocess.Popen(["flock", str(tmp_path / "j.lock"), "sleep", "30"])
    try:
        while subprocess.run(["flock", "-n", str(tmp_path / "j.lock"), "true"]).returncode == 0:
            pass  # until the holder has the lock
        assert subprocess.run(["sh", "-c", job["line"]]).returncode == 1
        assert cronjobs.last_run("j") is None  # the run that gave way records nothing
    finally:
        holder.kill()
        holder.wait()


def test_sim_hosts_have_their_own_root_ssh() -> None:
    assert "/root/.ssh" in {mp.path for mp in MANAGED_PATHS if not mp.is_file}


def test_cron_list_reads_cron_files_and_timers_and_only_labctls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cron_dir, unit_dir = tmp_path / "cron.d", tmp_path / "system"
    cron_dir.mkdir()
    unit_dir.mkdir()
    monkeypatch.setattr(cronjobs, "CRON_DIR", str(cron_dir))
    monkeypatch.setattr(cronjobs, "UNIT_DIR", str(unit_dir))
    monkeypatch.setattr(paths, "LOCK_DIR", str(tmp_path))
    facts = CronParams(name="facts", schedule="*/30 * * * *", command="labctl facts")
    rotate = CronParams(name="rotate", schedule="0 */4 * * *", command="labctl rotate")
    (cron_dir / "labctl-facts").write_text(cron_file(facts))
    service, timer = systemd_units(rotate)
    (unit_dir / "labctl-rotate.service").write_text(service)
    (unit_dir / "labctl-rotate.timer").write_text(timer)
    (cron_dir / "labctl-mine").write_text("* * * * * root true\n")  # someone else's, not marked
    (tmp_path / "rotate.last").write_text("0 1700000000\n")
    jobs = {j["name"]: j for j in cronjobs.list_command({})["jobs"]}
    assert set(jobs) == {"facts", "rotate"}
    assert (jobs["facts"]["backend"], jobs["facts"]["schedule"], jobs["facts"]["command"]) == (
        "cron",
        "*/30 * * * *",
        "labctl facts",
    )
    assert jobs["facts"]["last"] is None  # never ran
    assert (jobs["rotate"]["backend"], jobs["rotate"]["schedule"], jobs["rotate"]["command"]) == (
        "systemd",
        "0 */4 * * *",
        "labctl rotate",
    )
    assert jobs["rotate"]["last"] == {"rc": 0, "end": 1700000000}
