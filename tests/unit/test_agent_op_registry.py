"""Each feature declares its own probe kinds and ops (labctl/agent/core/ops.py); `provision.probe`
and `provision.apply` dispatch over the merged tables."""

from __future__ import annotations

import importlib
import types
from pathlib import Path

import pytest

import labctl
from labctl.agent.core.errors import AgentError
from labctl.agent.core.ops import OpKind, ProbeKind, merge
from labctl.agent.provision import commands

# What provision.probe and provision.apply accepted before each feature declared its own: the
# names the controller sends, which a refactor must keep.
PROBE_NAMES = {
    "llama_cpp",
    "net_txn",
    "sandbox",
    "authorized_keys",
    "ids",
    "file",
    "mount",
    "meminfo",
    "command",
    "which",
    "system",
    "bond",
}
OP_NAMES = {
    "llama_cpp",
    "torch_env",
    "dockerd",
    "sandbox_image",
    "install_tree",
    "remove_tree",
    "write_file",
    "chmod",
    "mkdir",
    "remove",
    "run",
}


def test_the_merged_tables_hold_exactly_the_names_the_controller_sends() -> None:
    assert set(commands.PROBES) == PROBE_NAMES
    assert set(commands.OPS) == OP_NAMES


@pytest.mark.parametrize("table", ["PROBES", "OPS"])
def test_every_declared_kind_resolves_to_a_callable_in_its_own_package(table: str) -> None:
    for name, declared in getattr(commands, table).items():
        fn = declared.load()
        assert callable(fn), name
        assert declared.kind.doc, f"{name} has no doc"
        # The entry is resolved against the package that declared it, nowhere else.
        assert declared.module == importlib.util.resolve_name(
            declared.kind.entry.partition(":")[0], declared.package
        )
        assert fn is getattr(importlib.import_module(declared.module), declared.kind.entry.partition(":")[2])


def test_each_feature_owns_its_kinds() -> None:
    owner = {name: d.package.rpartition(".")[2] for name, d in commands.PROBES.items()}
    assert owner["bond"] == owner["net_txn"] == "network"
    assert owner["sandbox"] == "sandbox"
    assert owner["llama_cpp"] == owner["file"] == owner["ids"] == "provision"
    ops = {name: d.package.rpartition(".")[2] for name, d in commands.OPS.items()}
    assert ops["dockerd"] == ops["sandbox_image"] == "sandbox"
    assert ops["torch_env"] == ops["llama_cpp"] == ops["write_file"] == "provision"


def test_every_agent_package_that_declares_kinds_is_dispatched() -> None:
    """A feature that declares PROBES or OPS but is missing from the dispatch's FEATURES would
    have its kinds refused as unknown on every host."""
    pkg = Path(labctl.__file__).parent / "agent"
    declaring = set()
    for init in pkg.glob("*/__init__.py"):
        module = importlib.import_module(f"labctl.agent.{init.parent.name}")
        if hasattr(module, "PROBES") or hasattr(module, "OPS"):
            declaring.add(module.__name__)
    assert declaring == {f.__name__ for f in commands.FEATURES}


def _feature(name: str, **tables: object) -> types.ModuleType:
    module = types.ModuleType(name)
    for attr, value in tables.items():
        setattr(module, attr, value)
    return module


def test_a_name_declared_by_two_features_is_refused_naming_both() -> None:
    a = _feature("labctl.agent.a", OPS=(OpKind("sync", ".x:sync_op", "one"),))
    b = _feature("labctl.agent.b", OPS=(OpKind("sync", ".y:sync_op", "two"),))
    with pytest.raises(
        ValueError, match=r"op 'sync' is declared by both labctl\.agent\.a and labctl\.agent\.b"
    ):
        merge((a, b), "OPS")
    p = _feature("labctl.agent.p", PROBES=(ProbeKind("bond", ".x:f"),))
    q = _feature("labctl.agent.q", PROBES=(ProbeKind("bond", ".y:f"),))
    with pytest.raises(ValueError, match="probe 'bond' is declared by both"):
        merge((p, q), "PROBES")
    # The same name as a probe and as an op is two tables, not a clash (llama_cpp is both).
    both = _feature("labctl.agent.c", PROBES=(ProbeKind("z", ".x:f"),), OPS=(OpKind("z", ".x:g"),))
    assert set(merge((both,), "PROBES")) == set(merge((both,), "OPS")) == {"z"}


