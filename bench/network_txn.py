"""Benchmark: what a network transaction costs, against the same change made unsafely.

One simulated host (its own bridge and subnet). In the same run:

- `labctl exec -- ip addr add ...`: the change made the way a script would, no safety net;
- `labctl exec --network -- ip addr add ...`: the same change as a transaction (backup,
  snapshot, keeper, fresh reconnect, commit). The difference is the price of not being
  locked out, per host;
- `labctl exec --network --revert-after T -- <move eth0 to another subnet>`: a change that
  cuts labctl off; the time until labctl reports the host back on its old config, against
  T (the floor: the host waits T before it reverts).

The address is removed outside labctl between runs, so every run makes the same change.

    .venv/bin/python bench/network_txn.py --out docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MARK_BEGIN = "<!-- bench:network_txn:begin -->"
MARK_END = "<!-- bench:network_txn:end -->"
HOST = "pharaoh"
ADDR = "10.77.0.5/24"

sys.path.insert(0, str(REPO))  # run as a script: make the `bench` package importable
from bench.common import machine, publish  # noqa: E402


def labctl(inv: Path, *args: str) -> tuple[float, int, dict[str, Any]]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", "--json", "-i", str(inv), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    took = time.perf_counter() - start
    return took, proc.returncode, json.loads(proc.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--revert-after", type=float, default=10.0)
    ap.add_argument("--out", type=Path, help="markdown file to update (docs/benchmarks.md)")
    ap.add_argument("--json", type=Path, default=REPO / "bench/out/network_txn.json")
    args = ap.parse_args()

    from labctl.sim import down, up

    sim_dir = Path(tempfile.mkdtemp(prefix="labctl-bench-net-"))
    sim = up(sim_dir, hosts=[HOST], bridge="lcbnt0", prefix="lcbnt-", subnet="10.249.0.0/24")
    inv, ns = sim.inventory_path, sim.namespace(HOST)

    def clear() -> None:
        subprocess.run(["ip", "-n", ns, "addr", "del", ADDR, "dev", "eth1"], capture_output=True)

    try:
        plain, safe = [], []
        for _ in range(args.reps + 1):  # the first of each is a warm-up (agent upload)
            clear()
            t, rc, _ = labctl(inv, "exec", "-l", HOST, "--", f"ip addr add {ADDR} dev eth1")
            assert rc == 0
            plain.append(t)
            clear()
            t, rc, doc = labctl(inv, "exec", "-l", HOST, "--network", "--", f"ip addr add {ADDR} dev eth1")
            assert rc == 0 and doc["results"][0]["transaction"]["outcome"] == "committed", doc
            safe.append(t)
        clear()
        cut = "ip addr flush dev eth0 && ip addr add 10.99.0.5/24 dev eth0"
        t_cut, rc, doc = labctl(
            inv, "exec", "-l", HOST, "--network", "--revert-after", f"{args.revert_after:g}", "--", cut
        )
        txn = doc["results"][0]["transaction"]
        assert rc == 1 and txn["outcome"] == "reverted" and txn["back_on_old_config"], txn
    finally:
        down(sim_dir)

    p, s = statistics.median(plain[1:]), statistics.median(safe[1:])
    result = {
        "machine": machine(),
        "reps": args.reps,
        "plain_exec_s": p,
        "network_exec_s": s,
        "overhead_s": s - p,
        "revert_after_s": args.revert_after,
        "cut_reported_back_s": t_cut,
        "cut_seen": txn["seen"],
    }
    md = f"""{MARK_BEGIN}
## Network transaction: the price of not being locked out (`bench/network_txn.py`)

{machine()}; one simulated host, 1 Gbit shaped veth, median of {args.reps} runs after a warm-up.
The same change (an address added on eth1) made plainly and as a transaction:

| how | wall time |
| --- | ---: |
| `labctl exec -- ip addr add ...` (no safety net) | {p:.2f} s |
| `labctl exec --network -- ip addr add ...` (backup, snapshot, keeper, fresh reconnect, verify, commit) | {s:.2f} s |
| cost of the transaction | {s - p:+.2f} s per host |

A change that cuts labctl off (eth0 moved to another subnet) with `--revert-after {args.revert_after:g}`:
labctl reported the host back on its old config after **{t_cut:.1f} s** (the floor is the
{args.revert_after:g} s the host waits before it reverts; the rest is the revert and labctl's
reconnection). What labctl saw: {"; ".join(txn["seen"])}.
{MARK_END}"""
    publish(result, md, args.json, args.out, MARK_BEGIN, MARK_END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
