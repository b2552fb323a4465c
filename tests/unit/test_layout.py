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


def _units(edges: dict[str, set[str]], depth: int) -> dict[str, set[str]]:
    """The import graph between units: the first `depth` parts of a module name."""
    unit: dict[str, set[str]] = defaultdict(set)
    for src, targets in edges.items():
        a = ".".join(src.split(".")[:depth])
        for t in targets:
            b = ".".join(t.split(".")[:depth])
            # a package's __init__ and its own modules are one unit
            if a != b and not b.startswith(a + ".") and not a.startswith(b + "."):
                unit[a].add(b)
    return unit


def _cycles(edges: dict[str, set[str]], depth: int) -> list[list[str]]:
    """Every import circle between units, as its strongly connected component (Tarjan's):
    A -> B -> C -> A is one component [A, B, C], found however long the circle is."""
    graph = _units(edges, depth)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        # iterative: a deep import chain must not hit Python's recursion limit
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for v in sorted(set(graph) | {t for ts in graph.values() for t in ts}):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_cycle_finder_sees_a_circle_of_three_not_only_pairs() -> None:
    edges = {"x.a.m": {"x.b.m"}, "x.b.m": {"x.c.m"}, "x.c.m": {"x.a.m"}, "x.d.m": {"x.a.m"}}
    assert _cycles(edges, 2) == [["x.a", "x.b", "x.c"]]
    assert _cycles({"x.a.m": {"x.b.m"}, "x.b.m": {"x.c.m"}}, 2) == []


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


def test_every_agent_command_is_named_for_the_feature_package_that_declares_it() -> None:
    """`cache.state` is `state` in labctl/agent/cache/; a feature's agent package is named like
    its controller package, so a command's name says where both halves live."""
    from labctl.agent import commands

    expected: dict[str, object] = {}
    for feature in commands.FEATURES:
        short = feature.__name__.rpartition(".")[2]
        assert (PKG / short / "__init__.py").is_file(), f"labctl/agent/{short} has no labctl/{short}"
        for name, entry in feature.COMMANDS.items():
            assert "." not in name and name.isidentifier(), f"{short}: command {name!r} is not a plain name"
            module, _, attr = entry.partition(":")
            # the module is imported only when the command runs: resolve it here
            handler = getattr(importlib.import_module(module, feature.__name__), attr)
            assert callable(handler)
            expected[f"{short}.{name}"] = handler
    for name, handler in expected.items():
        assert commands.resolve(name) is handler
    packages = sorted(p.parent.name for p in (PKG / "agent").glob("*/__init__.py"))
    with_commands = [p for p in packages if hasattr(importlib.import_module(f"labctl.agent.{p}"), "COMMANDS")]
    assert sorted(with_commands) == sorted(f.__name__.rpartition(".")[2] for f in commands.FEATURES)
    # commands.py itself serves only what every host has: no feature's command
    assert set(commands.COMMANDS) - set(expected) == {"ping"}


def test_the_agent_package_holds_its_entry_points_and_packages_only() -> None:
    """Shared host code lives in labctl/agent/core/ (ansible's module_utils), a feature's in its
    package: nothing else lies loose beside the command table."""
    loose = sorted(p.name for p in (PKG / "agent").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "commands.py"]


def test_the_agent_core_imports_no_feature() -> None:
    edges = _imports()
    out = {
        t
        for src, ts in edges.items()
        if src.startswith("labctl.agent.core")
        for t in ts
        if not t.startswith("labctl.agent.core") and t != "labctl.agent"
    }
    assert sorted(out) == []


def test_every_agent_command_declares_the_arguments_it_takes() -> None:
    """Each handler says what it takes and what it answers with @command (labctl/agent/core/spec.py),
    so the agent checks its args once on dispatch and the controller checks its answer: no command
    is left unchecked either way."""
    from labctl.agent import commands
    from labctl.agent.core import spec

    unchecked = [name for name in sorted(commands.COMMANDS) if spec.spec_of(commands.resolve(name)) is None]
    assert unchecked == []
    for name in commands.COMMANDS:
        declared = spec.spec_of(commands.resolve(name))
        assert declared is not None and isinstance(declared.takes, spec.Takes), name
        assert declared.answers is not None and spec.malformed(declared.answers) is None, name


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
