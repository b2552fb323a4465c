"""`bench/gpu_check.py --smoke`: every section of the GPU check through its real code paths on the CPU.

A GPU machine is lent rarely and briefly, so the check must run the first time it is tried
there. This runs the same sections here, small and on the CPU: labctl's loader against its
peers, the reference trainer through `labctl train` (fp32, AMP, a time-limit pause and its
resume, two ranks), the orchestra's servers started, asked, rotated and stopped, and
facts/status/doctor/metrics while a detached run trains. None of its figures is a GPU
figure; what is asserted is that every step happened. labctl's host state (/var/lib/labctl)
is a private tmpfs in a mount namespace of the test's own, so this machine's is untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"),
]


def _sections(out: Path) -> dict[str, dict]:
    doc = json.loads((out / "gpu_check.json").read_text())
    assert doc["smoke"] is True and doc["gpu"] is None
    return {s["key"]: s for s in doc["sections"]}


@pytest.mark.timeout(900)
def test_every_section_runs_on_the_cpu(tmp_path: Path) -> None:
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: run `make gpu-check` instead")
    out, work = tmp_path / "out", tmp_path / "work"
    script = (
        "mkdir -p /var/lib/labctl && mount -t tmpfs labctl-test /var/lib/labctl && "
        f"exec {sys.executable} bench/gpu_check.py {out} --smoke --work {work}"
    )
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=840,
    )
    log = (out / "gpu_check.log").read_text() if (out / "gpu_check.log").exists() else ""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + log[-3000:]
    sections = _sections(out)
    assert list(sections) == ["loader", "trainer", "orchestra", "orchestra_hf", "nvml", "torch_env"]
    for key, s in sections.items():
        assert s["error"] is None, (key, s["error"])

    loader = sections["loader"]["figures"]
    assert loader["bit_identical_to_safetensors"] is True
    for method in ("pinned_h2d_ceiling", "labctl_loader", "safetensors_load_file", "torch_load"):
        assert len(loader["methods"][method]["times_s"]) >= 2

    trainer = json.dumps(sections["trainer"])
    rows = {r[0]: r for r in sections["trainer"]["rows"]}
    paused = next(r for k, r in rows.items() if "paused at step" in k)
    resumed = next(r for k, r in rows.items() if "resumed from step" in k)
    assert int(paused[1]) > 0 and paused[1] == resumed[1]  # resumed where it paused, not from 0
    assert "tok/s" in trainer

    orch = {r[0]: r for r in sections["orchestra"]["rows"]}
    assert orch["servers left after `orchestra stop`"][1] == "0"
    assert any(k.startswith("rotation: in ") for k in orch)

    hf = sections["orchestra_hf"]["figures"]
    # labctl's server served the HF model in fp32 on the CPU and streamed a chat's first token.
    assert hf["dtype"] == "float32" and hf["tokens_per_s"] > 0 and hf["first_token_s"] > 0
    assert hf["transformers_tokens_per_s"] > 0

    nvml = sections["nvml"]["figures"]
    assert nvml["under_load"]["run"]["step"] > 0  # status saw the detached run training
    assert nvml["metrics_series"]["labctl_host_up"] == 1.0

    md = (out / "gpu_check.md").read_text()
    assert "CPU smoke run" in md and "(FAILED)" not in md
