"""Benchmark: what one call costs the integration tests, two ways each, in the same run.

On a simulated lab of two hosts (its own bridge and subnet):

- one SSH command (`ssh HOST true`) with the host's own ~/.bashrc (what `sim up` gives each host)
  against the same host reading this machine's ~/.bashrc, as every sim host did before: bash
  reads it for every command sshd runs, and a pyenv or conda set-up there runs each time;
- one labctl call (`exec`, `monitor.status`, `facts.collect`) as a subprocess (`python -m labctl`, how the tests
  called it) against the same call through labctl's entry point in the test's process (how
  `tests.conftest.labctl` calls it now).

The two ways of each alternate, so load on the machine falls on both alike.

    .venv/bin/python bench/test_call_costs.py --out docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MARK_BEGIN = "<!-- bench:test_call_costs:begin -->"
MARK_END = "<!-- bench:test_call_costs:end -->"
HOSTS = ["m5", "irina"]
CALLS = [["exec", "-l", "m5", "--", "true"], ["status"], ["facts", "-l", "m5,irina"]]

sys.path.insert(0, str(REPO))  # run as a script: make the `bench` package importable
from bench.common import machine, publish  # noqa: E402


def ssh_true(lab: Any, host: str) -> None:
    subprocess.run(
        ["ssh", "-F", "/dev/null", "-i", str(lab.key_path), "-o", f"UserKnownHostsFile={lab.known_hosts_path}",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{lab.hosts[host]}", "true"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip


def in_process(inv: Path, args: list[str]) -> int:
    from labctl.cli.app import main

    argv = sys.argv
    sys.argv = ["labctl", "--json", "-i", str(inv), *args]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            main()
        return 0
    except SystemExit as e:
        return int(e.code or 0)
    finally:
        sys.argv = argv


def subprocess_call(inv: Path, args: list[str]) -> int:
    argv = [sys.executable, "-m", "labctl", "--json", "-i", str(inv), *args]
    return subprocess.run(argv, capture_output=True, cwd=REPO, timeout=300).returncode


def alternate(runs: int, a: Callable[[], object], b: Callable[[], object]) -> tuple[list[float], list[float]]:
    """`a` and `b` one after the other, `runs` times each, after one warm-up of each."""
    a(), b()
    ta: list[float] = []
    tb: list[float] = []
    for _ in range(runs):
        for f, times in ((a, ta), (b, tb)):
            start = time.perf_counter()
            f()
            times.append(time.perf_counter() - start)
    return ta, tb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", type=Path, help="markdown file whose section to update")
    parser.add_argument("--json", type=Path, default=REPO / ".labctl/bench/test_call_costs.json")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: the simulated lab makes network namespaces")
    from labctl.sim import down, up

    mine = Path.home() / ".bashrc"
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="labctl-bench-calls-") as tmp:
        sim_dir = Path(tmp) / "sim"
        lab = up(sim_dir, hosts=HOSTS, bridge="lcbtc0", prefix="lcbtc-", subnet="10.248.0.0/24")
        try:
            inv = lab.inventory_path
            own = sim_dir / "hosts/irina/root/root/.bashrc"
            if mine.exists():
                own.write_text(mine.read_text())  # irina reads this machine's; m5 keeps its own
                a, b = alternate(args.runs, lambda: ssh_true(lab, "m5"), lambda: ssh_true(lab, "irina"))
                rows.append({"what": "`ssh HOST true`", "a": "host's own ~/.bashrc", "b": f"this machine's {mine}",
                             "a_s": a, "b_s": b})  # fmt: skip
            for call in CALLS:
                a, b = alternate(
                    args.runs, partial(in_process, inv, call), partial(subprocess_call, inv, call)
                )
                rows.append({"what": f"`labctl {' '.join(call)}`", "a": "in the test's process",
                             "b": "a subprocess", "a_s": a, "b_s": b})  # fmt: skip
        finally:
            down(sim_dir)
    lines = [
        MARK_BEGIN,
        "## What one call costs the integration tests (`bench/test_call_costs.py`)",
        "",
        f"Machine: {machine()}. {args.runs} runs of each way, alternating, on a two-host simulated lab; "
        "median seconds.",
        "",
        "| call | way A | A (s) | way B | B (s) | B − A (s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        ma, mb = statistics.median(r["a_s"]), statistics.median(r["b_s"])
        r.update(a_median_s=round(ma, 3), b_median_s=round(mb, 3))
        lines.append(f"| {r['what']} | {r['a']} | {ma:.3f} | {r['b']} | {mb:.3f} | {mb - ma:+.3f} |")
    lines += [
        "",
        "Way B is how the tests ran before: every sim host read this machine's ~/.bashrc, and every "
        "CLI call started Python and labctl again.",
        MARK_END,
    ]
    publish({"machine": machine(), "runs": args.runs, "rows": rows}, "\n".join(lines), args.json, args.out,
            MARK_BEGIN, MARK_END)  # fmt: skip


if __name__ == "__main__":
    main()
