"""labctl.monitor.metrics: samples in the status contract's shape → Prometheus series, read back
with prometheus_client's own parser."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from labctl.monitor import metrics
from labctl.monitor.alerts import Alert
from labctl.monitor.collect import HostStatus
from labctl.output.errors import InputError

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "labctl.json"
GIB = 1024**3


def gpu_sample() -> dict[str, Any]:
    """A training host as the agent's `monitor.status` command answers, every field the contract names."""
    return {
        "time": 1_790_000_000.0,
        "hostname": "m5",
        "cpu": {"count": 32, "load": [3.5, 2.0, 1.0], "busy_pct": 40.0},
        "memory": {"total_bytes": 128 * GIB, "available_bytes": 100 * GIB, "used_bytes": 28 * GIB},
        "cache": {"path": "/mnt/cache", "mounted": True, "size_bytes": 64 * GIB, "used_bytes": 60 * GIB},
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA GeForce RTX 4090",
                "uuid": "GPU-aaaa",
                "utilization_pct": 97,
                "memory_total_bytes": 24564 * 1024 * 1024,
                "memory_used_bytes": 20000 * 1024 * 1024,
                "temperature_c": 71,
                "power_w": 412.5,
            },
            {
                "index": 1,
                "name": "NVIDIA GeForce RTX 3090",
                "uuid": None,
                "utilization_pct": None,
                "memory_total_bytes": None,
                "memory_used_bytes": None,
                "temperature_c": None,
                "power_w": None,
            },
        ],
        "gpu_source": "nvml",
        "gpu_error": None,
        "warm": [{"model": "qwen-7b", "gpu": 0, "port": 8001}, {"model": "tiny", "gpu": None, "port": None}],
        "runs": [
            {
                "run_id": "r-20260101-abc",
                "state": "running",
                "step": 1200,
                "steps": 5000,
                "loss": 2.25,
                "lr": 3e-4,
                "tokens_per_s": 51234.5,
                "grad_norm": 0.8,
                "best_loss": 2.2,
                "best_step": 1100,
                "nccl_errors": 1,
                "last_nccl_error": "NCCL WARN timeout",
                # a phase-3 run: its newest step window (labctl/agent/train/phase3.py)
                "reward": 0.375,
                "exec_success_rate": 0.8,
                "rotation_wait_s": 1.25,
                "orchestra_ms": {
                    "qwen-7b": {"p50": 2100.0, "p95": 2900.5, "n": 4},
                    "tiny": {"p50": 90.0, "p95": None},
                },
            }
        ],
        "history": [],
    }


def bare_sample() -> dict[str, Any]:
    """A host with no GPU, no cache, no orchestra (the simulated lab's hosts)."""
    s = gpu_sample()
    s.update(hostname="cpu1", cache=None, gpus=[], gpu_source="none", gpu_error="no NVML", warm=[], runs=[])
    return s


def lab() -> list[HostStatus]:
    return [
        HostStatus(
            "m5",
            True,
            gpu_sample(),
            alerts=[
                Alert("nccl_errors", "m5", "critical", "1 NCCL error", 1, 0, run_id="r-20260101-abc"),
                Alert("gpu_memory", "m5", "warning", "GPU 0 at 96%", 96.0, 95.0, gpu=0),
            ],
        ),
        HostStatus("cpu1", True, bare_sample()),
        HostStatus("down1", False, None, error="connection refused", hint="start sshd", seconds=3.0),
    ]


