"""The agent's `monitor.status` command (labctl/agent/monitor/status.py) on this machine: real /proc, real
processes carrying a run's tags, real files for history, logs and warm.json. There is no GPU
here: GPU sampling runs against a recorded nvidia-smi answer on PATH and a stand-in NVML module."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from labctl.agent import commands
from labctl.agent.commands import answer_problem
from labctl.agent.core import paths, spec
from labctl.agent.monitor import status as agent_status

# Recorded from `nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,compute_cap,
# driver_version,utilization.gpu,temperature.gpu,pci.bus_id,power.draw --format=csv,noheader,nounits`
# on a V100 + P40 host; the third P40 reports no power reading.
NVIDIA_SMI_CSV = """\
0, Tesla V100-PCIE-32GB, GPU-6b1c0a4e-8f2d-4c1e-9a55-0d2b3c4e5f60, 32768, 31500, 7.0, 535.129.03, 97, 71, 00000000:3B:00.0, 212.48
1, Tesla P40, GPU-1f2e3d4c-5b6a-7988-a1b2-c3d4e5f60718, 24576, 18211, 6.1, 535.129.03, 87, 61, 00000000:5E:00.0, 148.02
2, Tesla P40, GPU-9a8b7c6d-5e4f-3a2b-1c0d-e9f8a7b6c5d4, 24576, 0, 6.1, 535.129.03, 0, 30, 00000000:86:00.0, [N/A]
"""
SAMPLE_KEYS = {
    "time",
    "hostname",
    "cpu",
    "memory",
    "cache",
    "gpus",
    "gpu_source",
    "gpu_error",
    "warm",
    "runs",
    "history",
}
GPU_KEYS = {
    "index",
    "name",
    "uuid",
    "utilization_pct",
    "memory_total_bytes",
    "memory_used_bytes",
    "temperature_c",
    "power_w",
}
RUN_KEYS = {
    "run_id",
    "state",
    "step",
    "steps",
    "loss",
    "lr",
    "tokens_per_s",
    "grad_norm",
    "best_loss",
    "best_step",
    "nccl_errors",
    "last_nccl_error",
}


@pytest.fixture
def recorded_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML bindings: nvidia-smi answers
    (tmp_path / "out.csv").write_text(NVIDIA_SMI_CSV)
    script = tmp_path / "nvidia-smi"
    script.write_text(f'#!/bin/sh\ncat "{tmp_path}/out.csv"\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")


def stand_in_nvml() -> types.SimpleNamespace:
    """A stand-in for the pynvml module: two GPUs, power in milliwatts as NVML reports it."""

    def fail(*_: Any) -> Any:
        raise RuntimeError("NVMLError_NotSupported")

    return types.SimpleNamespace(
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "535.129.03",
        nvmlSystemGetCudaDriverVersion_v2=lambda: 12020,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: ["Tesla V100-PCIE-32GB", "Tesla P40"][h].encode(),
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(
            total=32 * 1024**3, used=(h + 1) * 1024**3, free=0
        ),
        nvmlDeviceGetCudaComputeCapability=lambda h: (7, 0),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=40 + h, memory=0),
        nvmlDeviceGetTemperature=lambda h, _kind: 50 + h,
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=b"00000000:3B:00.0"),
        nvmlDeviceGetPowerUsage=lambda h: 212480 if h == 0 else fail(),
    )


@pytest.fixture
def history_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """status_command's history file in tmp_path, not this machine's /var/lib/labctl."""
    path = tmp_path / "status" / "history.jsonl"
    monkeypatch.setattr(paths, "status_history", lambda: str(path))
    return path


@pytest.mark.usefixtures("recorded_nvidia_smi")
def test_status_sample_from_recorded_nvidia_smi_has_the_contracts_shape(history_in_tmp: Path) -> None:
    out = commands.resolve("monitor.status")({"cache_path": "/", "record": True})
    assert set(out) >= SAMPLE_KEYS
    assert json.loads(json.dumps(out)) == out  # the agent answers JSON
    assert out["gpu_source"] == "nvidia-smi" and out["gpu_error"] is None
    assert [set(g) for g in out["gpus"]] == [GPU_KEYS] * 3
    v100, p40, idle = out["gpus"]
    assert v100["power_w"] == pytest.approx(212.48) and p40["power_w"] == pytest.approx(148.02)
    assert idle["power_w"] is None
    assert v100["memory_used_bytes"] == 31500 * 1024**2 and v100["utilization_pct"] == 97
    assert out["cpu"]["count"] == os.cpu_count() and len(out["cpu"]["load"]) == 3
    assert 0 <= out["cpu"]["busy_pct"] <= 100
    mem = out["memory"]
    assert mem["total_bytes"] > 0 and mem["used_bytes"] == mem["total_bytes"] - mem["available_bytes"]
    assert out["cache"]["mounted"] is True and out["cache"]["size_bytes"] > 0
    # The sample was recorded: its record is the newest (and only) one of the history.
    assert [r["t"] for r in out["history"]] == [out["time"]]
    assert out["history"][0]["gpus"][0] == {
        "index": 0,
        "memory_used_pct": pytest.approx(96.13, abs=0.01),
        "utilization_pct": 97,
    }
    assert history_in_tmp.exists()


def test_status_sample_from_a_stand_in_nvml_has_power(
    monkeypatch: pytest.MonkeyPatch, history_in_tmp: Path
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", stand_in_nvml())
    out = agent_status.status_command({"cache_path": None, "record": False})
    assert out["gpu_source"] == "nvml" and out["cache"] is None
    assert [(g["index"], g["power_w"], g["temperature_c"]) for g in out["gpus"]] == [
        (0, 212.5, 50),
        (1, None, 51),
    ]
    assert out["history"] == [] and not history_in_tmp.exists()  # record: false writes nothing


def test_a_broken_nvidia_smi_is_a_gpu_error_not_a_failed_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, history_in_tmp: Path
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver'\nexit 9\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    out = agent_status.status_command({"record": False})
    assert out["gpus"] == [] and out["gpu_source"] == "none"
    assert "could not communicate with the driver" in out["gpu_error"]


def test_cache_state_of_a_folder_that_is_not_mounted(tmp_path: Path) -> None:
    assert agent_status.cache_state(str(tmp_path)) == {
        "path": str(tmp_path),
        "mounted": False,
        "size_bytes": None,
        "used_bytes": None,
    }


def test_meminfo_used_is_total_less_available() -> None:
    text = "MemTotal:       16384 kB\nMemFree:         1024 kB\nMemAvailable:    4096 kB\n"
    assert agent_status.memory_sample(text) == {
        "total_bytes": 16384 * 1024,
        "available_bytes": 4096 * 1024,
        "used_bytes": 12288 * 1024,
    }


def test_warm_models_from_the_orchestras_warm_json(tmp_path: Path) -> None:
    warm = tmp_path / "warm.json"
    warm.write_text(
        json.dumps(
            {
                "models": [
                    {"name": "Qwen2.5-7B", "gpu": 1, "port": 8101, "pid": 5, "state": "loaded", "since": 1.0}
                ],
                "warm_size": 5,
                "updated": 2.0,
            }
        )
    )
    assert agent_status.warm_models(str(warm)) == [{"model": "Qwen2.5-7B", "gpu": 1, "port": 8101}]
    warm.write_text("{not json")
    assert agent_status.warm_models(str(warm)) == []
    assert agent_status.warm_models(str(tmp_path / "none.json")) == []


# --- running training runs ------------------------------------------------------------------------


@pytest.fixture
def run_procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def start_run_process(run_id: str, host: str, cuda: str | None, into: list[subprocess.Popen[bytes]]) -> None:
    env = {**os.environ, "LABCTL_RUN_ID": run_id, "LABCTL_HOST": host}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if cuda is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda
    into.append(subprocess.Popen(["sleep", "60"], env=env))


def step(n: int, loss: float, **kw: Any) -> str:
    return json.dumps(
        {"event": "step", "step": n, "steps": 5000, "loss": loss, "lr": 1e-4, "tokens_per_s": 900.0, **kw}
    )


def own_runs(runs: list[dict[str, Any]], *ids: str) -> list[dict[str, Any]]:
    """The runs among `ids` that `running_runs` listed. A process with LABCTL_RUN_ID and no
    LABCTL_HOST counts on every host (a real host sets no LABCTL_HOST), so a trainer another
    xdist worker's test runs at the same time is listed too: it is not this test's to judge."""
    return [r for r in runs if r["run_id"] in ids]


def test_running_runs_read_progress_best_loss_and_nccl_errors(
    tmp_path: Path, run_procs: list[subprocess.Popen[bytes]]
) -> None:
    host = f"h-{uuid.uuid4().hex[:6]}"
    run_id = f"p2-{uuid.uuid4().hex[:6]}"
    start_run_process(run_id, host, "1,2", run_procs)
    start_run_process(run_id, host, "1,2", run_procs)
    start_run_process(run_id + "-other-host", host + "x", "0", run_procs)
    folder = tmp_path / run_id
    (folder / "torchrun" / "attempt_0" / "1").mkdir(parents=True)
    lines = [
        json.dumps({"event": "start"}),
        step(10, 3.0),
        step(20, 1.25),
        step(30, 1.5, grad_norm=0.7),
        "{cut",
    ]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "torchrun" / "attempt_0" / "1" / "stderr.log").write_text(
        "NCCL INFO Bootstrap : Using eth0\n"
        "m5:123:456 [1] misc/socket.cc:50 NCCL WARN Net : Connection closed by remote peer\n"
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, ncclRemoteError\n"
    )
    runs = own_runs(agent_status.running_runs(host, root_dir=str(tmp_path)), run_id, run_id + "-other-host")
    assert [r["run_id"] for r in runs] == [run_id]
    run = runs[0]
    assert set(run) >= RUN_KEYS
    assert (run["state"], run["step"], run["steps"], run["loss"], run["grad_norm"]) == (
        "running",
        30,
        5000,
        1.5,
        0.7,
    )
    assert (run["best_loss"], run["best_step"]) == (1.25, 20)
    assert run["nccl_errors"] == 2 and "ncclRemoteError" in run["last_nccl_error"]
    assert run["gpus"] == [1, 2] and run["started"] is not None


def test_a_detached_runs_progress_from_its_console_log(
    tmp_path: Path, run_procs: list[subprocess.Popen[bytes]]
) -> None:
    host = f"h-{uuid.uuid4().hex[:6]}"
    run_id = f"p1-{uuid.uuid4().hex[:6]}"
    start_run_process(run_id, host, "", run_procs)
    (tmp_path / run_id).mkdir()
    (tmp_path / run_id / "console.log").write_text(
        f"[rank0]:{step(5, 2.0)}\n[rank1]:{step(99, 0.1)}\nnoise\n"
    )
    (run,) = own_runs(agent_status.running_runs(host, root_dir=str(tmp_path)), run_id)
    assert (run["step"], run["loss"], run["nccl_errors"], run["last_nccl_error"]) == (5, 2.0, 0, None)
    assert run["gpus"] == []  # CUDA_VISIBLE_DEVICES="": a CPU run


def test_a_run_with_no_log_folder_still_shows(
    run_procs: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    host = f"h-{uuid.uuid4().hex[:6]}"
    start_run_process("r-nolog", host, None, run_procs)
    (run,) = own_runs(agent_status.running_runs(host, root_dir=str(tmp_path)), "r-nolog")
    assert (run["run_id"], run["step"], run["best_step"], run["gpus"]) == ("r-nolog", None, None, None)


# --- history --------------------------------------------------------------------------------------


def rec(t: float) -> dict[str, Any]:
    return {"t": t, "memory_used_bytes": 1, "gpus": []}


def test_history_appends_every_10_s_keeps_2_h_and_answers_65_min(tmp_path: Path) -> None:
    path = str(tmp_path / "status" / "history.jsonl")
    t0 = 1_800_000_000.0
    assert [r["t"] for r in agent_status.update_history(path, rec(t0), t0)] == [t0]
    # 5 s later: the newest is too recent, nothing is appended.
    assert [r["t"] for r in agent_status.update_history(path, rec(t0 + 5), t0 + 5)] == [t0]
    assert [r["t"] for r in agent_status.update_history(path, rec(t0 + 10), t0 + 10)] == [t0, t0 + 10]
    # 70 minutes on: both are kept on disk, but only the last 65 minutes are answered.
    later = t0 + 70 * 60
    assert [r["t"] for r in agent_status.update_history(path, rec(later), later)] == [later]
    assert len(Path(path).read_text().splitlines()) == 3
    # 2 h on, the old ones are pruned from the file itself.
    end = t0 + 2 * 3600 + 60
    agent_status.update_history(path, rec(end), end)
    assert [json.loads(line)["t"] for line in Path(path).read_text().splitlines()] == [later, end]
    # record None reads only.
    assert [r["t"] for r in agent_status.update_history(path, None, end + 1)] == [later, end]


def test_history_skips_a_line_cut_by_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text(json.dumps(rec(100.0)) + "\n" + '{"t": 110, "memory_us')
    assert [r["t"] for r in agent_status.update_history(str(path), rec(130.0), 130.0)] == [100.0, 130.0]


# Lines that parse as JSON but hold what no sample can (inf, nan, a time past the year 9999, a
# float count): each would fail the whole host's status, on the host or against the answer's shape.
DAMAGED = [
    '{"t": 1e999, "memory_used_bytes": 1, "gpus": []}',
    '{"t": -1e999, "memory_used_bytes": 1, "gpus": []}',
    '{"t": NaN, "memory_used_bytes": 1, "gpus": []}',
    '{"t": 1e300, "memory_used_bytes": 1, "gpus": []}',
    '{"t": true, "memory_used_bytes": 1, "gpus": []}',
    '{"t": 105.0, "m": 1e999, "boot": "b1", "memory_used_bytes": 1, "gpus": []}',
    '{"t": 105.0, "m": NaN, "boot": "b1", "memory_used_bytes": 1, "gpus": []}',
    '{"t": 105.0, "m": -Infinity, "boot": "b1", "memory_used_bytes": 1, "gpus": []}',
    '{"t": 105.0, "m": -1e300, "boot": "b1", "memory_used_bytes": 1, "gpus": []}',  # before the boot
    '{"t": 105.0, "memory_used_bytes": 1e999, "gpus": []}',
    '{"t": 105.0, "memory_used_bytes": 1.5, "gpus": []}',
    '{"t": 105.0, "memory_used_bytes": 1, "gpus": [{"index": 0, "memory_used_pct": NaN}]}',
    '{"t": 105.0, "memory_used_bytes": 1, "gpus": [{"index": 0, "utilization_pct": Infinity}]}',
    '{"t": 105.0, "memory_used_bytes": 1, "gpus": [{"index": 1e999}]}',
    '{"t": 105.0, "memory_used_bytes": 1, "gpus": {"0": 1}}',
    '{"t": 105.0, "note": 1e999}',
    '{"t": 110, "memory_us',  # cut by a crash, then appended to
    "[" * 5000,
]


def test_history_skips_and_counts_lines_holding_inf_nan_or_a_time_out_of_range(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    good = [
        dict(rec(100.0), m=900.0, boot="b1"),
        dict(rec(110.0), gpus=[{"index": 0, "memory_used_pct": 5.0}]),
    ]
    path.write_text("\n".join([json.dumps(good[0]), *DAMAGED, json.dumps(good[1])]) + "\n")
    clock = agent_status.Clock(130.0, 930.0, "b1")
    for record in (None, rec(130.0)):  # read only, then appending
        out = agent_status.update_history(str(path), record, 130.0, clock)
        samples = [r for r in out if "note" not in r]
        assert [r["t"] for r in samples] == [100.0, 110.0] + ([130.0] if record else [])
        notes = [r["note"] for r in out if "note" in r]
        assert notes == [f"{len(DAMAGED)} damaged line(s) of {path} skipped"]
    assert spec.problem(agent_status.STATUS["history?"], samples) is None


@pytest.mark.usefixtures("recorded_nvidia_smi")
def test_status_answers_with_a_history_holding_1e999(history_in_tmp: Path) -> None:
    history_in_tmp.parent.mkdir(parents=True)
    good = json.dumps(rec(time.time() - 30))
    history_in_tmp.write_text(f"{good}\n" + '{"t": 1e999, "memory_used_bytes": 1, "gpus": []}\n')
    out = commands.resolve("monitor.status")({"cache_path": "/", "record": True})
    assert len(out["history"]) == 2 and out["history_notes"] == [
        f"1 damaged line(s) of {history_in_tmp} skipped"
    ]
    assert answer_problem("monitor.status", out) is None


def _write_history(path: str, t: float, barrier: Any) -> None:
    barrier.wait()
    agent_status.update_history(path, rec(t), t)


@pytest.mark.parametrize("pruning", [False, True])
def test_history_writers_at_once_append_one_record_and_never_corrupt(tmp_path: Path, pruning: bool) -> None:
    path = tmp_path / "history.jsonl"
    now = 1_800_000_000.0
    # Enough records that reading them takes a while: writers without the lock would overlap.
    if pruning:
        old = [rec(now - 3 * 3600 + i * 0.1) for i in range(20000)]
    else:
        old = [rec(now - 3600 + i * 0.1) for i in range(20000)]
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(8)
    workers = [ctx.Process(target=_write_history, args=(str(path), now, barrier)) for _ in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
        assert w.exitcode == 0
    records = [json.loads(line) for line in path.read_text().splitlines()]  # every line whole
    assert [r["t"] for r in records].count(now) == 1
    assert len(records) == (1 if pruning else 20001)


def test_a_phase3_runs_newest_window_reaches_status() -> None:
    window = {
        "reward": 0.25,
        "exec_success_rate": 0.5,
        "rotation_wait_s": 0.7,
        "orchestra_ms": {"m": {"p50": 1.0}},
    }
    events = [json.loads(step(1, 3.0, **window)), json.loads(step(2, 2.5, reward=None, orchestra_ms={}))]
    got = agent_status.progress(events)
    # The newest step's figures, as they are (a window with nothing judged says None, not the old one).
    assert (got["step"], got["reward"], got["orchestra_ms"]) == (2, None, {})
    assert "rotation_wait_s" not in agent_status.progress([json.loads(step(1, 3.0))])
    assert agent_status.progress(events[:1])["rotation_wait_s"] == 0.7


def test_best_loss_passes_over_losses_that_are_no_number() -> None:
    # nan, inf, an int past a float's range and true, as a run's script may log them: none is the
    # best loss, and none may fail the host's status (best_loss is a finite number in the answer).
    events = [
        json.loads('{"step": 1, "loss": NaN}'),
        {"step": 2, "loss": 2.0},
        json.loads('{"step": 3, "loss": -1e999}'),
        {"step": 4, "loss": -(10**400)},
        {"step": 5, "loss": True},
    ]
    got = agent_status.progress(events)
    assert (got["best_loss"], got["best_step"]) == (2.0, 2)


def test_monitor_status_imports_no_facts_module() -> None:
    """The agent's `monitor.status` runs from source in a zip on every call, so each module it imports
    is compiled each time: it declares its GPUs with core/gpus.py's GPU, not through facts/collect.py
    (and its nics, storage, launch)."""
    code = (
        "import sys\n"
        "import labctl.agent.monitor.status\n"
        "print(sorted(m for m in sys.modules if m.startswith(('labctl.agent.facts.', 'labctl.agent.core.launch'))))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env=dict(os.environ, PYTHONPATH=str(root)),
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"
