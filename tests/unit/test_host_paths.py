"""labctl's files on a host: one module names them, and both the controller and the agent use it."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.core import paths
from labctl.agent.facts import collect as facts
from labctl.agent.train import host as train_host
from labctl.hosts.agent_ship import agent_dir
from labctl.inventory.model import Host
from labctl.provision.resources.torch_env import TorchEnv
from labctl.train.launch import host_log_dir

PKG = Path(__file__).resolve().parents[2] / "labctl"


def test_agent_dir_is_labctls_home_for_root_and_the_users_cache_otherwise() -> None:
    assert agent_dir(Host(name="a", address="10.0.0.1", user="root")) == "/var/lib/labctl/agent"
    # Relative: the SSH session starts in the user's home, wherever that is.
    assert agent_dir(Host(name="b", address="10.0.0.2", user="alice")) == ".cache/labctl/agent"
    local = agent_dir(Host(name="c", address="127.0.0.1", connection="local"))
    assert local == str(Path.home() / ".cache/labctl/agent")


def test_run_logs_follow_the_same_rule() -> None:
    assert host_log_dir(Host(name="a", address="10.0.0.1", user="root"), "r1") == "/var/lib/labctl/runs/r1"
    assert host_log_dir(Host(name="b", address="10.0.0.2", user="bob"), "r1") == ".cache/labctl/runs/r1"


def test_torch_record_written_by_provision_is_the_one_facts_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "torch.json"
    record.write_text(json.dumps({"version": "2.13.0", "build": "cpu"}))
    monkeypatch.setattr(paths, "TORCH_ENV_RECORD", str(record))
    resource: Any = TorchEnv.from_playbook(Host(name="m5", address="10.0.0.1"), {})
    assert resource.probes()["record"]["path"] == str(record)
    assert facts.torch_env_facts() == {"version": "2.13.0", "build": "cpu", "provisioned": True}


def test_warm_state_read_by_the_preflight_is_the_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    warm = tmp_path / "warm.json"
    warm.write_text(json.dumps({"models": [{"name": "m", "gpu": 0, "state": "loaded"}]}))
    monkeypatch.setattr(paths, "WARM_STATE", str(warm))
    got = train_host.orchestra_state()
    assert got["present"] and got["path"] == str(warm) and got["state"]["models"][0]["name"] == "m"


def test_no_module_spells_out_labctls_host_folder_but_the_paths_module() -> None:
    offenders = [
        str(f.relative_to(PKG))
        for f in PKG.rglob("*.py")
        if f.name != "paths.py" and ("/var/lib/labctl" in f.read_text() or ".cache/labctl" in f.read_text())
    ]
    assert offenders == []


def test_agent_imports_only_the_standard_library_and_itself() -> None:
    """The agent runs with the host's own python3: a third-party import would break it there.
    What a model's own process needs (torch, transformers...) is imported inside the functions
    that run in that process (the model server, the model makers), never at a module's top."""
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    # Optional on a host: used only where the host has them (a torch_env, the `hf` extra).
    in_functions = {"torch", "pynvml", "transformers", "tokenizers", "numpy", "gguf", "safetensors"}
    bad = []
    for f in (PKG / "agent").rglob("*.py"):
        tree = ast.parse(f.read_text())
        top_level = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in allowed or name.startswith("labctl.agent"):
                    continue
                if top in in_functions and id(node) not in top_level:
                    continue
                bad.append(f"{f.name}: {name}")
    assert bad == []
