"""monitor.collect against the simulated lab over real SSH: a sample and alerts per host, one
pooled connection per host across rounds, a stopped host reported (not raised) and seen again
once it is back, and a training run's processes and NCCL errors found on its own host."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from labctl.agent.core.paths import STATUS_HISTORY
from labctl.agent.monitor.status import HISTORY_EVERY_S
from labctl.hosts.context import Context
from labctl.monitor.alerts import load_rules
from labctl.monitor.collect import HostStatus, collect
from tests.conftest import sh

pytestmark = pytest.mark.integration

RULES = load_rules(None)


@pytest.fixture
def ctx(lab: Any) -> Iterator[Context]:
    c = Context.create(inventory_path=lab.inventory_path)
    try:
        yield c
    finally:
        c.close()


def by_host(rows: list[HostStatus]) -> dict[str, HostStatus]:
    return {r.host: r for r in rows}


def test_collect_samples_every_host_and_keeps_connections_between_rounds(lab: Any, ctx: Context) -> None:
    hosts = list(ctx.inventory.hosts.values())
    windows = {h.name for h in hosts if h.is_windows}
    # Earlier tests' rounds left samples in the hosts' histories: start from none, so this round's
    # sample must be the one recorded.
    for h in hosts:
        if h.name not in windows:
            sh(lab.inventory_path, h.name, f"rm -f {STATUS_HISTORY}")
    first = by_host(collect(ctx, hosts, RULES))
    assert set(first) == set(lab.hosts)
    for name in windows:  # the sim's workstation: Linux-only agent, skipped with the reason
        assert first[name].reachable and first[name].sample is None
        assert (first[name].error or "").startswith("skipped: windows")
    for name, row in first.items():
        if name in windows:
            continue
        assert row.reachable and row.error is None, (name, row.error, row.hint)
        assert row.sample is not None
        assert row.sample["memory"]["total_bytes"] > 0 and row.sample["gpu_source"] == "none"
        assert row.sample["history"][-1]["t"] == row.sample["time"]  # recorded on the host
        assert json.loads(json.dumps(row.to_json()))["host"] == name
    m5 = ctx.inventory.hosts["m5"]
    assert m5.model_cache is not None
    assert first["m5"].sample is not None and first["m5"].sample["cache"]["path"] == str(m5.model_cache.path)
    conns = {h.name: ctx.pool.get(h) for h in hosts}
    second = by_host(collect(ctx, hosts, RULES))
    assert all(r.reachable for r in second.values())
    assert {h.name: ctx.pool.get(h) for h in hosts} == conns  # the same SSH connections
    # One sample per HISTORY_EVERY_S at most: the second round adds one only when it came that long after the first.
    one, two = first["irina"].sample, second["irina"].sample
    assert one is not None and two is not None
    added = 1 if two["time"] - one["time"] >= HISTORY_EVERY_S else 0
    assert len(two["history"]) == len(one["history"]) + added
    assert two["history"][-1]["t"] == (two["time"] if added else one["time"])


def test_a_stopped_host_is_unreachable_and_back_after_it_starts(lab: Any, ctx: Context) -> None:
    hosts = [ctx.inventory.hosts[n] for n in ("irina", "pharaoh")]
    assert all(r.reachable for r in collect(ctx, hosts, RULES))
    kept = ctx.pool.get(hosts[0])
    lab.stop_host("pharaoh")
    try:
        down = by_host(collect(ctx, hosts, RULES))
        assert down["irina"].reachable and down["irina"].sample is not None
        assert not down["pharaoh"].reachable and down["pharaoh"].sample is None
        assert down["pharaoh"].error and "pharaoh" in down["pharaoh"].error
    finally:
        lab.start_host("pharaoh")
    back = by_host(collect(ctx, hosts, RULES))
    assert back["pharaoh"].reachable, (back["pharaoh"].error, back["pharaoh"].hint)
    assert ctx.pool.get(hosts[0]) is kept  # the healthy host's connection was never dropped


def test_a_runs_progress_and_nccl_errors_on_its_own_host(lab: Any, ctx: Context) -> None:
    inv = lab.inventory_path
    run_id = f"mon-{uuid.uuid4().hex[:8]}"
    folder = f"/var/lib/labctl/runs/{run_id}"
    metrics = "\\n".join(
        json.dumps({"event": "step", "step": s, "steps": 3000, "loss": loss, "tokens_per_s": 500.0})
        for s, loss in ((100, 2.0), (1200, 1.1), (2300, 1.4))
    )
    pid = sh(
        inv,
        "m5",
        f"mkdir -p {folder}/torchrun && printf '{metrics}\\n' > {folder}/metrics.jsonl && "
        f"echo 'm5:1:2 [0] NCCL WARN Net : Connection closed by remote peer' > {folder}/torchrun/rank0.log && "
        f"LABCTL_RUN_ID={run_id} LABCTL_HOST=m5 CUDA_VISIBLE_DEVICES= setsid sleep 120 >/dev/null 2>&1 < /dev/null & echo $!",
    ).strip()
    try:
        rows = by_host(collect(ctx, [ctx.inventory.hosts[n] for n in ("m5", "irina")], RULES))
        m5, irina = rows["m5"].sample, rows["irina"].sample
        assert m5 is not None and irina is not None
        assert [r["run_id"] for r in irina["runs"] if r["run_id"] == run_id] == []  # same kernel, other host
        (run,) = [r for r in m5["runs"] if r["run_id"] == run_id]
        assert (run["step"], run["loss"], run["best_loss"], run["best_step"]) == (2300, 1.4, 1.1, 1200)
        assert run["nccl_errors"] == 1 and "NCCL WARN" in run["last_nccl_error"]
        mine = {(a.name, a.severity) for a in rows["m5"].alerts if a.run_id == run_id}
        assert mine == {("nccl_errors", "critical"), ("loss_stalled", "warning")}
    finally:
        sh(inv, "m5", f"kill {pid} 2>/dev/null; rm -rf {folder}; true")