def parsed(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def value(series: dict[str, Any], name: str, **labels: str) -> float:
    hits = [v for lab_, v in series.get(name, []) if all(lab_.get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, (name, labels, series.get(name))
    return hits[0]


def test_every_contract_series_comes_out_with_its_value_and_labels() -> None:
    s = parsed(metrics.exposition(lab()))
    gpu0 = {"host": "m5", "gpu": "0", "uuid": "GPU-aaaa", "model_name": "NVIDIA GeForce RTX 4090"}
    assert value(s, "labctl_dcgm_fi_dev_gpu_util", **gpu0) == 97
    assert value(s, "labctl_dcgm_fi_dev_fb_used", **gpu0) == 20000
    assert value(s, "labctl_dcgm_fi_dev_fb_free", **gpu0) == 4564
    assert value(s, "labctl_dcgm_fi_dev_gpu_temp", **gpu0) == 71
    assert value(s, "labctl_dcgm_fi_dev_power_usage", **gpu0) == 412.5
    assert value(s, "labctl_host_up", host="m5") == 1
    assert value(s, "labctl_host_up", host="cpu1") == 1
    assert value(s, "labctl_host_up", host="down1") == 0
    assert value(s, "labctl_host_load1", host="m5") == 3.5
    assert value(s, "labctl_host_memory_total_bytes", host="m5") == 128 * GIB
    assert value(s, "labctl_host_memory_available_bytes", host="m5") == 100 * GIB
    assert value(s, "labctl_model_cache_size_bytes", host="m5") == 64 * GIB
    assert value(s, "labctl_model_cache_used_bytes", host="m5") == 60 * GIB
    assert value(s, "labctl_orchestra_warm_models", host="m5") == 2
    assert value(s, "labctl_orchestra_warm_models", host="cpu1") == 0
    run = {"host": "m5", "run_id": "r-20260101-abc"}
    assert value(s, "labctl_train_step", **run) == 1200
    assert value(s, "labctl_train_loss", **run) == 2.25
    assert value(s, "labctl_train_tokens_per_second", **run) == 51234.5
    assert value(s, "labctl_phase3_reward", **run) == 0.375
    assert value(s, "labctl_phase3_exec_success_ratio", **run) == 0.8
    assert value(s, "labctl_phase3_rotation_wait_seconds", **run) == 1.25
    assert (
        value(s, "labctl_phase3_orchestra_latency_seconds", **run, model="qwen-7b", percentile="95") == 2.9005
    )
    assert value(s, "labctl_phase3_orchestra_latency_seconds", **run, model="tiny", percentile="50") == 0.09
    # A percentile the run did not report is left out, not exported as zero.
    rows = s["labctl_phase3_orchestra_latency_seconds"]
    assert [q["percentile"] for q, _ in rows if q["model"] == "tiny"] == ["50"]
    assert (
        value(
            s,
            "labctl_alert",
            host="m5",
            alert="nccl_errors",
            severity="critical",
            gpu="",
            run_id=run["run_id"],
        )
        == 1
    )
    assert (
        value(s, "labctl_alert", host="m5", alert="gpu_memory", severity="warning", gpu="0", run_id="") == 1
    )
    assert value(s, "labctl_scrape_seconds", host="down1") == 3.0


def test_a_reading_the_host_did_not_report_is_left_out_not_exported_as_zero() -> None:
    s = parsed(metrics.exposition(lab()))
    for name in (
        "labctl_dcgm_fi_dev_gpu_util",
        "labctl_dcgm_fi_dev_fb_used",
        "labctl_dcgm_fi_dev_fb_free",
        "labctl_dcgm_fi_dev_gpu_temp",
        "labctl_dcgm_fi_dev_power_usage",
    ):
        assert [lab_["gpu"] for lab_, _ in s[name]] == ["0"], name
    # no cache on cpu1, nothing at all but up and scrape time for the unreachable host
    assert {lab_["host"] for lab_, _ in s["labctl_model_cache_size_bytes"]} == {"m5"}
    for name, rows in s.items():
        if name not in ("labctl_host_up", "labctl_scrape_seconds"):
            assert all(lab_.get("host") != "down1" for lab_, _ in rows), name


def test_a_skipped_host_is_not_exported_as_down() -> None:
    skipped = HostStatus("win1", True, None, error="windows (the status agent is Linux-only)")
    s = parsed(metrics.exposition([*lab(), skipped]))
    assert all(lab_["host"] != "win1" for rows in s.values() for lab_, _ in rows)
    assert value(s, "labctl_host_up", host="down1") == 0


def test_textfile_lands_whole_under_a_name_node_exporter_reads(tmp_path: Path) -> None:
    path = metrics.check_textfile_dir(tmp_path)
    assert path == tmp_path / "labctl.prom"
    (tmp_path / "labctl.prom").write_text("# old\n")
    metrics.write_textfile(path, metrics.exposition(lab()))
    assert os.listdir(tmp_path) == ["labctl.prom"]  # no temporary *.prom left beside it
    assert "labctl_host_up" in parsed(path.read_text())


@pytest.mark.parametrize("make", ["missing", "file"])
def test_textfile_folder_that_is_not_one_is_an_input_error(tmp_path: Path, make: str) -> None:
    target = tmp_path / "textfile"
    if make == "file":
        target.write_text("")
    with pytest.raises(InputError) as err:
        metrics.check_textfile_dir(target)
    assert str(target) in err.value.paragraph() and "node_exporter" in err.value.paragraph()


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ("9835", ("127.0.0.1", 9835)),
        (":9835", ("127.0.0.1", 9835)),
        ("10.0.0.5:9100", ("10.0.0.5", 9100)),
        ("[::1]:9100", ("::1", 9100)),
        ("0.0.0.0:9100", ("0.0.0.0", 9100)),
    ],
)
def test_serve_address_defaults_to_loopback(given: str, want: tuple[str, int]) -> None:
    assert metrics.parse_listen(given) == want


@pytest.mark.parametrize("given", ["localhost:http", "1.2.3.4:0", "1.2.3.4:70000", "::1:9100", ""])
def test_serve_address_that_is_not_one_is_an_input_error(given: str) -> None:
    with pytest.raises(InputError) as err:
        metrics.parse_listen(given)
    assert "ADDR:PORT" in err.value.paragraph()


def test_serve_on_a_taken_port_is_an_input_error_not_a_traceback() -> None:
    server, _thread = metrics.serve("127.0.0.1", 0, lab, cache_seconds=0)
    try:
        port = server.server_address[1]
        with pytest.raises(InputError) as err:
            metrics.serve("127.0.0.1", port, lab, cache_seconds=0)
        assert f"127.0.0.1:{port}" in err.value.paragraph()
    finally:
        server.shutdown()
        server.server_close()


def test_serve_collects_on_scrape_and_nearby_scrapes_share_one_collection() -> None:
    import urllib.request

    calls: list[int] = []

    def source() -> list[HostStatus]:
        calls.append(1)
        return lab()

    server, _thread = metrics.serve("127.0.0.1", 0, source, cache_seconds=3600)
    try:
        assert calls == []  # starting the server asks no host
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        first = urllib.request.urlopen(url, timeout=10).read().decode()
        second = urllib.request.urlopen(url, timeout=10).read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert calls == [1]
    assert value(parsed(first), "labctl_host_up", host="down1") == 0
    assert first == second


def test_collections_further_apart_than_the_cache_ask_again() -> None:
    now = [0.0]
    calls: list[int] = []

    def source() -> list[HostStatus]:
        calls.append(1)
        return lab()

    c = metrics.LabCollector(source, cache_seconds=5, clock=lambda: now[0])
    list(c.collect())
    now[0] = 4.9
    list(c.collect())
    now[0] = 10.0
    list(c.collect())
    assert len(calls) == 2


# The dashboard: every series its PromQL names must be one the exporter emits.

PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
}