def test_a_kind_of_the_wrong_type_or_a_bad_entry_is_refused_when_merged() -> None:
    wrong = _feature("labctl.agent.w", OPS=(ProbeKind("x", ".m:f"),))
    with pytest.raises(ValueError, match="not a OpKind"):
        merge((wrong,), "OPS")
    bad = _feature("labctl.agent.w", PROBES=(ProbeKind("x", ".m.f"),))
    with pytest.raises(ValueError, match="not 'module:function'"):
        merge((bad,), "PROBES")


def test_an_entry_is_imported_only_when_its_kind_runs() -> None:
    # A module that does not exist breaks the merge of nothing: only the kind that names it.
    ghost = _feature("labctl.agent.provision", PROBES=(ProbeKind("ghost", ".no_such_module:f", "none"),))
    table = merge((ghost,), "PROBES")
    with pytest.raises(ModuleNotFoundError):
        table["ghost"].load()


def test_a_kind_whose_module_fails_to_import_fails_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    table = merge(
        (_feature("labctl.agent.provision", PROBES=(ProbeKind("ghost", ".no_such_module:f", "none"),)),),
        "PROBES",
    )
    monkeypatch.setitem(commands.PROBES, "ghost", table["ghost"])
    out = commands.probe_command({"probes": {"g": {"kind": "ghost"}, "w": {"kind": "which", "name": "sh"}}})
    assert out["results"]["g"]["error"].startswith("ModuleNotFoundError")
    assert out["results"]["w"]["path"]


def test_an_unknown_probe_kind_answers_an_error_and_the_others_still_run() -> None:
    out = commands.probe_command({"probes": {"x": {"kind": "nope"}, "m": {"kind": "meminfo"}}})
    assert out["results"]["x"] == {"error": "unknown probe kind 'nope'"}
    assert out["results"]["m"]["total_bytes"] > 0


def test_an_unknown_op_is_refused_as_bad_args_before_it_runs_anything(tmp_path: Path) -> None:
    made = tmp_path / "made"
    with pytest.raises(AgentError) as err:
        commands.apply_command({"ops": [{"op": "nope"}, {"op": "mkdir", "path": str(made)}]})
    assert err.value.kind == "bad_args"
    assert err.value.message == "unknown op 'nope'"
    assert not made.exists()


def test_an_op_from_a_feature_package_runs_through_the_dispatch(tmp_path: Path) -> None:
    target = tmp_path / "f"
    out = commands.apply_command(
        {
            "ops": [
                {"op": "write_file", "path": str(target), "text": "hi"},
                {"op": "chmod", "path": str(target), "mode": 0o600},
            ]
        }
    )
    assert target.read_text() == "hi" and (target.stat().st_mode & 0o777) == 0o600
    assert out["done"] == [f"wrote {target} (2 bytes)", f"set mode 600 on {target}"]


@pytest.mark.parametrize("command", ["provision.probe", "provision.apply"])
def test_the_in_memory_agent_carries_every_module_a_kind_names(command: str) -> None:
    """Entries are strings no import shows: agent_blob must still ship their modules, or a
    `provision --check` before the agent is cached fails for that kind only."""
    import base64
    import io
    import zipfile
    import zlib

    from labctl.hosts.agent_ship import agent_blob

    names = set(
        zipfile.ZipFile(io.BytesIO(zlib.decompress(base64.b64decode(agent_blob(command))))).namelist()
    )
    for table in (commands.PROBES, commands.OPS):
        for name, declared in table.items():
            assert declared.module.replace(".", "/") + ".py" in names, (name, declared.module)
