"""What a newcomer reads and types first: shell completion, the training settings, facts' units,
install hints that run as written, and no citation of documents a user does not have."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_ux import run_cli

REPO = Path(__file__).resolve().parents[2]
# A seed document by number or path, a section sign, the design brief outside the repository.
CITATION = re.compile(r"seeds/|[Ss]eed 0\d\d|§|\.\./shared|DESIGN\.md")


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_the_bash_completion_script_sources_and_completes_commands_and_subcommands(tmp_path: Path) -> None:
    shown = run_cli("--show-completion", "bash")
    assert shown.returncode == 0, shown.stderr
    script = tmp_path / "labctl.bash"
    script.write_text(shown.stdout)
    checked = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    # The script calls `labctl` by name, as an installed one is found: put this one on PATH.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "labctl").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m labctl "$@"\n')
    (bindir / "labctl").chmod(0o755)
    complete = (
        f"source {shlex.quote(str(script))}\n"
        'complete_words() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _labctl_completion labctl; '
        'printf "%s\\n" "${COMPREPLY[@]}"; echo --; }\n'
        "complete_words labctl tr\n"
        "complete_words labctl train se\n"
    )
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    done = subprocess.run(["bash", "-c", complete], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    first, second, _ = done.stdout.split("--\n")
    assert set(first.split()) == {"train", "trust"}, done.stdout
    assert second.split() == ["settings"], done.stdout


def test_install_completion_writes_the_script_for_the_shell_named(tmp_path: Path) -> None:
    done = run_cli("--install-completion", "bash", env={"HOME": str(tmp_path)}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    installed = list(tmp_path.rglob("labctl*"))
    assert installed and "_LABCTL_COMPLETE" in installed[0].read_text(), installed
    assert str(installed[0].name) in (tmp_path / ".bashrc").read_text()


def _every_setting(model: Any, prefix: str = "") -> list[str]:
    from pydantic import BaseModel

    out = []
    for key, field in model.model_fields.items():
        out.append(prefix + key)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out += _every_setting(field.annotation, f"{prefix}{key}.")
    return out


def test_train_settings_lists_every_setting_with_what_it_means() -> None:
    from labctl.train.phases import Settings

    names = _every_setting(Settings)
    assert {"steps", "model.d_model", "gradient_scaling.growth_interval", "k8s.runtime"} <= set(names)
    proc = run_cli("--json", "train", "settings")
    assert proc.returncode == 0, proc.stderr
    rows = {r["setting"]: r for r in json.loads(proc.stdout)["settings"]}
    assert list(rows) == names
    for row in rows.values():
        assert row["meaning"] and row["example"], row  # every setting says what it is, with an example
    assert rows["steps"]["default"] == "1000" and "optimizer steps" in rows["steps"]["meaning"]
    assert rows["model.n_heads"]["default"] == "4"
    human = run_cli("train", "settings", env={"COLUMNS": "300"})
    assert human.returncode == 0, human.stderr
    for name in names:
        assert re.search(rf"^\S*\s*{re.escape(name)}\s", human.stderr, re.M), name
    # What the phases file and `train --help` point to is the command that lists them.
    assert "`labctl train settings` lists every setting" in (REPO / "playbooks/train.yaml").read_text()
    assert "labctl train settings" in run_cli("train", "--help", env={"COLUMNS": "200"}).stdout


def test_facts_shows_memory_in_gib_as_the_host_counts_it() -> None:
    from rich.console import Console

    from labctl.facts.render import render_facts
    from labctl.hosts.fanout import HostResult

    gib = 1 << 30
    data = {
        "cpu": {"logical_cpus": 8},
        "memory": {"total_bytes": 64 * gib, "available_bytes": 48 * gib},
        "gpus": [
            {"name": "Tesla V100-PCIE-32GB", "memory_total_bytes": 32 * gib, "compute_capability": "7.0"}
        ],
    }
    console = Console(record=True, width=200, force_terminal=False)
    render_facts(console, [HostResult("m5", "ok", data=data)])
    text = console.export_text()
    assert "RAM GiB (free)" in text and "64.0 (48.0)" in text
    assert "Tesla V100-PCIE-32GB 32.0 GiB cc7.0" in text
    assert not re.search(r"\dGB\b| GB\b", text.replace("PCIE-32GB", "")), text


def test_an_extras_install_hint_runs_as_written() -> None:
    from labctl.output.errors import install_extra

    for extra in ("plot", "cloud"):
        hint = install_extra(extra)
        argv = shlex.split(hint)
        assert argv[:4] == [sys.executable, "-m", "pip", "install"], hint
        pins = argv[4:]
        assert pins and all("==" in p for p in pins), hint
        try:
            for p in pins:
                name, version = p.split("==")
                if metadata.version(name) != version:
                    pytest.skip(f"{name} {metadata.version(name)} here, not {version}")
        except metadata.PackageNotFoundError as e:
            pytest.skip(f"the {extra} extra is not installed here ({e})")
        # Offline, the pins already there: pip accepts the command exactly as the hint words it.
        done = subprocess.run(
            [*argv, "--dry-run", "--no-index", "-q"], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr


def _help_texts() -> list[tuple[str, str]]:
    """Every command's help and every option's help, as `--help` shows them."""
    import typer

    from labctl.cli.app import app

    out: list[tuple[str, str]] = []

    def walk(cmd: Any, path: str) -> None:  # Typer's own (vendored) click command
        out.append((path, cmd.help or ""))
        for p in cmd.params:
            out.append((f"{path} {p.name}", getattr(p, "help", None) or ""))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "labctl")
    return out


def _user_strings(path: Path) -> list[tuple[int, str]]:
    """String literals of a module that are not docstrings: messages, table headers, hints."""
    tree = ast.parse(path.read_text())
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def test_nothing_a_user_reads_cites_documents_they_do_not_have() -> None:
    found = []
    readme = (REPO / "README.md").read_text()
    found += [
        f"README.md:{i}: {line}" for i, line in enumerate(readme.splitlines(), 1) if CITATION.search(line)
    ]
    for path in sorted((REPO / "labctl/data").rglob("*.yaml")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if CITATION.search(line):
                found.append(f"{path.relative_to(REPO)}:{i}: {line}")
    found += [f"{where}: {text}" for where, text in _help_texts() if CITATION.search(text)]
    for path in sorted((REPO / "labctl").rglob("*.py")):
        found += [
            f"{path.relative_to(REPO)}:{line}: {text!r}"
            for line, text in _user_strings(path)
            if CITATION.search(text)
        ]
    assert not found, "\n".join(found)


def test_with_no_inventory_the_hint_s_init_makes_one_that_the_default_lookup_finds(tmp_path: Path) -> None:
    missing = run_cli("inventory", "validate", cwd=tmp_path)
    assert missing.returncode == 2 and "`labctl init DIR`" in missing.stderr, missing.stderr
    assert run_cli("init", "mylab", cwd=tmp_path).returncode == 0
    found = run_cli("inventory", "validate", cwd=tmp_path / "mylab")
    assert found.returncode == 0, found.stderr
