"""`labctl status`'s screen drawn at 80 columns from samples shaped as the issue 15 contract fixes them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

from rich.console import Console

from labctl.cli.status_cmd import with_watch_value
from labctl.monitor.alerts import Alert
from labctl.monitor.collect import HostStatus
from labctl.monitor.render import render_status, status_json
from tests.conftest import REPO, labctl

GIB = 1 << 30


def gpu(
    index: int, name: str, total_gb: int, used_gb: float, util: int, temp: int, power: float
) -> dict[str, Any]:
    return {
        "index": index,
        "name": name,
        "uuid": f"GPU-{index}",
        "utilization_pct": util,
        "memory_total_bytes": total_gb * GIB,
        "memory_used_bytes": int(used_gb * GIB),
        "temperature_c": temp,
        "power_w": power,
    }


def m5_sample() -> dict[str, Any]:
    return {
        "time": 1_700_000_000.0,
        "hostname": "m5",
        "cpu": {"count": 32, "load": [1.25, 0.8, 0.5], "busy_pct": 35.2},
        "memory": {"total_bytes": 128 * GIB, "available_bytes": 100 * GIB, "used_bytes": 28 * GIB},
        "cache": {
            "path": "/mnt/model-cache",
            "mounted": True,
            "size_bytes": 96 * GIB,
            "used_bytes": 44 * GIB,
        },
        "gpus": [gpu(0, "Tesla V100-PCIE-16GB", 16, 15.6, 97, 71, 212.4)]
        + [gpu(i, "Tesla P40", 24, 1.2, 3, 40 + i, 50.0) for i in range(1, 5)],
        "gpu_source": "nvml",
        "gpu_error": None,
        "warm": [
            {"model": "qwen2.5-7b-instruct", "gpu": 1, "port": 8001},
            {"model": "llama-3.1-8b", "gpu": 2, "port": 8002},
        ],
        "runs": [
            {
                "run_id": "phase1-abc",
                "state": "running",
                "step": 1200,
                "steps": 5000,
                "loss": 2.34567,
                "lr": 3e-4,
                "tokens_per_s": 12345.6,
                "grad_norm": 1.1,
                "best_loss": 2.3,
                "best_step": 1100,
                "nccl_errors": 2,
                "last_nccl_error": "NCCL WARN Net/IB : Got async event",
            }
        ],
        "history": [],
    }


def pharaoh_sample() -> dict[str, Any]:
    return {
        "time": 1_700_000_000.0,
        "hostname": "pharaoh",
        "cpu": {"count": 4, "load": [0.1, 0.2, 0.3], "busy_pct": None},
        "memory": {"total_bytes": 8 * GIB, "available_bytes": 6 * GIB, "used_bytes": 2 * GIB},
        "cache": None,
        "gpus": [],
        "gpu_source": "none",
        "gpu_error": "no NVIDIA driver (nvidia-smi not found)",
        "warm": [],
        "runs": [],
        "history": [],
    }


def lab() -> list[HostStatus]:
    return [
        HostStatus(
            "m5",
            True,
            m5_sample(),
            [
                Alert(
                    "gpu_memory", "m5", "warning", "GPU memory 97% above 95% for 5 minutes", 97.5, 95, gpu=0
                ),
                Alert("nccl_errors", "m5", "critical", "2 NCCL errors in the log", 2, 0, run_id="phase1-abc"),
            ],
        ),
        HostStatus("pharaoh", True, pharaoh_sample()),
        HostStatus(
            "irina",
            False,
            None,
            error="Cannot connect to irina (10.0.0.2:22): connection refused.",
            hint="Check that sshd runs on irina.",
        ),
    ]


def screen(statuses: list[HostStatus], every: Optional[float] = None) -> list[str]:
    console = Console(width=80, record=True, force_terminal=False, color_system=None)
    console.print(render_status(statuses, now=1_700_000_000.0, every=every))
    return console.export_text().splitlines()


def test_the_lab_fits_80_columns_with_every_host_gpu_warm_model_and_run() -> None:
    lines = screen(lab(), every=2)
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    text = "\n".join(lines)
    assert "2/3 hosts up" in lines[0] and "every 2s" in lines[0]
    firsts = [line.split()[0] for line in lines if line and not line.startswith(" ")]
    assert {"m5", "pharaoh", "irina"} <= set(firsts)
    gpu_lines = [line for line in lines if re.match(r"(m5)? +gpu\d ", line)]
    assert len(gpu_lines) == 5
    assert next(line for line in gpu_lines if "gpu0" in line).split() == [
        "gpu0",
        "V100-16GB",
        "97%",
        "15.6/16G",
        "71",
        "212",
    ]
    m5 = next(line for line in lines if line.startswith("m5")).split()
    assert m5[1:6] == ["cpu", "×32", "35%", "28.0/128G", "load"]
    cache = next(line for line in lines if " cache " in line).split()
    assert cache[1:4] == ["46%", "44.0/96G", "/mnt/model-cache"]
    assert "qwen2.5-7b-instruct" in text and "gpu1:8001" in text and "llama-3.1-8b" in text
    run = next(line for line in lines if line.split()[:1] == ["run"]).split()
    assert run[:4] == ["run", "24%", "phase1-abc", "step"]
    assert "step 1200/5000" in text and "loss 2.346" in text and "12.3k tok/s" in text
    assert "2 NCCL errors" in text
    assert "no NVIDIA driver" in text


def test_an_unreachable_host_is_marked_with_its_error_and_hint() -> None:
    lines = screen(lab())
    irina = [i for i, line in enumerate(lines) if line.startswith("irina")]
    assert len(irina) == 1 and "unreachable" in lines[irina[0]]
    text = " ".join(" ".join(line.split()) for line in lines)
    assert "connection refused." in text and "Check that sshd runs on irina." in text
    assert "1/3 hosts up" not in lines[0] and "2/3 hosts up" in lines[0]


def test_alerts_follow_the_table_critical_first_naming_host_gpu_and_run() -> None:
    lines = screen(lab())
    crit = next(i for i, line in enumerate(lines) if line.startswith("CRITICAL"))
    warn = next(i for i, line in enumerate(lines) if line.startswith("WARNING"))
    last_row = max(i for i, line in enumerate(lines) if "unreachable" in line or "gpu4" in line)
    assert last_row < crit < warn
    assert lines[crit].startswith("CRITICAL m5 run phase1-abc: 2 NCCL errors in the log (nccl_errors)")
    assert lines[warn].startswith("WARNING m5 gpu0: GPU memory 97% above 95%")


def test_long_names_and_many_hosts_never_widen_past_80_columns() -> None:
    long = m5_sample()
    long["gpus"][0]["name"] = "NVIDIA H100 80GB HBM3 with a very long marketing name"
    long["cache"]["path"] = "/very/long/path/" + "x" * 120
    long["warm"] = [
        {"model": f"model-{i}-with-a-long-name-instruct", "gpu": i, "port": 8000 + i} for i in range(8)
    ]
    long["gpus"][0]["memory_total_bytes"] = 1000 * GIB
    long["gpus"][0]["memory_used_bytes"] = 999 * GIB
    statuses = [HostStatus(f"a-very-long-host-name-{i}.lab.example.org", True, long) for i in range(3)]
    statuses.append(HostStatus("down", False, None, error="e" * 300, hint="h" * 100))
    lines = screen(statuses, every=0.5)
    assert all(len(line) <= 80 for line in lines), "\n".join(line for line in lines if len(line) > 80)
    assert "999/1000G" in "\n".join(lines)


def test_a_sample_with_fields_missing_or_none_renders_dashes_not_a_traceback() -> None:
    bare = {"cpu": {}, "memory": {}, "cache": {"path": "/mnt/c", "mounted": False}, "gpus": [{"index": 0}]}
    nones = {
        "cpu": {"count": 2, "load": None, "busy_pct": None},
        "memory": {"total_bytes": None, "used_bytes": None},
        "gpus": [dict.fromkeys(("index", "name", "utilization_pct", "memory_total_bytes", "power_w"))],
        "runs": [{"run_id": "r1", "step": None, "steps": None, "loss": None, "tokens_per_s": None}],
        "warm": [{"model": "m", "gpu": None, "port": None}],
    }
    lines = screen(
        [HostStatus("bare", True, bare), HostStatus("nones", True, nones), HostStatus("x", True, {})]
    )
    text = "\n".join(lines)
    assert "/mnt/c not mounted" in text
    assert "step -" in text
    assert all(len(line) <= 80 for line in lines)


def test_status_json_has_a_row_per_host_with_alerts_and_the_unreachable_marked() -> None:
    out = status_json(lab())
    assert [h["host"] for h in out["hosts"]] == ["m5", "pharaoh", "irina"]
    m5, _, irina = out["hosts"]
    assert m5["reachable"] is True and m5["sample"]["gpus"][0]["utilization_pct"] == 97
    assert [a["name"] for a in m5["alerts"]] == ["gpu_memory", "nccl_errors"]
    assert irina["reachable"] is False and irina["sample"] is None
    assert irina["error"].startswith("Cannot connect") and irina["hint"] == "Check that sshd runs on irina."


def test_a_skipped_host_reads_skipped_not_unreachable() -> None:
    lines = screen([HostStatus("win", True, None, error="skipped: windows (the status agent is Linux-only)")])
    row = next(line for line in lines if line.startswith("win"))
    assert row.split()[1:3] == ["skipped", "windows"] and "unreachable" not in row
    assert "1/1 hosts up" in lines[0]


def test_watch_takes_its_seconds_or_the_default_when_none_follows() -> None:
    assert with_watch_value(["--watch"]) == ["--watch", "2"]
    assert with_watch_value(["--watch", "5"]) == ["--watch", "5"]
    assert with_watch_value(["-w", "0.5", "--json"]) == ["-w", "0.5", "--json"]
    assert with_watch_value(["--watch", "-l", "m5"]) == ["--watch", "2", "-l", "m5"]
    assert with_watch_value(["--watch", "-1"]) == ["--watch", "-1"]  # refused later: not above 0
    assert with_watch_value(["--watch=3"]) == ["--watch=3"]
    assert with_watch_value(["--", "--watch"]) == ["--", "--watch"]


def test_watch_with_json_is_refused_as_input_before_any_host_is_asked() -> None:
    proc = labctl("-i", str(REPO / "inventory/lab.yaml"), "--json", "status", "--watch")
    assert proc.returncode == 2, proc.stderr
    assert "--watch" in proc.stderr and "--json" in proc.stderr and "Traceback" not in proc.stderr


def test_a_bad_alerts_file_is_exit_2_naming_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "alerts.yaml"
    bad.write_text("alerts:\n  gpu_memory: {above_pct: lots}\n")
    proc = labctl("-i", str(REPO / "inventory/lab.yaml"), "status", "--alerts", str(bad))
    assert proc.returncode == 2, proc.stderr
    assert f"{bad}:2" in proc.stderr and "Traceback" not in proc.stderr


def test_a_clock_that_went_back_and_a_history_not_written_are_said_on_the_hosts_rows() -> None:
    sample = pharaoh_sample()
    sample["history_notes"] = ["clock went back 2 h between 12:00:00 and 12:00:10; later samples re-dated"]
    sample["history_error"] = "cannot write /var/lib/labctl/status/history.jsonl: No space left on device"
    text = "\n".join(screen([HostStatus("pharaoh", True, sample)]))
    assert "clock went back 2 h" in text and "No space left on device" in text
    assert "history" in text


def test_a_phase3_run_shows_its_reward_the_code_that_ran_and_its_slowest_model() -> None:
    statuses = lab()
    sample = statuses[0].sample
    assert sample is not None
    sample["runs"][0].update(
        run_id="p3-xyz",
        reward=0.4375,
        exec_success_rate=0.62,
        rotation_wait_s=0.0,
        orchestra_ms={
            "qwen": {"p50": 2100.0, "p95": 3400.0, "n": 4},
            "tiny": {"p50": 80.0, "p95": 120.0, "n": 4},
        },
    )
    text = " ".join(" ".join(screen(statuses)).split())
    assert "reward 0.438" in text and "code ran 62%" in text and "orchestra p95 3,400 ms (2 models)" in text
    assert all(len(line) <= 80 for line in screen(statuses))
    # A phase-1 run says nothing of the sort.
    assert "reward" not in " ".join(screen(lab()))


def test_a_phase3_run_at_reward_0_says_whether_its_programs_ran_and_where_to_look() -> None:
    statuses = lab()
    sample = statuses[0].sample
    assert sample is not None
    run = sample["runs"][0]
    run.update(run_id="p3-zero", reward=0.0, exec_success_rate=0.0, programs_run=3)
    text = " ".join(" ".join(screen(statuses)).split())
    assert "(0 of 3 programs ran: see `labctl train show p3-zero --samples`)" in text
    run.update(exec_success_rate=0.5)
    text = " ".join(" ".join(screen(statuses)).split())
    assert "(no test passed: see `labctl train show p3-zero --samples`)" in text
    run.update(reward=0.25)
    assert "--samples" not in " ".join(screen(statuses))