def dashboard_queries() -> list[str]:
    """PromQL in the dashboard: every panel target's expr and every query variable's query (a
    datasource variable's `query` is a plugin type, not PromQL)."""
    doc = json.loads(DASHBOARD.read_text())
    found: list[str] = []

    def panels(node: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        for p in node.get("panels") or []:
            out += [p, *panels(p)]  # rows hold panels of their own
        return out

    for p in panels(doc):
        found += [t["expr"] for t in p.get("targets") or []]
    for var in doc.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var["query"]
            found.append(q["query"] if isinstance(q, dict) else q)
    return found


def series_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana label_values() query) reads."""
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)  # label values, never names
    text = re.sub(r"\{[^}]*\}", "", text)  # matchers
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\$\{?\w+\}?", "", text)  # Grafana variables ($host, ${__interval})
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = m.group(0)
        follows = text[m.end() :].lstrip()[:1]
        if follows == "(" or word in PROMQL_WORDS or re.fullmatch(r"\d+[smhdwy]?", word):
            continue
        names.add(word)
    # label_values(metric, label): the label is not a series
    lv = re.match(r"\s*label_values\(\s*([A-Za-z_:][\w:]*)\s*(?:\{[^}]*\})?\s*,\s*(\w+)\s*\)", expr)
    if lv:
        names.discard(lv.group(2))
    return names


def test_series_names_reads_promql_as_prometheus_would() -> None:
    assert series_names('sum by (host) (rate(labctl_train_step{host=~"$host"}[5m]))') == {"labctl_train_step"}
    assert series_names("label_values(labctl_host_up, host)") == {"labctl_host_up"}
    assert series_names("a_metric / on(host) b_metric > 0.9") == {"a_metric", "b_metric"}


def test_dashboard_names_only_series_the_exporter_emits() -> None:
    emitted = set(parsed(metrics.exposition(lab())))
    queries = dashboard_queries()
    assert len(queries) >= 10
    used: set[str] = set()
    for q in queries:
        names = series_names(q)
        assert names, f"no series in {q!r}"
        assert names <= emitted, f"{q!r} names {sorted(names - emitted)}, not exported by labctl metrics"
        used |= names
    # a series the exporter adds later should get a panel: say which ones have none
    assert emitted - used <= {"labctl_scrape_seconds"}, sorted(emitted - used)


def test_exposition_passes_promtool_lint_and_dashboard_promql_parses(tmp_path: Path) -> None:
    """promtool (Debian package prometheus) lints the exposition and parses every dashboard query
    as Prometheus itself would, through a rules file of one recording rule per query."""
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    lint = subprocess.run(
        [promtool, "check", "metrics"], input=metrics.exposition(lab()), capture_output=True, text=True
    )
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint
    rules = [
        {"record": f"labctl:dashboard_query:{i}", "expr": q.replace("$host", ".*")}
        for i, q in enumerate(dashboard_queries())
        if not q.lstrip().startswith("label_values(")  # Grafana's, not PromQL
    ]
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))  # JSON is YAML
    check = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
