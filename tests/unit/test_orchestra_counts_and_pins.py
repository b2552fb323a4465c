"""The orchestra's counts (a one-model orchestra, fixes that pass), bare model names, `start`
with a pinned model that is not warm, and the words its tables and hints use. Pure: the seed
lab's files and agent answers as data."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from labctl.documents.validation import DocumentError
from labctl.inventory.load import load_inventory
from labctl.orchestra.decide import RotationPlan, decide
from labctl.orchestra.hoststate import HostView, Repair, find_repair
from labctl.orchestra.render import render_rotation, render_status
from labctl.orchestra.rotate import RotationResult, failed_start_hint, lacks_torch
from labctl.orchestra.spec import ModelEntry, Orchestra, load_orchestra, require_rotation
from labctl.orchestra.status import summarize
from labctl.output.errors import InputError

REPO = Path(__file__).resolve().parents[2]
FIX_RE = re.compile(r"`((?:warm|rotate|pinned): [^`]+)`")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "orchestra.yaml"
    path.write_text(text)
    return path


# --- counts -------------------------------------------------------------------------------------


def test_an_orchestra_of_one_model_that_nothing_rotates_is_valid(tmp_path: Path) -> None:
    orch = load_orchestra(write(tmp_path, "warm: 1\nrotate: 0\nmodels: [{name: a, size_gb: 4}]\n"))
    assert (orch.warm, orch.rotate, orch.names) == (1, 0, ["a"])


LIB3 = "models:\n  - {name: a, size_gb: 4}\n  - {name: b, size_gb: 4}\n  - {name: c, size_gb: 4}\n"


@pytest.mark.parametrize(
    "head",
    [
        "warm: 1\n",  # rotate's default 2 is not below 1: the issue's first error
        "warm: 1\nrotate: 1\n",
        "warm: 2\nrotate: 2\n",
        "warm: 3\nrotate: 5\n",
        "rotate: -1\nwarm: 2\n",
        "warm: 0\nrotate: 0\n",
        "warm: -3\n",
        "warm: 4\nrotate: 1\n",
        "warm: 7\nrotate: 3\n",  # the library has 3
        "warm: 2\nrotate: 1\npinned: [a, b, c]\n",
        "warm: 3\nrotate: 2\npinned: [a, b]\n",
        "warm: 2\nrotate: 1\npinned: [a, b]\n",
        "rotate: 0\n",  # warm's default 5 over a library of 3
    ],
)
def test_every_count_error_names_fixes_each_of_which_passes(tmp_path: Path, head: str) -> None:
    path = write(tmp_path, head + LIB3)
    with pytest.raises(DocumentError) as e:
        load_orchestra(path)
    problems = e.value.problems
    assert problems
    for _, field, message in problems:
        fixes = FIX_RE.findall(message)
        assert fixes, f"{field}: {message} names no fix"
        for fix in fixes:
            data = yaml.safe_load(head + LIB3)
            data.update(yaml.safe_load("{" + fix + "}"))
            fixed = write(tmp_path, yaml.safe_dump(data))
            load_orchestra(fixed)  # raises when the fix the error named does not pass


def test_the_issues_contradiction_is_gone_warm_1_names_rotate_0(tmp_path: Path) -> None:
    with pytest.raises(DocumentError) as e:
        load_orchestra(write(tmp_path, "warm: 1\nrotate: 1\nmodels: [{name: a, size_gb: 4}]\n"))
    assert "`rotate: 0`" in e.value.message and "`rotate: 2`" not in e.value.message


def test_scheduling_an_orchestra_that_rotates_nothing_says_there_is_nothing_to_rotate(tmp_path: Path) -> None:
    path = write(tmp_path, "warm: 2\nrotate: 0\n" + LIB3)
    with pytest.raises(InputError) as e:
        require_rotation(load_orchestra(path), path)
    assert "nothing to rotate" in e.value.message and e.value.exit_code == 2
    fix = re.search(r"`(warm: \d+, rotate: \d+)`", e.value.hint)
    assert fix is not None
    data = yaml.safe_load("warm: 2\nrotate: 0\n" + LIB3) | yaml.safe_load("{" + fix.group(1) + "}")
    require_rotation(load_orchestra(write(tmp_path, yaml.safe_dump(data))), path)  # the fix schedules


# --- bare names ---------------------------------------------------------------------------------


def test_a_model_written_as_its_bare_name_is_that_name_with_every_default(tmp_path: Path) -> None:
    orch = load_orchestra(
        write(tmp_path, "warm: 2\nrotate: 1\nmodels: [Llama-3.1-8B, {name: b, size_gb: 4}, c]\n")
    )
    assert orch.names == ["Llama-3.1-8B", "b", "c"]
    assert orch.model("Llama-3.1-8B") == ModelEntry(name="Llama-3.1-8B")


def test_a_bare_name_that_is_no_model_name_is_refused_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "warm: 1\nrotate: 0\nmodels:\n  - 'a b'\n")
    with pytest.raises(DocumentError) as e:
        load_orchestra(path)
    assert f"{path}:4: models[0].name:" in e.value.message and "not a model name" in e.value.message


# --- start with a pinned model; rotate 0 --------------------------------------------------------


def seed() -> tuple[Any, Orchestra, list[Any]]:
    inv = load_inventory(REPO / "inventory/lab.yaml")
    orch = load_orchestra(REPO / "playbooks/orchestra.yaml")
    return inv, orch, [inv.hosts["m5"]]


def warm_view(inv: Any, orch: Orchestra, hosts: list[Any], names: list[str]) -> HostView:
    """m5 answering with `names` warm (placed as a start would place them), none of them pinned."""
    empty = {"m5": HostView("m5", None, None, [], [])}
    unpinned = orch.model_copy(update={"pinned": []})
    first = decide(inv, unpinned, hosts, empty, {"m5": Repair("m5")}, "start", in_=names)
    at = {s.model: s for s in first.steps}
    models = [
        {
            "name": n,
            "gpu": at[n].gpu,
            "gpu_model": at[n].gpu_model,
            "gpu_source": at[n].gpu_source,
            "port": 9000 + i,
            "pid": 100 + i,
            "state": "loaded",
            "since": float(i),
            "memory_gb": at[n].memory_gb,
        }
        for i, n in enumerate(names)
    ]
    servers = [
        {"model": n, "pid": 100 + i, "pgid": 100 + i, "port": 9000 + i, "healthy": True}
        for i, n in enumerate(names)
    ]
    return HostView("m5", {"models": models, "warm_size": len(names), "cursor": names[-1]}, None, servers, [])


def test_start_brings_a_pinned_model_in_when_the_warm_set_is_full_without_it() -> None:
    inv, orch, hosts = seed()
    pinned = orch.pinned[0]
    names = [n for n in orch.names if n != pinned][: orch.warm]
    v = warm_view(inv, orch, hosts, names)
    plan = decide(inv, orch, hosts, {"m5": v}, {"m5": find_repair(v)}, "start")
    assert plan.joining == [pinned] and len(plan.leaving) == 1 and pinned not in plan.leaving
    assert plan.leaving == [names[0]]  # the least recently rotated in makes room
    assert "room for " + pinned in plan.choice.why[names[0]]  # type: ignore[union-attr]
    assert plan.after.where.keys() == {*names[1:], pinned}
    first, *_ = plan.steps
    assert first.action == "start" or first.mode == "break-before-make"  # make-before-break where it fits


def test_rotate_0_leaves_a_full_warm_set_alone_and_says_nothing_rotates() -> None:
    inv, orch, hosts = seed()
    names = orch.names[: orch.warm]
    v = warm_view(inv, orch, hosts, names)
    still = orch.model_copy(update={"rotate": 0})
    plan = decide(inv, still, hosts, {"m5": v}, {"m5": find_repair(v)}, "rotate")
    assert plan.steps == [] and "nothing rotates" in plan.reason


# --- words --------------------------------------------------------------------------------------


def rendered(plan: RotationPlan, orch: Orchestra, dry_run: bool = True) -> str:
    console = Console(record=True, width=200, color_system=None)
    render_rotation(console, RotationResult(plan.kind, plan, dry_run), orch)
    return console.export_text()


def test_a_declared_gpu_is_marked_in_start_rows_and_stop_rows_show_no_mode() -> None:
    inv, orch, hosts = seed()
    empty = {"m5": HostView("m5", None, None, [], [])}
    start = decide(inv, orch, hosts, empty, {"m5": Repair("m5")}, "start")
    assert {s.gpu_source for s in start.steps} == {"declared"}  # m5 reported no GPU
    text = rendered(start, orch)
    assert text.count("Tesla P40 (declared)") == len(start.steps)
    v = warm_view(inv, orch, hosts, orch.names[: orch.warm])
    stop = decide(inv, orch, hosts, {"m5": v}, {"m5": find_repair(v)}, "stop")
    assert stop.steps and all(s.action == "stop" and s.mode == "" for s in stop.steps)
    text = rendered(stop, orch)
    assert "make-before-break" not in text and "(declared)" in text
    rows = [line for line in text.splitlines() if line.startswith("stop │")]
    assert len(rows) == len(stop.steps) and all(line.rstrip().endswith(" -") for line in rows)


def test_status_names_a_pinned_model_that_is_not_warm_and_marks_declared_gpus() -> None:
    inv, orch, hosts = seed()
    pinned = orch.pinned[0]
    v = warm_view(inv, orch, hosts, [n for n in orch.names if n != pinned][: orch.warm])
    st = summarize({"m5": v}, 3600.0, orch.warm, pinned=orch.pinned)
    assert st.pinned_not_warm == [pinned] and st.to_json()["pinned_not_warm"] == [pinned]
    console = Console(record=True, width=200, color_system=None)
    render_status(console, st)
    text = console.export_text()
    assert f"pinned, not warm: {pinned}" in text and "labctl orchestra start" in text
    assert "Tesla P40 (declared)" in text
    full = summarize(
        {"m5": warm_view(inv, orch, hosts, orch.names[: orch.warm])}, 3600.0, orch.warm, pinned=orch.pinned
    )
    assert full.pinned_not_warm == []


def test_a_start_that_failed_for_want_of_torch_names_the_command_run_and_the_fixes() -> None:
    assert lacks_torch("RuntimeError: torch is not installed for /usr/bin/python3")
    assert lacks_torch("ModuleNotFoundError: No module named 'torch'") and not lacks_torch("CUDA OOM")
    hint = failed_start_hint("start", "m5", "tiny", False, "`labctl provision --tags torch_env --limit m5`")
    assert "`labctl orchestra start --python PATH`" in hint and "server.python: PATH" in hint
    assert "`labctl provision --tags torch_env --limit m5`" in hint
    assert "run `labctl orchestra start` again" in hint and "rotate again" not in hint
    other = failed_start_hint("rotate", "m5", "tiny", True)
    assert "/var/lib/labctl/orchestra/logs/tiny.log" in other and "run `labctl rotate` again" in other
    assert "minus the models stopped to make room" in other and "--python" not in other
