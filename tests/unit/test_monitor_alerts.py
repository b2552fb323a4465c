"""Alerts judged from constructed `monitor.status` samples (the agent's shape, see labctl/agent/monitor/status.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from labctl.documents.starter import write_starter
from labctl.documents.validation import DocumentError
from labctl.monitor.alerts import Alert, evaluate, growth_per_hour, load_rules
from labctl.output.errors import InputError

GiB = 1024**3
NOW = 1_800_000_000.0
REPO = Path(__file__).resolve().parents[2]


def gpu(
    index: int = 0, used_pct: float = 10.0, util: int | None = 90, temp: int | None = 60
) -> dict[str, Any]:
    total = 32 * GiB
    return {
        "index": index,
        "name": "Tesla V100-PCIE-32GB",
        "uuid": f"GPU-{index}",
        "utilization_pct": util,
        "memory_total_bytes": total,
        "memory_used_bytes": int(total * used_pct / 100),
        "temperature_c": temp,
        "power_w": 250.0,
    }


def sample(
    gpus: list[dict[str, Any]] | None = None,
    history: list[dict[str, Any]] | None = None,
    runs: list[dict[str, Any]] | None = None,
    cache: dict[str, Any] | None = None,
    used_bytes: int = 10 * GiB,
) -> dict[str, Any]:
    return {
        "time": NOW,
        "hostname": "m5",
        "cpu": {"count": 8, "load": [1.0, 1.0, 1.0], "busy_pct": 12.5},
        "memory": {
            "total_bytes": 256 * GiB,
            "available_bytes": 256 * GiB - used_bytes,
            "used_bytes": used_bytes,
        },
        "cache": cache,
        "gpus": gpus or [],
        "gpu_source": "nvml" if gpus else "none",
        "gpu_error": None,
        "warm": [],
        "runs": runs or [],
        "history": history or [],
    }


def gpu_history(
    minutes: float, pct: float = 0.0, util: int | None = None, every_s: int = 10
) -> list[dict[str, Any]]:
    """One record every `every_s` s over the last `minutes` (the newest at NOW)."""
    out = []
    n = int(minutes * 60 // every_s)
    for i in range(n, -1, -1):
        out.append(
            {
                "t": NOW - i * every_s,
                "memory_used_bytes": 10 * GiB,
                "gpus": [{"index": 0, "memory_used_pct": pct, "utilization_pct": util}],
            }
        )
    return out


def run(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "run_id": "r1",
        "state": "running",
        "step": 100,
        "steps": 5000,
        "loss": 2.0,
        "lr": 1e-4,
        "tokens_per_s": 1000.0,
        "grad_norm": 1.0,
        "best_loss": 2.0,
        "best_step": 100,
        "nccl_errors": 0,
        "last_nccl_error": None,
        "gpus": [0],
        "started": NOW - 3600,
    }
    base.update(kw)
    return base


def names(alerts: list[Alert]) -> list[str]:
    return [a.name for a in alerts]


RULES = load_rules(None)


def test_packaged_defaults_are_seed_004s_thresholds() -> None:
    r = RULES
    assert (r.gpu_memory.above_pct, r.gpu_memory.for_minutes) == (95, 5)
    assert (r.gpu_idle_while_training.below_pct, r.gpu_idle_while_training.for_minutes) == (50, 5)
    assert (r.gpu_temperature.above_c, r.gpu_temperature.severity) == (85, "critical")
    assert r.host_memory_growth.above_gb_per_hour == 2
    assert r.nccl_errors.severity == "critical"
    assert r.loss_stalled.steps == 1000
    assert r.model_cache_full.above_pct == 90
    # The repository's playbooks/alerts.yaml is the packaged file itself.
    assert (REPO / "playbooks/alerts.yaml").read_bytes() == (
        REPO / "labctl/data/playbooks/alerts.yaml"
    ).read_bytes()


def test_init_writes_the_alerts_file(tmp_path: Path) -> None:
    written = write_starter(tmp_path / "lab")
    path = tmp_path / "lab/playbooks/alerts.yaml"
    assert path in written
    assert load_rules(path) == RULES


def test_gpu_memory_above_95_for_5_minutes() -> None:
    full = [gpu(used_pct=97)]
    assert names(evaluate("m5", sample(full, gpu_history(6, pct=97)), RULES)) == ["gpu_memory"]
    alert = evaluate("m5", sample(full, gpu_history(6, pct=97)), RULES)[0]
    assert (alert.host, alert.gpu, alert.severity, alert.threshold) == ("m5", 0, "warning", 95)
    assert alert.value == pytest.approx(97, abs=0.1)


def test_gpu_memory_above_95_for_less_than_5_minutes_is_quiet() -> None:
    full = [gpu(used_pct=97)]
    # Full for the last 4 minutes only: below 95% before that.
    history = gpu_history(10, pct=50)
    for record in history:
        if record["t"] >= NOW - 240:
            record["gpus"][0]["memory_used_pct"] = 97
    assert evaluate("m5", sample(full, history), RULES) == []
    # And no history at all (a fresh host): the current sample alone is no 5 minutes.
    assert evaluate("m5", sample(full), RULES) == []


def test_gpu_memory_dip_in_the_window_restarts_the_count() -> None:
    history = gpu_history(10, pct=97)
    history[-5]["gpus"][0]["memory_used_pct"] = 80  # 40 s ago
    assert evaluate("m5", sample([gpu(used_pct=97)], history), RULES) == []


def test_gpu_memory_full_long_ago_but_not_now_is_quiet() -> None:
    assert evaluate("m5", sample([gpu(used_pct=50)], gpu_history(10, pct=99)), RULES) == []


def test_gpu_idle_while_a_run_trains_on_it() -> None:
    idle = [gpu(util=10), gpu(index=1, util=0)]
    history = gpu_history(6, util=10)
    alerts = evaluate("m5", sample(idle, history, runs=[run(gpus=[0])]), RULES)
    # GPU 1 is not the run's (an orchestra P40): only GPU 0 alerts.
    assert [(a.name, a.gpu) for a in alerts] == [("gpu_idle_while_training", 0)]
    # No run: idle is fine.
    assert evaluate("m5", sample(idle, history), RULES) == []
    # The run started 2 minutes ago: idle before it does not count.
    assert evaluate("m5", sample(idle, history, runs=[run(gpus=[0], started=NOW - 120)]), RULES) == []
    # A run without CUDA_VISIBLE_DEVICES sees every GPU (GPU 1 has no history: too short).
    every = evaluate("m5", sample(idle, history, runs=[run(gpus=None)]), RULES)
    assert [(a.name, a.gpu) for a in every] == [("gpu_idle_while_training", 0)]


def test_gpu_temperature_above_85() -> None:
    alerts = evaluate("m5", sample([gpu(temp=86), gpu(index=1, temp=85), gpu(index=2, temp=None)]), RULES)
    assert [(a.name, a.gpu, a.severity, a.value) for a in alerts] == [
        ("gpu_temperature", 0, "critical", 86.0)
    ]


def memory_history(gb_per_hour: float, minutes: float, every_s: int = 30) -> list[dict[str, Any]]:
    out = []
    n = int(minutes * 60 // every_s)
    for i in range(n, -1, -1):
        t = NOW - i * every_s
        out.append(
            {"t": t, "memory_used_bytes": int(10 * GiB + gb_per_hour * GiB * (t - NOW) / 3600), "gpus": []}
        )
    return out


def test_host_memory_growing_over_2_gb_per_hour() -> None:
    alerts = evaluate("m5", sample(history=memory_history(3, 60)), RULES)
    assert names(alerts) == ["host_memory_growth"]
    assert alerts[0].value == pytest.approx(3, rel=0.01)
    assert alerts[0].threshold == 2
    assert evaluate("m5", sample(history=memory_history(1.5, 60)), RULES) == []
    assert evaluate("m5", sample(history=memory_history(-3, 60)), RULES) == []


def test_host_memory_jump_over_a_short_stretch_is_not_a_rate() -> None:
    # 1 GB in 5 minutes reads as 12 GB/hour, but 5 minutes is under half the 60-minute window.
    assert evaluate("m5", sample(history=memory_history(12, 5)), RULES) == []


def test_growth_per_hour_is_the_least_squares_slope() -> None:
    assert growth_per_hour([(0.0, 0.0), (1800.0, 1.0), (3600.0, 2.0)]) == pytest.approx(2.0)
    assert growth_per_hour([(0.0, 5.0)]) is None
    assert growth_per_hour([(7.0, 5.0), (7.0, 9.0)]) is None


def test_nccl_errors_in_a_run() -> None:
    line = "[rank1]: NCCL WARN Net : Connection closed by remote peer"
    alerts = evaluate("m5", sample(runs=[run(nccl_errors=2, last_nccl_error=line)]), RULES)
    assert [(a.name, a.severity, a.run_id, a.value) for a in alerts] == [
        ("nccl_errors", "critical", "r1", 2.0)
    ]
    assert line in alerts[0].message


def test_loss_not_improving_for_1000_steps() -> None:
    stalled = run(step=2100, best_step=1100, best_loss=1.5, loss=1.7)
    alerts = evaluate("m5", sample(runs=[stalled]), RULES)
    assert [(a.name, a.run_id, a.value, a.threshold) for a in alerts] == [
        ("loss_stalled", "r1", 1000.0, 1000.0)
    ]
    assert evaluate("m5", sample(runs=[run(step=2099, best_step=1100)]), RULES) == []


def test_model_cache_over_90_pct() -> None:
    def cache(used: float, mounted: bool = True) -> dict[str, Any]:
        return {
            "path": "/mnt/model-cache",
            "mounted": mounted,
            "size_bytes": 100 * GiB,
            "used_bytes": int(used * GiB),
        }

    alerts = evaluate("m5", sample(cache=cache(95)), RULES)
    assert [(a.name, a.value) for a in alerts] == [("model_cache_full", 95.0)]
    assert evaluate("m5", sample(cache=cache(90)), RULES) == []
    assert evaluate("m5", sample(cache=cache(95, mounted=False)), RULES) == []


def test_edited_thresholds_and_disabled_rules(tmp_path: Path) -> None:
    path = tmp_path / "alerts.yaml"
    path.write_text(
        "alerts:\n  gpu_temperature: {above_c: 70, severity: warning}\n  nccl_errors: {enabled: false}\n"
    )
    rules = load_rules(path)
    alerts = evaluate("m5", sample([gpu(temp=75)], runs=[run(nccl_errors=1, gpus=[])]), rules)
    assert [(a.name, a.severity) for a in alerts] == [("gpu_temperature", "warning")]
    assert rules.gpu_memory == RULES.gpu_memory  # rules not named keep their defaults


def test_to_json_has_the_contracts_keys() -> None:
    alert = evaluate("m5", sample([gpu(temp=90)]), RULES)[0]
    assert alert.to_json() == {
        "name": "gpu_temperature",
        "host": "m5",
        "severity": "critical",
        "message": alert.message,
        "value": 90.0,
        "threshold": 85.0,
        "gpu": 0,
        "run_id": None,
    }


@pytest.mark.parametrize(
    ("text", "line", "expect"),
    [
        (
            "alerts:\n  gpu_memory: {above_pct: 95}\n  gpu_temprature: {above_c: 80}\n",
            3,
            "Did you mean 'gpu_temperature'",
        ),
        ("alerts:\n  gpu_memory:\n    above_pct: 150\n", 3, "above_pct"),
        ("alerts:\n  loss_stalled: {steps: 100, severity: page}\n", 2, "severity"),
        ("alerts:\n  nccl_errors: {enabled: maybe}\n", 2, "enabled"),
        ("alerts:\n  model_cache_full: {above_pct: .nan}\n", 2, ".nan is not a number"),
    ],
)
def test_bad_alerts_file_names_file_line_and_field(tmp_path: Path, text: str, line: int, expect: str) -> None:
    path = tmp_path / "alerts.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_rules(path)
    assert info.value.exit_code == 2
    assert f"{path}:{line}:" in info.value.message
    assert expect in info.value.message


def test_missing_or_non_mapping_alerts_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="No alerts file"):
        load_rules(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(DocumentError, match="mapping"):
        load_rules(tmp_path / "list.yaml")


def test_rules_for_takes_the_given_file_the_found_one_or_the_packaged_defaults(
    tmp_path: Path, monkeypatch: Any
) -> None:
    from labctl.monitor.alerts import rules_for
    from labctl.output.errors import InputError

    monkeypatch.chdir(tmp_path)
    inv = tmp_path / "lab" / "lab.yaml"
    inv.parent.mkdir()
    inv.write_text("lab: x\nhosts: {}\n")
    assert rules_for(None, inv) == load_rules(None)  # nothing found: seed 004's thresholds
    book = tmp_path / "lab" / "playbooks" / "alerts.yaml"
    book.parent.mkdir()
    book.write_text("alerts:\n  gpu_temperature: {above_c: 70}\n")
    assert rules_for(None, inv).gpu_temperature.above_c == 70
    book.write_text("alerts:\n  gpu_temprature: {above_c: 70}\n")
    with pytest.raises(InputError):  # a broken file found is an error, never the defaults
        rules_for(None, inv)
