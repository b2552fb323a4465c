"""`labctl metrics` against the simulated lab, read by its real consumers where they are installed:
Debian's prometheus-node-exporter (textfile collector) and prometheus (scraping --serve)."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional, TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, labctl

pytestmark = pytest.mark.integration

T = TypeVar("T")
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
PROMETHEUS = shutil.which("prometheus")
WAIT_S = 60.0


def series(text: str) -> dict[str, dict[str, float]]:
    """{name: {host: value}} for labctl's host-labelled series."""
    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if "host" in s.labels:
                out.setdefault(s.name, {})[s.labels["host"]] = s.value
    return out


def watched(lab: Any) -> list[str]:
    """The sim hosts labctl's status agent runs on (the inventory's Windows host is skipped)."""
    from labctl.inventory.load import load_inventory

    return [h.name for h in load_inventory(lab.inventory_path).hosts.values() if not h.is_windows]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Background:
    """A process whose output goes to a file: a pipe nobody reads (prometheus logs a lot) would stall it."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT, text=True, cwd=REPO)

    def output(self) -> str:
        self._out.flush()
        return self.log.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()


def wait_for(what: str, probe: Callable[[], Optional[T]], bg: Background) -> T:
    """Poll `provision.probe` until it returns something; fail naming `what` with the process's output."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if bg.proc.poll() is not None:
            pytest.fail(f"{what}: the process exited {bg.proc.returncode}:\n{bg.output()}")
        try:
            got = probe()
        except OSError:
            got = None
        if got is not None:
            return got
        time.sleep(0.2)
    pytest.fail(f"{what}: nothing within {WAIT_S:.0f} s:\n{bg.output()}")


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


@contextmanager
def background(log: Path, *argv: str) -> Iterator[Background]:
    bg = Background(list(argv), log)
    try:
        yield bg
    finally:
        bg.stop()


def test_textfile_carries_every_sim_host_and_node_exporter_reads_it(lab: Any, tmp_path: Path) -> None:
    proc = labctl("-i", str(lab.inventory_path), "metrics", "--textfile", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["labctl.prom"]
    text = (tmp_path / "labctl.prom").read_text()
    s = series(text)
    hosts = watched(lab)
    assert len(hosts) >= 2 and s["labctl_host_up"] == dict.fromkeys(hosts, 1.0)
    for name in ("labctl_host_load1", "labctl_host_memory_total_bytes", "labctl_host_memory_available_bytes"):
        assert set(s[name]) == set(hosts), name
    assert all(v > 0 for v in s["labctl_host_memory_total_bytes"].values())
    if NODE_EXPORTER is None:
        pytest.skip("prometheus-node-exporter not installed (apt-get install prometheus-node-exporter)")
    port = free_port()
    with background(
        tmp_path / "node-exporter.log",
        NODE_EXPORTER,
        "--collector.disable-defaults",
        "--collector.textfile",
        f"--collector.textfile.directory={tmp_path}",
        f"--web.listen-address=127.0.0.1:{port}",
    ) as exporter:
        page = wait_for("node_exporter's /metrics", lambda: get(f"http://127.0.0.1:{port}/metrics"), exporter)
    read = series(page)
    assert read["labctl_host_up"] == dict.fromkeys(hosts, 1.0)
    errors = [
        s.value
        for fam in text_string_to_metric_families(page)
        for s in fam.samples
        if s.name == "node_textfile_scrape_error"
    ]
    assert errors == [0.0], page


def test_a_stopped_host_is_exported_down_and_the_command_exits_1(lab: Any, tmp_path: Path) -> None:
    hosts = watched(lab)
    down = hosts[-1]
    assert lab.stop_host(down)
    try:
        proc = labctl("-i", str(lab.inventory_path), "metrics", "--textfile", str(tmp_path))
    finally:
        lab.start_host(down)
    assert proc.returncode == 1, proc.stderr
    assert f"{down}: unreachable" in proc.stderr and "Traceback" not in proc.stderr
    up = series((tmp_path / "labctl.prom").read_text())["labctl_host_up"]
    assert up == {**dict.fromkeys(hosts, 1.0), down: 0.0}


def test_serve_answers_scrapes_and_prometheus_scrapes_it(lab: Any, tmp_path: Path) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "labctl", "-i", str(lab.inventory_path), "metrics", "--serve", str(port)]
    with background(tmp_path / "labctl.log", *cmd) as served:
        page = wait_for("labctl metrics --serve", lambda: get(f"http://127.0.0.1:{port}/metrics"), served)
        hosts = watched(lab)
        assert series(page)["labctl_host_up"] == dict.fromkeys(hosts, 1.0)
        if PROMETHEUS is not None:
            samples = scraped_by_prometheus(port, tmp_path)
        served.proc.send_signal(signal.SIGINT)
        served.proc.wait(timeout=30)
        assert served.proc.returncode == 0, served.output()
        assert f"serving http://127.0.0.1:{port}/metrics" in served.output()
    if PROMETHEUS is None:
        pytest.skip("prometheus not installed (apt-get install prometheus): served page checked only")
    assert {r["metric"]["host"]: r["value"][1] for r in samples} == dict.fromkeys(hosts, "1")


def scraped_by_prometheus(port: int, tmp_path: Path) -> list[dict[str, Any]]:
    assert PROMETHEUS is not None
    web = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: labctl\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
    )
    query = urllib.parse.urlencode({"query": 'labctl_host_up{job="labctl"}'})

    def answered() -> Optional[list[dict[str, Any]]]:
        doc = json.loads(get(f"http://127.0.0.1:{web}/api/v1/query?{query}"))
        return doc["data"]["result"] or None

    with background(
        tmp_path / "prometheus.log",
        PROMETHEUS,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{web}",
    ) as prom:
        return wait_for("prometheus scraping labctl", answered, prom)
