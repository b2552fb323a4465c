"""A simulated host whose clock was set back: its status history, written while the clock read
2 h ahead, must not stop it recording. The host's clock is this machine's (the sim's hosts share
one kernel), so the history is written as it would have been before the clock went back."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from typing import Any

import pytest

from labctl.agent.core.paths import STATUS_HISTORY
from labctl.hosts.context import Context
from labctl.monitor.alerts import load_rules
from labctl.monitor.collect import collect
from tests.conftest import sh

pytestmark = pytest.mark.integration

# On the host: 20 samples, one every 10 s up to 15 s ago, stamped 2 h ahead of its wall clock.
# Half carry this boot's id and boot clock (the agent wrote them before the clock went back);
# half carry neither (an older agent wrote them): the first are re-dated, the second dropped.
WRITE_AHEAD = """
import json, os, time
boot = open("/proc/sys/kernel/random/boot_id").read().strip()
mono, wall = time.clock_gettime(time.CLOCK_BOOTTIME), time.time()
path = {path!r}
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path, "w") as f:
    for i in range(20, 0, -1):
        r = {{"t": wall + 7200 - 15 - 10 * i, "memory_used_bytes": 1, "gpus": []}}
        if i <= 10:
            r.update(m=mono - 15 - 10 * i, boot=boot)
        f.write(json.dumps(r) + "\\n")
"""


@pytest.fixture
def ctx(lab: Any) -> Iterator[Context]:
    c = Context.create(inventory_path=lab.inventory_path)
    try:
        yield c
    finally:
        c.close()


def test_status_records_after_the_clock_went_back_2h(lab: Any, ctx: Context) -> None:
    host = ctx.inventory.hosts["pharaoh"]
    script = WRITE_AHEAD.format(path=STATUS_HISTORY)
    sh(lab.inventory_path, host.name, f"python3 -c {shlex.quote(script)}")
    try:
        (row,) = collect(ctx, [host], load_rules(None))
        assert row.reachable and row.sample is not None, (row.error, row.hint)
        sample = row.sample
        history = sample["history"]
        assert history[-1]["t"] == sample["time"]  # this sample was recorded, not held off 2 h
        assert len(history) == 11  # this boot's 10 re-dated, before this one
        assert all(r["t"] < sample["time"] for r in history[:-1])
        notes = sample["history_notes"]
        assert any(n.startswith("clock went back 2 h between ") for n in notes), notes
        assert any(n.startswith("clock went back: 10 sample(s) stamped up to 1 h 5") for n in notes), notes
        # What the host keeps now reads back in order, without the future stamps.
        lines = sh(lab.inventory_path, host.name, f"cat {STATUS_HISTORY}").splitlines()
        assert len(lines) == 13  # 10 re-dated, 2 notes, this sample
    finally:
        sh(lab.inventory_path, host.name, f"rm -f {STATUS_HISTORY}")
