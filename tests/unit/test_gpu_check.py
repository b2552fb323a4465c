"""`make gpu-check` on a machine without a GPU (CI's): the plan, the JSON, recording, the wheels.

The GPU run itself needs a card; what CI can hold the script to is that without one it
prints every section's plan and exits 0, that `--record` copies only a real GPU run into
docs/benchmarks.md, and that the wheel list for the offline GPU machine is complete.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_check
from bench.gpu_wheels import closure

REPO = Path(__file__).resolve().parents[2]


def _no_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return True
    return not torch.cuda.is_available()


pytestmark = pytest.mark.skipif(not _no_gpu(), reason="this machine has a GPU: the dry run does not apply")


def test_without_a_gpu_prints_every_section_and_exits_0(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", "bench/gpu_check.sh", str(tmp_path / "out")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "No GPU here" in proc.stdout and "Nothing was run" in proc.stdout
    for name in gpu_check.SECTIONS:
        mod = __import__(f"bench.gpucheck.{name}", fromlist=["TITLE"])
        assert mod.TITLE in proc.stdout
        assert all(line in proc.stdout for line in mod.PLAN)
    doc = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert doc["dry_run"] is True and doc["gpu"] is None
    assert list(doc["plan"]) == gpu_check.SECTIONS
    assert not (tmp_path / "out" / "gpu_check.md").exists()  # no table of figures that were never measured


def test_unknown_section_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "bench/gpu_check.py", str(tmp_path), "--only", "loader,warp-drive"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "unknown section warp-drive" in proc.stderr


def _run_doc(name: str, value: float) -> dict:
    return {
        "date": "2026-11-26",
        "machine": "gpu-box, 16 CPUs",
        "driver": "580.1",
        "gpu": {"name": name, "cc": "9.0", "torch": "2.11.0", "cuda": "13.0", "memory_gb": 85.0},
        "smoke": False,
        "seconds": 300.0,
        "sections": [
            {
                "key": "loader",
                "title": "Loader",
                "ok": value >= 0.9,
                "rows": [["labctl loader", f"{value * 50:.1f} GB/s", "a|b"]],
                "goals": [
                    {
                        "name": "g",
                        "value": value,
                        "target": 0.9,
                        "unit": "x",
                        "why": "90% of pinned",
                        "met": value >= 0.9,
                    }
                ],
                "skipped": [{"what": "two ranks", "why": "NCCL refused"}],
                "error": None,
            }
        ],
    }


def test_record_writes_one_section_per_card_and_replaces_it(tmp_path: Path) -> None:
    bench_md = tmp_path / "benchmarks.md"
    bench_md.write_text("# Benchmarks\n\n## CPU figures\nkept\n")
    run = tmp_path / "gpu_check.json"
    run.write_text(json.dumps(_run_doc("NVIDIA H100 80GB HBM3", 0.8)))
    assert gpu_check.record(bench_md, run) == 0
    text = bench_md.read_text()
    assert "## GPU check on NVIDIA H100 80GB HBM3, 2026-11-26" in text
    assert "0.80x against 0.9x: **MISSED**" in text
    assert "Skipped: two ranks: NCCL refused" in text
    assert "| labctl loader | 40.0 GB/s | a/b |" in text  # a '|' in a figure cannot break the table
    run.write_text(json.dumps(_run_doc("NVIDIA H100 80GB HBM3", 0.95)))
    gpu_check.record(bench_md, run)
    run.write_text(json.dumps(_run_doc("NVIDIA H200", 0.97)))
    gpu_check.record(bench_md, run)
    text = bench_md.read_text()
    assert text.count("## GPU check on NVIDIA H100") == 1 and "0.95x against 0.9x: **met**" in text
    assert "MISSED" not in text and "## GPU check on NVIDIA H200" in text
    assert text.startswith("# Benchmarks\n\n## CPU figures\nkept\n")


def test_a_run_of_some_sections_is_recorded_beside_the_full_run(tmp_path: Path) -> None:
    bench_md = tmp_path / "benchmarks.md"
    full = dict(_run_doc("NVIDIA H100 80GB HBM3", 0.62), only=None)
    some = dict(_run_doc("NVIDIA H100 80GB HBM3", 0.7), only=["loader"])
    for doc in (full, some):
        run = tmp_path / "run.json"
        run.write_text(json.dumps(doc))
        assert gpu_check.record(bench_md, run) == 0
    text = bench_md.read_text()
    assert "## GPU check on NVIDIA H100 80GB HBM3, 2026-11-26\n" in text
    assert "## GPU check on NVIDIA H100 80GB HBM3, 2026-11-26 (only loader)\n" in text
    assert "0.62x against 0.9x" in text and "0.70x against 0.9x" in text


def test_record_refuses_a_run_without_a_gpu(tmp_path: Path) -> None:
    bench_md = tmp_path / "benchmarks.md"
    bench_md.write_text("# Benchmarks\n")
    for doc in ({"dry_run": True, "gpu": None}, dict(_run_doc("x", 1.0), smoke=True)):
        run = tmp_path / "run.json"
        run.write_text(json.dumps(doc))
        assert gpu_check.record(bench_md, run) == 2
    assert bench_md.read_text() == "# Benchmarks\n"


def test_wheels_cover_labctls_imports_for_the_gpu_machine() -> None:
    pins = closure("labctl")
    for name in (
        "pydantic",
        "pydantic-core",
        "paramiko",
        "cryptography",
        "cffi",
        "bcrypt",
        "pynacl",
        "typer",
        "pyyaml",
    ):
        assert name in pins, name
    assert "torch" not in pins and "numpy" not in pins  # extras stay out: the GPU machine has its own
    assert "colorama" not in pins  # typer's Windows-only requirement: markers are the GPU machine's
