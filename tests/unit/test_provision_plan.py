"""Pure planning code of the provision resources and playbooks: no host needed."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from labctl.documents.validation import DocumentError
from labctl.inventory.load import load_inventory
from labctl.inventory.model import GPU, Host, Inventory, ModelCache
from labctl.output.errors import InputError
from labctl.provision.engine import entries_for_hosts, wanted
from labctl.provision.playbook import Entry, load_playbook, play_members
from labctl.provision.resource import NotApplicable, PlanError
from labctl.provision.resources.cron import Cron, CronParams, cron_file, on_calendar
from labctl.provision.resources.files import File, edit_lines, plan_file
from labctl.provision.resources.model_cache import GIB, edit_fstab
from labctl.provision.resources.model_cache import ModelCache as ModelCacheRes
from labctl.provision.resources.package import installed_from_dpkg
from labctl.provision.resources.torch_env import TorchEnv, choose_build, declared_caps
from labctl.sim.plan import host_names, inventory_doc, plan_hosts, seed_hosts

REPO = Path(__file__).resolve().parents[2]


def host(**kw: Any) -> Host:
    return Host(name=kw.pop("name", "m5"), address="10.0.0.1", **kw)


def cache_host(size_gb: float = 4) -> Host:
    return host(model_cache=ModelCache(path="/mnt/model-cache", size_gb=size_gb))


def cache_state(**over: Any) -> dict[str, dict[str, Any]]:
    state: dict[str, dict[str, Any]] = {
        "mount": {"mounted": False},
        "mem": {"total_bytes": 32 * GIB, "available_bytes": 30 * GIB},
        "fstab": {"exists": True, "text": "UUID=abc / ext4 defaults 0 1\n", "mode": 0o644},
        "manifest": {"exists": False},
    }
    state.update(over)
    return state


# --- model_cache ---------------------------------------------------------------------------


def test_model_cache_unmounted_plans_mount_fstab_and_manifest() -> None:
    res = ModelCacheRes.from_playbook(cache_host(), {})
    change = res.plan(cache_state())
    ops = [(op["op"], op.get("argv", op.get("path"))) for op in change.ops]
    assert (
        "run",
        ["mount", "-t", "tmpfs", "-o", "size=4G,mode=0755,nosuid,nodev", "tmpfs", "/mnt/model-cache"],
    ) in ops
    fstab_op = next(op for op in change.ops if op["op"] == "write_file")
    assert fstab_op["path"] == "/etc/fstab" and fstab_op["backup"] == "/var/lib/labctl/backup/fstab"
    assert fstab_op["text"].count("/mnt/model-cache") == 2  # marker + entry
    assert fstab_op["text"].startswith("UUID=abc / ext4")  # the rest kept
    assert ops[-1] == ("mkdir", "/mnt/model-cache/.labctl")
    assert "+tmpfs /mnt/model-cache tmpfs size=4G" in change.diffs[0]


def test_model_cache_in_place_is_no_change() -> None:
    res = ModelCacheRes.from_playbook(cache_host(), {})
    fstab = edit_fstab(
        "UUID=abc / ext4 defaults 0 1\n",
        "/mnt/model-cache",
        "tmpfs /mnt/model-cache tmpfs size=4G,mode=0755,nosuid,nodev 0 0",
    )
    state = cache_state(
        mount={"mounted": True, "fstype": "tmpfs", "size_bytes": 4 * GIB, "used_bytes": GIB},
        fstab={"exists": True, "text": fstab},
        manifest={"exists": True, "is_dir": True},
    )
    assert not res.plan(state).changed


def test_model_cache_grows_with_remount_but_never_shrinks_below_contents() -> None:
    mounted = {"mounted": True, "fstype": "tmpfs", "size_bytes": 2 * GIB, "used_bytes": GIB}
    change = ModelCacheRes.from_playbook(cache_host(4), {}).plan(cache_state(mount=mounted))
    assert {"op": "run", "argv": ["mount", "-o", "remount,size=4G", "/mnt/model-cache"]} in change.ops
    full = {"mounted": True, "fstype": "tmpfs", "size_bytes": 8 * GIB, "used_bytes": 6 * GIB}
    with pytest.raises(PlanError, match="would lose models"):
        ModelCacheRes.from_playbook(cache_host(4), {}).plan(cache_state(mount=full))
    # Shrinking to a size that still holds what is cached is fine.
    change = ModelCacheRes.from_playbook(cache_host(7), {}).plan(cache_state(mount=full))
    assert any(
        "remount,size=7G" in op.get("argv", [""])[2]
        for op in change.ops
        if op["op"] == "run" and len(op["argv"]) > 2
    )


def test_model_cache_refuses_a_size_that_starves_the_host() -> None:
    res = ModelCacheRes.from_playbook(cache_host(200), {"reserve_gb": 8})
    with pytest.raises(PlanError) as err:
        res.plan(cache_state())
    assert "200 GiB" in err.value.message and "reserve" in err.value.message
    assert "at most 24" in err.value.hint  # 32 GiB RAM - 8 GiB reserve


def test_model_cache_refuses_other_filesystems_and_foreign_fstab_lines() -> None:
    res = ModelCacheRes.from_playbook(cache_host(), {})
    with pytest.raises(PlanError, match="not a tmpfs"):
        res.plan(cache_state(mount={"mounted": True, "fstype": "ext4", "device": "/dev/sdb1"}))
    with pytest.raises(PlanError, match="line 2 already mounts"):
        res.plan(
            cache_state(fstab={"exists": True, "text": "# x\n/dev/sdb1 /mnt/model-cache ext4 defaults 0 2\n"})
        )


def test_edit_fstab_keeps_one_marked_entry() -> None:
    once = edit_fstab("a b c\n", "/mnt/c", "tmpfs /mnt/c tmpfs size=1G 0 0")
    twice = edit_fstab(once, "/mnt/c", "tmpfs /mnt/c tmpfs size=1G 0 0")
    resized = edit_fstab(once, "/mnt/c", "tmpfs /mnt/c tmpfs size=3G 0 0")
    assert once == twice
    assert resized.count("/mnt/c tmpfs") == 1 and "size=3G" in resized and resized.startswith("a b c\n")
    # A line another tool appends after ours stays where it is, and ours is not moved.
    appended = once + "tmpfs /mnt/other tmpfs size=1G 0 0\n"
    assert edit_fstab(appended, "/mnt/c", "tmpfs /mnt/c tmpfs size=1G 0 0") == appended


def test_model_cache_without_inventory_entry_is_not_applicable() -> None:
    with pytest.raises(NotApplicable):
        ModelCacheRes.from_playbook(host(), {})


# --- cron ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "calendar"),
    [
        ("0 */4 * * *", "*-*-* 00/4:00:00"),
        ("*/30 * * * *", "*-*-* *:00/30:00"),
        ("15 3 * * 1-5", "Mon..Fri *-*-* 03:15:00"),
        ("0 0 1 * *", "*-*-01 00:00:00"),
        ("5,35 8-18 * 1,7 0", "Sun *-01,07-* 08..18:05,35:00"),
    ],
)
def test_cron_to_systemd_calendar(cron: str, calendar: str) -> None:
    assert on_calendar(cron) == calendar


@pytest.mark.parametrize("bad", ["* * * *", "61 * * * *", "* 24 * * *", "a * * * *", "* * 0 * *"])
def test_bad_schedules_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        CronParams(name="x", schedule=bad, command="true")


def cron_state(systemd: bool = False, **files: dict[str, Any]) -> dict[str, dict[str, Any]]:
    state: dict[str, dict[str, Any]] = {k: {"exists": False} for k in ("cron", "service", "timer")}
    state.update(
        system={"systemd": systemd}, logdir={"is_dir": True}, lockdir={"is_dir": True}, enabled={"stdout": ""}
    )
    state.update(files)
    return state


def test_cron_job_is_one_marked_file_with_flock() -> None:
    p = CronParams(name="rotate", schedule="0 */4 * * *", command="labctl rotate")
    text = cron_file(p)
    assert text.startswith("# labctl:cron:rotate")
    assert (
        "0 */4 * * * root flock -n /var/lib/labctl/locks/rotate.lock sh -c 'labctl rotate' >>/var/log/labctl/rotate.log 2>&1"
        in text
    )
    res = Cron(host(), p)
    change = res.plan(cron_state())
    assert [op["path"] for op in change.ops] == ["/etc/cron.d/labctl-rotate"]
    assert not res.plan(cron_state(cron={"exists": True, "text": text, "mode": 0o644})).changed
    gone = Cron(host(), CronParams(name="rotate", state="absent")).plan(
        cron_state(cron={"exists": True, "text": text})
    )
    assert gone.ops == [{"op": "remove", "path": "/etc/cron.d/labctl-rotate"}]


def test_cron_uses_a_systemd_timer_where_systemd_runs() -> None:
    res = Cron(host(), CronParams(name="rotate", schedule="0 */4 * * *", command="labctl rotate"))
    change = res.plan(cron_state(systemd=True))
    paths = [op.get("path") for op in change.ops if op["op"] == "write_file"]
    assert paths == ["/etc/systemd/system/labctl-rotate.service", "/etc/systemd/system/labctl-rotate.timer"]
    timer = next(op["text"] for op in change.ops if op.get("path", "").endswith(".timer"))
    assert "OnCalendar=*-*-* 00/4:00:00" in timer
    assert change.ops[-1] == {"op": "run", "argv": ["systemctl", "enable", "--now", "labctl-rotate.timer"]}


# --- torch_env ---------------------------------------------------------------------------------

M5_GPUS = [
    GPU(model="Tesla V100", memory_gb=32, compute_capability="7.0"),
    GPU(model="Tesla P40", memory_gb=24, count=4),
]


def test_torch_build_auto_picks_one_that_runs_on_every_gpu() -> None:
    m5 = declared_caps(host(gpus=M5_GPUS))
    assert m5.count(("Tesla P40", (6, 1))) == 4  # P40's capability found from its name
    assert choose_build("2.13.0", "auto", m5) == "cu126"  # Pascal and Volta only in the 12.6 builds
    rtx = declared_caps(host(gpus=[GPU(model="GeForce RTX 3050", memory_gb=8)]))
    assert choose_build("2.13.0", "auto", rtx) == "cu130"
    assert choose_build("2.13.0", "auto", []) == "cpu"


def test_torch_build_that_lacks_an_architecture_is_refused_with_the_fix() -> None:
    with pytest.raises(PlanError) as err:
        choose_build("2.13.0", "cu128", declared_caps(host(gpus=M5_GPUS)))
    assert "Tesla P40 (sm_61)" in err.value.message and "Tesla V100 (sm_70)" in err.value.message
    assert "cuda: cu126" in err.value.hint
    with pytest.raises(PlanError, match="unused"):
        choose_build("2.13.0", "cpu", declared_caps(host(gpus=M5_GPUS)))
    with pytest.raises(PlanError, match="no cu126 build"):
        choose_build("2.5.0", "cu126", [])


def test_torch_env_plan_and_no_change_when_recorded() -> None:
    res = TorchEnv.from_playbook(host(gpus=M5_GPUS), {"version": "2.13.0"})
    state: dict[str, dict[str, Any]] = {"gpus": {"rc": 127, "stdout": ""}, "record": {"exists": False}}
    change = res.plan(state)
    pip = change.ops[0]["pip"]
    assert pip[-2:] == ["--index-url", "https://download.pytorch.org/whl/cu126"]
    assert "torch==2.13.0" in pip
    record = '{"version": "2.13.0+cu126", "python": "/var/lib/labctl/envs/torch-2.13.0-cu126/bin/python"}'
    assert not res.plan({**state, "record": {"exists": True, "text": record}}).changed


def test_found_gpus_win_over_declared_ones() -> None:
    res = TorchEnv.from_playbook(host(gpus=M5_GPUS), {"cuda": "cu128"})
    # The host really has an A100: cu128 fits it, whatever the inventory says.
    change = res.plan(
        {"gpus": {"rc": 0, "stdout": "NVIDIA A100-SXM4-40GB, 8.0\n"}, "record": {"exists": False}}
    )
    assert change.changed


# --- file, line, package -----------------------------------------------------------------------


def test_file_plans_create_update_mode_and_remove() -> None:
    assert plan_file("/x", "a\n", {"exists": False}).summary == ["create /x"]
    assert plan_file("/x", "a\n", {"exists": True, "text": "b\n"}).summary == ["update /x"]
    assert not plan_file("/x", "a\n", {"exists": True, "text": "a\n", "mode": 0o644}, mode=0o644).changed
    chmod = plan_file("/x", "a\n", {"exists": True, "text": "a\n", "mode": 0o600}, mode=0o644)
    assert chmod.ops == [{"op": "chmod", "path": "/x", "mode": 0o644}]
    assert plan_file("/x", None, {"exists": True, "text": "a\n"}).ops == [{"op": "remove", "path": "/x"}]
    with pytest.raises(PlanError, match="directory"):
        plan_file("/x", "a", {"exists": True, "is_dir": True})


def test_file_template_uses_host_values() -> None:
    res = File.from_playbook(
        host(roles=["train", "cache"]), {"path": "/f", "content": "H=$name R=$roles", "template": True}
    )
    assert (
        res.plan({"file": {"exists": False}, "parent": {"is_dir": True}}).ops[0]["text"]
        == "H=m5 R=train,cache"
    )


def test_file_creates_its_missing_folder_first() -> None:
    res = File.from_playbook(host(), {"path": "/var/lib/labctl/bench/host.txt", "content": "x"})
    change = res.plan({"file": {"exists": False}, "parent": {"exists": False}})
    assert change.ops[0] == {"op": "mkdir", "path": "/var/lib/labctl/bench", "mode": 0o755}
    assert change.ops[1]["op"] == "write_file"
    assert change.summary[0] == "create the folder /var/lib/labctl/bench"
    with pytest.raises(PlanError, match="not a folder"):
        res.plan({"file": {"exists": False}, "parent": {"exists": True, "is_dir": False}})


def test_edit_lines() -> None:
    assert edit_lines("a\nb\n", "c", None, True) == "a\nb\nc\n"
    assert edit_lines("a\nc\n", "c", None, True) == "a\nc\n"
    assert edit_lines("x=1\ny=2\n", "x=5", r"^x=", True) == "x=5\ny=2\n"
    assert edit_lines("x=1\ny=2\n", None, r"^x=", False) == "y=2\n"


def test_dpkg_status_parsing() -> None:
    text = "rsync install ok installed\niperf3 deinstall ok config-files\nlibc6:amd64 install ok installed\n"
    assert installed_from_dpkg(text) == {"rsync", "libc6"}


# --- playbooks ---------------------------------------------------------------------------------


def test_seed_playbook_is_valid() -> None:
    book = load_playbook(REPO / "playbooks" / "provision.yaml")
    kinds = [e.type_name for p in book.plays for e in p.entries]
    assert kinds == ["file", "cron", "model_cache", "torch_env"]
    assert [p.hosts for p in book.plays] == ["all", "role:cache", "role:train"]


BAD = [
    (
        "plays:\n  - hosts: all\n    resources:\n      - modle_cache: {}\n",
        4,
        "plays[0].resources[0]",
        "Did you mean 'model_cache'",
    ),
    (
        "plays:\n  - hosts: all\n    resources:\n      - cron: {name: x, schedule: '* * *', command: 'true'}\n",
        4,
        "plays[0].resources[0].cron.schedule",
        "needs 5 fields",
    ),
    (
        "plays:\n  - hosts: all\n    resources:\n      - file: {path: /x, content: y, mdoe: '0644'}\n",
        4,
        "plays[0].resources[0].file.mdoe",
        "Did you mean 'mode'",
    ),
    ("plays:\n  - hosts: all\n    resourcs: []\n", 3, "plays[0].resourcs", "Did you mean 'resources'"),
    (
        "plays:\n  - hosts: all\n    resources:\n      - file: {path: relative, content: y}\n",
        4,
        "plays[0].resources[0].file.path",
        "absolute",
    ),
    ("plays: []\n", 1, "plays", "at least one play"),
]


@pytest.mark.parametrize(("text", "line", "field", "words"), BAD)
def test_bad_playbooks_name_file_line_field(
    tmp_path: Path, text: str, line: int, field: str, words: str
) -> None:
    p = tmp_path / "book.yaml"
    p.write_text(textwrap.dedent(text))
    with pytest.raises(InputError) as err:
        load_playbook(p)
    assert err.value.exit_code == 2
    assert f"{p}:{line}: {field}:" in err.value.message, err.value.message
    assert words in err.value.message


def test_tags_select_by_type_and_tag() -> None:
    e = Entry("model_cache", {}, ["cache"], 1)
    assert wanted(e, set(), set()) and wanted(e, {"model_cache"}, set()) and wanted(e, {"cache", "x"}, set())
    assert not wanted(e, {"cron"}, set()) and not wanted(e, set(), {"cache"})


# --- play selectors ----------------------------------------------------------------------------

SEED_BOOK = REPO / "playbooks" / "provision.yaml"


def seed_inventory() -> Inventory:
    return load_inventory(REPO / "inventory" / "lab.yaml")


def book_with(tmp_path: Path, *selectors: str) -> Path:
    plays = "".join(
        f"  - hosts: '{sel}'\n    resources:\n      - file: {{path: /p{i}, content: x}}\n"
        for i, sel in enumerate(selectors)
    )
    p = tmp_path / "book.yaml"
    p.write_text("plays:\n" + plays)
    return p


@pytest.mark.parametrize(
    ("selector", "term"),
    [("role:trian", "role:trian"), ("m6", "m6"), ("m5,irnia", "irnia"), ("!m6", "!m6")],
)
def test_a_mistyped_play_selector_names_file_line_and_term(tmp_path: Path, selector: str, term: str) -> None:
    p = book_with(tmp_path, "all", selector)
    inv = seed_inventory()
    with pytest.raises(DocumentError) as err:
        entries_for_hosts(list(inv.hosts.values()), load_playbook(p), inv, set(), set())
    assert err.value.exit_code == 2
    message = err.value.message
    assert message.startswith(f"The playbook {p} has 1 problem:\n")
    assert f"{p}:5: plays[1].hosts: '{term}' matches no host in {inv.path}." in message, message
    assert "Roles (use role:NAME): train," in message
    assert f"provision -p {p} --check" in err.value.hint  # this playbook, not the default


def test_every_mistyped_selector_is_reported_at_once(tmp_path: Path) -> None:
    p = book_with(tmp_path, "role:trian", "all", "m6")
    with pytest.raises(DocumentError) as err:
        play_members(load_playbook(p), seed_inventory())
    assert [(line, field) for line, field, _ in err.value.problems] == [
        (2, "plays[0].hosts"),
        (8, "plays[2].hosts"),
    ]


def test_correct_selectors_pick_their_hosts(tmp_path: Path) -> None:
    book = load_playbook(book_with(tmp_path, "role:train", "irina,pharaoh", "!workstation", "m*"))
    members = play_members(book, seed_inventory())
    assert members == [{"m5"}, {"irina", "pharaoh"}, {"m5", "irina", "pharaoh"}, {"m5"}]


def test_limit_narrowing_to_hosts_outside_a_play_is_not_an_error(tmp_path: Path) -> None:
    inv = seed_inventory()
    book = load_playbook(book_with(tmp_path, "role:train", "irina"))
    plan = entries_for_hosts([inv.hosts["pharaoh"]], book, inv, set(), set())
    assert plan == {"pharaoh": []}
    plan = entries_for_hosts([inv.hosts["irina"]], book, inv, set(), set())
    assert [e.params["path"] for e in plan["irina"]] == ["/p1"]


@pytest.mark.parametrize(
    ("names", "count"),
    [
        (None, None),
        (None, 16),
        (["m5", "irina"], None),
    ],  # conftest's lab, bench/provision_nochange, bench/cache_sync
)
def test_seed_playbook_selects_hosts_in_the_seed_and_simulated_labs(
    tmp_path: Path, names: list[str] | None, count: int | None
) -> None:
    import yaml

    book = load_playbook(SEED_BOOK)
    assert [len(m) for m in play_members(book, seed_inventory())] == [4, 1, 1]
    seed = seed_hosts(yaml.safe_load((REPO / "labctl" / "data" / "lab.yaml").read_text()))
    doc = inventory_doc(
        plan_hosts(host_names(names, count), "10.250.0.0/24"), "10.250.0.0/24", "python3", seed
    )
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id_ed25519").write_text("")
    all_hosts, cache, train = play_members(book, load_inventory(path))
    assert len(all_hosts) == len(doc["hosts"]) and cache == train == {"m5"}


def test_cli_exits_2_on_a_mistyped_selector_before_touching_a_host(tmp_path: Path) -> None:
    import subprocess
    import sys

    p = book_with(tmp_path, "role:trian")
    inv = str(REPO / "inventory" / "lab.yaml")
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", "-i", inv, "provision", "-p", str(p), "--check"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{p}:2: plays[0].hosts: 'role:trian' matches no host" in proc.stderr
