"""`labctl metrics`: the lab's status samples as Prometheus series.

One set of families serves both forms: the textfile node_exporter reads and the /metrics page
Prometheus scrapes. Per-GPU series keep the DCGM exporter's names (lower-cased, after the
`labctl_` prefix) so dashboards and alert rules written for DCGM read these with a prefix change.
A value the host did not report (no NVML, no cache) is left out rather than exported as 0,
which a dashboard would show as a real reading.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from labctl.monitor.alerts import reading
from labctl.output.errors import InputError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from labctl.monitor.collect import HostStatus

TEXTFILE_NAME = "labctl.prom"
MIB = 1024 * 1024
DEFAULT_PORT = 9835
GPU_LABELS = ("host", "gpu", "uuid", "model_name")
RUN_LABELS = ("host", "run_id")
ALERT_LABELS = ("host", "alert", "severity", "gpu", "run_id")


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def families(statuses: Iterable[HostStatus]) -> list[Metric]:
    """Every labctl series for these host statuses, as prometheus_client metric families."""
    from prometheus_client.core import GaugeMetricFamily

    def gauge(name: str, doc: str, labels: Sequence[str] = ("host",), unit: str = "") -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=list(labels), unit=unit)

    up = gauge("labctl_host_up", "1 when labctl's agent answered on the host, else 0.")
    scrape = gauge("labctl_scrape_seconds", "Seconds the host's status call took.")
    load1 = gauge("labctl_host_load1", "1-minute load average.")
    mem_total = gauge("labctl_host_memory_total_bytes", "Host RAM in bytes.")
    mem_avail = gauge("labctl_host_memory_available_bytes", "Host RAM available in bytes.")
    cache_size = gauge("labctl_model_cache_size_bytes", "Size of the host's model cache mount in bytes.")
    cache_used = gauge("labctl_model_cache_used_bytes", "Bytes used in the host's model cache mount.")
    warm = gauge("labctl_orchestra_warm_models", "Models the orchestra keeps warm on the host.")
    util = gauge(
        "labctl_dcgm_fi_dev_gpu_util", "GPU utilization (in %), as DCGM_FI_DEV_GPU_UTIL.", GPU_LABELS
    )
    fb_used = gauge(
        "labctl_dcgm_fi_dev_fb_used", "GPU framebuffer used (in MiB), as DCGM_FI_DEV_FB_USED.", GPU_LABELS
    )
    fb_free = gauge(
        "labctl_dcgm_fi_dev_fb_free", "GPU framebuffer free (in MiB), as DCGM_FI_DEV_FB_FREE.", GPU_LABELS
    )
    temp = gauge(
        "labctl_dcgm_fi_dev_gpu_temp", "GPU temperature (in C), as DCGM_FI_DEV_GPU_TEMP.", GPU_LABELS
    )
    power = gauge(
        "labctl_dcgm_fi_dev_power_usage", "GPU power draw (in W), as DCGM_FI_DEV_POWER_USAGE.", GPU_LABELS
    )
    step = gauge("labctl_train_step", "Last step a running training run reported.", RUN_LABELS)
    loss = gauge("labctl_train_loss", "Last loss a running training run reported.", RUN_LABELS)
    tps = gauge("labctl_train_tokens_per_second", "Tokens per second of a running training run.", RUN_LABELS)
    alert = gauge("labctl_alert", "1 per alert firing now (rules in playbooks/alerts.yaml).", ALERT_LABELS)
    # Phase 3's loop, over the run's newest step event: the seed's four phase-3 panels.
    reward = gauge(
        "labctl_phase3_reward",
        "Pass rate of the code the warm set wrote from the CET's contexts.",
        RUN_LABELS,
    )
    exec_ok = gauge(
        "labctl_phase3_exec_success_ratio", "Share of test executions that ran to exit 0 in time.", RUN_LABELS
    )
    rot_wait = gauge(
        "labctl_phase3_rotation_wait_seconds",
        "Seconds the run's steps lost to a rotation, newest window.",
        RUN_LABELS,
    )
    # A host that trains keeps its own ledger of remote tiers' spend (agent/orchestra/spend.py).
    spend = gauge(
        "labctl_remote_spend_usd",
        "Dollars spent on a remote tier by the host's trainers in the month (UTC).",
        ("host", "tier", "month"),
    )
    budget = gauge(
        "labctl_remote_budget_usd",
        "A remote tier's budget_per_month: past it, the host's trainers stop asking it for the month.",
        ("host", "tier", "month"),
    )
    latency = gauge(
        "labctl_phase3_orchestra_latency_seconds",
        "Orchestra answer latency per model (percentile 50 or 95), newest window.",
        (*RUN_LABELS, "model", "percentile"),
    )

    for st in statuses:
        host = st.host
        sample = st.sample if st.reachable and isinstance(st.sample, dict) else None
        if st.reachable and sample is None:
            continue  # skipped, not down: a host labctl does not watch (Windows) gets no series
        up.add_metric([host], 1.0 if sample is not None else 0.0)
        scrape.add_metric([host], float(st.seconds))
        for a in st.alerts:
            alert.add_metric([a.host or host, a.name, a.severity, _text(a.gpu), _text(a.run_id)], 1.0)
        if sample is None:
            continue
        cpu = sample.get("cpu") or {}
        loads = cpu.get("load") or []
        if loads and reading(loads[0]) is not None:
            load1.add_metric([host], float(loads[0]))
        memory = sample.get("memory") or {}
        for fam, key in ((mem_total, "total_bytes"), (mem_avail, "available_bytes")):
            if (v := reading(memory.get(key))) is not None:
                fam.add_metric([host], v)
        cache = sample.get("cache") or {}
        for fam, key in ((cache_size, "size_bytes"), (cache_used, "used_bytes")):
            if (v := reading(cache.get(key))) is not None:
                fam.add_metric([host], v)
        if isinstance(sample.get("warm"), list):
            warm.add_metric([host], float(len(sample["warm"])))
        for g in sample.get("gpus") or []:
            labels = [host, _text(g.get("index")), _text(g.get("uuid")), _text(g.get("name"))]
            total, used = reading(g.get("memory_total_bytes")), reading(g.get("memory_used_bytes"))
            if used is not None:
                fb_used.add_metric(labels, used / MIB)
                if total is not None:
                    fb_free.add_metric(labels, max(total - used, 0.0) / MIB)
            for fam, key in ((util, "utilization_pct"), (temp, "temperature_c"), (power, "power_w")):
                if (v := reading(g.get(key))) is not None:
                    fam.add_metric(labels, v)
        for r in sample.get("runs") or []:
            labels = [host, _text(r.get("run_id"))]
            for fam, key in (
                (step, "step"),
                (loss, "loss"),
                (tps, "tokens_per_s"),
                (reward, "reward"),
                (exec_ok, "exec_success_rate"),
                (rot_wait, "rotation_wait_s"),
            ):
                if (v := reading(r.get(key))) is not None:
                    fam.add_metric(labels, v)
            models = r.get("orchestra_ms")
            for model, ms in sorted(models.items()) if isinstance(models, dict) else []:
                for q, key in (("50", "p50"), ("95", "p95")):
                    if isinstance(ms, dict) and (v := reading(ms.get(key))) is not None:
                        latency.add_metric([*labels, _text(model), q], v / 1000.0)
        remote = sample.get("remote_spend")
        if isinstance(remote, dict):
            month = _text(remote.get("month"))
            for t in remote.get("tiers") or []:
                labels = [host, _text(t.get("tier")), month]
                if (v := reading(t.get("usd"))) is not None:
                    spend.add_metric(labels, v)
                if (v := reading(t.get("budget_per_month"))) is not None:
                    budget.add_metric(labels, v)
    return [
        up, scrape, load1, mem_total, mem_avail, cache_size, cache_used, warm,
        util, fb_used, fb_free, temp, power, step, loss, tps, alert, reward, exec_ok, rot_wait, latency,
        spend, budget,
    ]  # fmt: skip


class LabCollector:
    """A prometheus_client collector over a function that returns host statuses.

    `--serve` collects on each scrape; scrapes closer together than `cache_seconds` (two
    Prometheus servers, a browser tab) share one collection, and the lock keeps two scrapes from
    using the connection pool at once.
    """

    def __init__(
        self,
        source: Callable[[], Sequence[HostStatus]],
        cache_seconds: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._cache_seconds = cache_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._at: Optional[float] = None
        self._statuses: Sequence[HostStatus] = ()

    def statuses(self) -> Sequence[HostStatus]:
        with self._lock:
            now = self._clock()
            if self._at is None or now - self._at >= self._cache_seconds:
                self._statuses = self._source()
                self._at = self._clock()
            return self._statuses

    def collect(self) -> Iterator[Metric]:
        yield from families(self.statuses())


def registry(source: Callable[[], Sequence[HostStatus]], cache_seconds: float = 0.0) -> CollectorRegistry:
    from prometheus_client import CollectorRegistry

    # auto_describe off: registering must not collect (that would be a round of SSH calls)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(LabCollector(source, cache_seconds))
    return reg


def exposition(statuses: Sequence[HostStatus]) -> str:
    """The Prometheus text format for these statuses."""
    from prometheus_client import generate_latest

    return generate_latest(registry(lambda: statuses)).decode()


def check_textfile_dir(directory: Path) -> Path:
    """The file `--textfile DIR` writes; an InputError before any host is asked when DIR is unusable."""
    import os

    hint = (
        "Give the folder node_exporter reads (its --collector.textfile.directory, "
        "/var/lib/prometheus/node-exporter on Debian)."
    )
    if not directory.is_dir():
        what = "is not a folder" if directory.exists() else "does not exist"
        raise InputError(f"--textfile {directory} {what}.", hint + " labctl does not create it.")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InputError(f"--textfile {directory}: this user cannot write there.", hint)
    return directory / TEXTFILE_NAME


def write_textfile(path: Path, text: str) -> None:
    """node_exporter reads every *.prom file: written beside it under a hidden name, fsynced, then
    renamed over it. A write that fails (a full or read-only folder) leaves the old file whole and
    no hidden file behind, and is named with its fix."""
    from labctl.output.files import write_output

    write_output(path, text, flag="--textfile")


def parse_listen(value: str) -> tuple[str, int]:
    """`ADDR:PORT`, `[V6]:PORT`, `:PORT` or `PORT` → (address, port); loopback when no address."""
    text = value.strip()
    addr, sep, port_text = text.rpartition(":")
    if not sep:
        addr, port_text = "", text
    bracketed = addr.startswith("[") and addr.endswith("]")
    if bracketed:
        addr = addr[1:-1]
    hint = "Write it as ADDR:PORT (127.0.0.1:9835, [::1]:9835) or PORT alone for loopback."
    try:
        port = int(port_text)
    except ValueError:
        raise InputError(f"--serve {value!r}: {port_text!r} is not a port number.", hint) from None
    if not 0 < port < 65536:
        raise InputError(f"--serve {value!r}: port {port} is outside 1-65535.", hint)
    if not addr:
        return "127.0.0.1", port
    if ":" in addr:
        if not bracketed:
            raise InputError(f"--serve {value!r}: an IPv6 address goes in brackets before the port.", hint)
        try:
            ipaddress.IPv6Address(addr)
        except ValueError:
            raise InputError(f"--serve {value!r}: {addr!r} is not an IP address.", hint) from None
    return addr, port


def serve(
    addr: str, port: int, source: Callable[[], Sequence[HostStatus]], cache_seconds: float
) -> tuple[Any, threading.Thread]:
    """Start the /metrics HTTP server in a thread; an InputError when the address cannot be bound."""
    from prometheus_client import start_http_server

    try:
        return start_http_server(port, addr=addr, registry=registry(source, cache_seconds))
    except OSError as exc:
        raise InputError(
            f"--serve {addr}:{port}: cannot listen there ({exc.strerror or exc}).",
            "Pick a free port, or an address this machine has (127.0.0.1 by default).",
        ) from None
