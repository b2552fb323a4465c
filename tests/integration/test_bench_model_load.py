"""bench make-model and model-load end to end on the simulated lab (CPU: the GPU stages skip)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import labctl, m5_cache

pytestmark = pytest.mark.integration


def test_make_model_then_measure_every_stage(lab: Any, tmp_path: Path) -> None:
    inv = str(lab.inventory_path)
    with m5_cache(lab):
        try:
            measure_every_stage(inv, tmp_path)
        finally:
            labctl("-i", inv, "exec", "-l", "irina", "--", "rm -rf /srv/models/bench-m")


def measure_every_stage(inv: str, tmp_path: Path) -> None:
    made = labctl(
        "--json",
        "-i",
        inv,
        "bench",
        "make-model",
        "--size-gb",
        "0.05",
        "--host",
        "irina",
        "--name",
        "bench-m",
    )
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["data"]["path"] == "/srv/models/bench-m"

    png = tmp_path / "load.png"
    # The sim's hosts share this machine's disk, so the controller's venv (with torch) serves as m5's.
    proc = labctl(
        "--json", "-i", inv, "bench", "model-load", "--host", "m5", "--model", "bench-m",
        "--python", sys.executable, "--plot", str(png), timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["host"] == "m5" and doc["model"] == "bench-m" and doc["bytes"] > 40e6
    stages = {s["name"]: s for s in doc["stages"]}
    assert list(stages) == ["network", "storage_cold", "ram_cache", "h2d", "cuda_init", "warmup", "forward"]
    net = stages["network"]
    # The weights plus config.json crossed the network; the sim's links are 1 Gbit.
    assert doc["bytes"] <= net["bytes"] < doc["bytes"] + 4096
    assert net["ceiling_gbps"] == pytest.approx(0.125)
    assert 0 < net["pct_of_ceiling"] <= 105
    ram = stages["ram_cache"]
    assert ram["ceiling_gbps"] == pytest.approx(doc["memcpy_gbps"]) and ram["pct_of_ceiling"] > 0
    for name in ("h2d", "cuda_init"):
        assert stages[name]["skipped"], stages[name]  # no GPU here, said so
    assert stages["warmup"]["seconds"] > 0 and stages["forward"]["seconds"] > 0  # a real forward pass ran
    assert stages["network"]["seed_seconds"] == pytest.approx(384 * doc["bytes"] / 48e9)
    assert doc["speedup_ram_vs_network"] > 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The model is cached again after the network stage re-fetched it.
    status = labctl("--json", "-i", inv, "cache", "status", "--host", "m5")
    assert "bench-m" in status.stdout


def test_model_load_without_torch_env_says_what_to_do(lab: Any) -> None:
    proc = labctl(
        "-i", str(lab.inventory_path), "bench", "model-load", "--host", "pharaoh", "--file", "/srv/x"
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    # pharaoh has no train role, so no shipped play builds a torch_env there: the hint says that
    # first, then the command that does it once pharaoh is in the play.
    text = " ".join(proc.stderr.split())
    assert "no play of playbooks/provision.yaml applies torch_env to pharaoh" in text, text
    assert "`labctl provision -p playbooks/provision.yaml --tags torch_env --limit pharaoh`" in text, text
