"""The layout rules README's Layout section states, checked on the source: a newcomer predicts
where a file goes from them, so a file that breaks one fails here instead of in review."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import labctl

PKG = Path(labctl.__file__).parent
ROOT_MODULES = {"__init__.py", "__main__.py"}


def _module(path: Path) -> str:
    parts = ["labctl", *path.relative_to(PKG).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Module -> the labctl modules it imports, anywhere in it (imports inside functions too)."""
    files = {_module(p): p for p in PKG.rglob("*.py")}
    out: dict[str, set[str]] = defaultdict(set)
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*parts, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            out[name] |= {t for t in targets if t in files and t != name}
    return out


def _cycles(edges: dict[str, set[str]], depth: int) -> list[tuple[str, str]]:
    """Pairs of units (the first `depth` parts of a module name) that import each other."""
    unit: dict[str, set[str]] = defaultdict(set)
    for src, targets in edges.items():
        a = ".".join(src.split(".")[:depth])
        for t in targets:
            b = ".".join(t.split(".")[:depth])
            # a package's __init__ and its own modules are one unit
            if a != b and not b.startswith(a + ".") and not a.startswith(b + "."):
                unit[a].add(b)
    return sorted((a, b) for a in unit for b in unit[a] if a < b and a in unit.get(b, ()))


def test_the_package_root_holds_packages_only() -> None:
    loose = sorted(p.name for p in PKG.glob("*.py") if p.name not in ROOT_MODULES)
    assert loose == [], f"modules at labctl/ root: {loose}; put each in the package of what it serves"


def test_no_two_features_import_each_other() -> None:
    edges = _imports()
    assert _cycles(edges, 2) == []  # labctl.<package>
    assert _cycles(edges, 3) == []  # labctl.agent.<package>, labctl.train.<package> ...
    assert _cycles(edges, 99) == []  # single modules


def test_the_agent_imports_nothing_from_the_controller() -> None:
    edges = _imports()
    reach = {t for src, ts in edges.items() if src.startswith("labctl.agent") for t in ts}
    assert sorted(t for t in reach if not t.startswith("labctl.agent")) == []


def test_every_agent_command_is_declared_by_one_feature_package_of_the_controllers_name() -> None:
    from labctl.agent import commands

    declared: dict[str, str] = {}
    for feature in commands.FEATURES:
        short = feature.__name__.rpartition(".")[2]
        assert (PKG / short / "__init__.py").is_file(), f"labctl/agent/{short} has no labctl/{short}"
        for name, entry in feature.COMMANDS.items():
            assert name not in declared, f"{name} declared by {declared[name]} and {short}"
            declared[name] = short
            module, _, attr = entry.partition(":")
            # the module is imported only when the command runs: resolve it here
            handler = getattr(importlib.import_module(module, feature.__name__), attr)
            assert callable(handler)
            assert commands.resolve(name) is handler
    packages = sorted(p.parent.name for p in (PKG / "agent").glob("*/__init__.py"))
    missing = [p for p in packages if hasattr(importlib.import_module(f"labctl.agent.{p}"), "COMMANDS")]
    assert sorted(missing) == sorted(f.__name__.rpartition(".")[2] for f in commands.FEATURES)
    # commands.py itself serves only what every host has: no feature's command
    assert set(commands.COMMANDS) - set(declared) == {"ping", "host_lock"}


def test_every_agent_command_declares_the_arguments_it_takes() -> None:
    """Each handler says its arguments with @takes (labctl/agent/argspec.py), so the agent
    checks them once on dispatch: no command is left unchecked."""
    from labctl.agent import argspec, commands

    unchecked = [
        name for name in sorted(commands.COMMANDS) if argspec.spec_of(commands.resolve(name)) is None
    ]
    assert unchecked == []


def test_the_inventory_contract_loads_without_any_feature(tmp_path: Path) -> None:
    inv = tmp_path / "lab.yaml"
    inv.write_text(
        "lab: shapes\n"
        "hosts:\n"
        "  box:\n"
        "    address: 127.0.0.1\n"
        "    connection: local\n"
        "    roles: [sandbox]\n"
        "    sandbox: {languages: [python, go]}\n"
    )
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from labctl.inventory.load import load_inventory\n"
        f"load_inventory(Path({str(inv)!r}))\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('labctl.'))))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(r.stdout)
    allowed = ("labctl.inventory", "labctl.documents", "labctl.agent")
    shared = {
        "labctl.output",
        "labctl.output.errors",
    }  # the package holds no feature: only its error type loads
    assert [m for m in loaded if not m.startswith(allowed) and m not in shared] == []
    assert "labctl.agent.sandbox.languages" not in loaded


def test_the_sandbox_recipes_are_the_languages_the_inventory_accepts() -> None:
    from labctl.agent.sandbox.languages import RECIPES
    from labctl.inventory.model import SANDBOX_LANGUAGES

    assert tuple(RECIPES) == SANDBOX_LANGUAGES
