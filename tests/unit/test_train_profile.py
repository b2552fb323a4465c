"""Phase 3 for a newcomer (issue 39, point 7): the examples `labctl init` and the wheel ship, and
`--profile cpu-demo` (phase 3 sized for CPUs) in `train`, `train settings`, `bench phase3` and
`make demo`."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest

from labctl.output.errors import InputError
from labctl.train.phases import load_phases
from tests.unit.test_ux import run_cli

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = ("orchestra-sim.yaml", "orchestra-learn.yaml", "local-sandbox.yaml", "sandbox-python.yaml")
# What `make demo`'s phase-3 line set one by one before the profile.
DEMO_SETS = [
    "steps=3",
    "batch_size_per_gpu=8",
    "seq_len=288",
    "model.d_model=64",
    "model.n_layers=2",
    "model.n_heads=4",
    "model.d_ff=256",
    "log_every=1",
    "checkpoint_every=100",
    "checkpoint_dir=/var/lib/labctl/train/demo-phase3",
    "rl.tasks_per_step=1",
    "rl.answer_tokens=64",
    "accumulation_steps=1",
]


def test_cpu_demo_sizes_phase_3_for_cpus_and_set_wins_over_it() -> None:
    phases = load_phases(REPO / "playbooks/train.yaml")
    gpu = phases.settings(3)
    assert gpu.batch_size_per_gpu == 1024 and gpu.rl.answer_tokens == 256  # the file, as before
    cpu = phases.settings(3, [], "cpu-demo")
    assert (cpu.batch_size_per_gpu, cpu.accumulation_steps, cpu.seq_len, cpu.log_every) == (8, 1, 288, 1)
    assert cpu.model.model_dump() == {"vocab": 256, "d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 256}
    assert (cpu.rl.tasks_per_step, cpu.rl.answer_tokens) == (1, 64)
    assert cpu.rl.context_tokens == gpu.rl.context_tokens  # what the profile leaves out is the phase's
    mine = phases.settings(3, ["rl.answer_tokens=32", "model.d_model=128"], "cpu-demo")
    assert mine.rl.answer_tokens == 32 and mine.model.d_model == 128 and mine.batch_size_per_gpu == 8
    with pytest.raises(InputError, match="Did you mean 'cpu-demo'") as e:
        phases.settings(3, [], "cpu-dmo")
    assert "cpu-demo" in e.value.hint


def test_make_demo_runs_phase_3_on_the_profile_with_only_what_differs() -> None:
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    (line,) = re.findall(r"^DEMO_P3 = (.*)$", text, re.M)
    words = shlex.split(line)
    assert words[:2] == ["--profile", "cpu-demo"]
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    assert sorted(sets) == [
        "checkpoint_dir=/var/lib/labctl/train/demo-phase3",
        "checkpoint_every=100",
        "steps=3",
    ]
    phases = load_phases(REPO / "playbooks/train.yaml")
    assert phases.settings(3, sets, "cpu-demo") == phases.settings(3, DEMO_SETS)


def test_train_help_and_settings_name_the_profiles() -> None:
    help_ = run_cli("train", "--help", env={"COLUMNS": "200"})
    assert "--profile" in help_.stdout and "cpu-demo" in help_.stdout
    out = run_cli("--json", "train", "settings")
    (demo,) = [p for p in json.loads(out.stdout)["profiles"] if p["profile"] == "cpu-demo"]
    assert "rl.answer_tokens=64" in demo["sets"] and "seq_len=288" in demo["sets"]
    shown = run_cli("train", "settings", env={"COLUMNS": "300"})
    assert re.search(r"cpu-demo .*batch_size_per_gpu=8", shown.stdout + shown.stderr)


def test_bench_phase3_passes_the_profile_to_its_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    import labctl.cli.orchestra_cmd
    import labctl.phase3.bench
    from labctl.cli.app import app

    seen: list[list[str]] = []

    def training_figure(c: Any, orch: Any, args: list[str], *rest: Any) -> dict[str, Any]:
        seen.append(args)
        return {}

    monkeypatch.setattr(labctl.cli.orchestra_cmd, "load", lambda c, f: None)
    monkeypatch.setattr(labctl.phase3.bench, "training_figure", training_figure)
    inv = tmp_path / "lab.yaml"
    inv.write_text("lab: none\nhosts: {}\n")
    argv = ["--json", "-i", str(inv), "bench", "phase3", "--only", "training", "--profile", "cpu-demo"]
    res = CliRunner().invoke(app, [*argv, "--set", "steps=10", "--limit", "m5"])
    assert res.exit_code == 0, res.output
    assert seen == [["--profile", "cpu-demo", "--set", "steps=10", "--limit", "m5"]]
    help_ = run_cli("bench", "phase3", "--help", env={"COLUMNS": "250"})
    assert "--profile" in help_.stdout
    assert "inventory/examples/orchestra-sim.yaml --limit m5 --device cpu --profile cpu-demo" in help_.stdout


def test_init_writes_the_examples_the_repository_links_and_the_wheel_ships(tmp_path: Path) -> None:
    lab = tmp_path / "mylab"
    proc = run_cli("init", str(lab))
    assert proc.returncode == 0, proc.stderr
    for name in EXAMPLES:
        link = REPO / "inventory/examples" / name
        # One file: the repository's path is a link into the package data the wheel holds.
        assert link.is_symlink() and link.resolve() == REPO / "labctl/data/examples" / name
        # The same path in the new lab, so the examples' own comments and `make demo` read as written.
        assert (lab / "inventory/examples" / name).read_bytes() == link.read_bytes()
        assert f"wrote {lab / 'inventory/examples' / name}" in proc.stderr
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "labctl"
    ]
    shipped = {p for g in globs for p in (REPO / "labctl").glob(g)}
    for path in (REPO / "labctl/data").rglob("*.yaml"):
        assert path in shipped, f"{path} is not in the wheel's package data"
