"""Benchmark: sandbox executions per second through the sandbox service, against `docker run
--rm` and against the warm pool used one container per execution, in the same run.

The workload is phase 3's: programs with T tests each (a python program that reverses its
input; every test checked). The service runs each program in a container of its own, all its
tests inside it (labctl/agent/sandbox/batch.py); `docker run --rm` and the pool pay one
container per execution. The same limits (labctl/sandbox/limits.py) hold for all three, at the
same concurrency. The service's time includes the pool's refill after the last batch, so
its figure is sustained throughput, not a burst from containers started before the clock.

    .venv/bin/python bench/sandbox_service.py --out docs/benchmarks.md   (root, Docker running)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MARK_BEGIN = "<!-- bench:sandbox_service:begin -->"
MARK_END = "<!-- bench:sandbox_service:end -->"
SOURCE = "print(input()[::-1])\n"

sys.path.insert(0, str(REPO))  # run as a script: make the `bench` package importable
from bench.common import machine, publish  # noqa: E402


def program(tests: int) -> dict[str, Any]:
    return {
        "lang": "python",
        "source": SOURCE,
        "tests": [{"stdin": f"word{i}\n", "expect": f"{i}drow"} for i in range(tests)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", default="1,5,8", help="tests per program, a comma list")
    parser.add_argument("--programs", type=int, default=24, help="programs per measurement")
    parser.add_argument("--batch", type=int, default=8, help="programs per request")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--baseline-runs", type=int, default=48, help="executions for each peer")
    parser.add_argument("--out", type=Path, help="markdown file whose section to update")
    parser.add_argument("--json", type=Path, default=REPO / ".labctl/bench/sandbox_service.json")
    args = parser.parse_args()
    from labctl.agent.sandbox.daemon import daemon_answers
    from labctl.agent.sandbox.runner import run_programs
    from labctl.agent.sandbox.service import Service
    from labctl.sandbox.api import lang_spec
    from labctl.sandbox.bench import baseline_argv
    from labctl.sandbox.limits import Limits

    if not daemon_answers()["answering"]:
        raise SystemExit("dockerd does not answer: start it (labctl provision's sandbox resource does)")
    limits = Limits()
    spec = lang_spec("python", limits)
    conc = args.concurrency
    hello = {"lang": "python", "source": "print('hello')\n", "stdin": None}

    def docker_run(n: int) -> tuple[float, int]:
        argv = baseline_argv(spec)

        def one(_: int) -> bool:
            p = subprocess.run(argv, input=b"print('hello')\n", capture_output=True, timeout=120)
            return p.returncode == 0 and p.stdout.strip() == b"hello"

        t0 = time.perf_counter()
        with ThreadPoolExecutor(conc) as ex:
            ok = list(ex.map(one, range(n)))
        return time.perf_counter() - t0, ok.count(False)

    def pool_per_exec(n: int) -> tuple[float, int]:
        run_programs([hello], {"python": spec}, limits.as_dict(), 1, conc)  # the pool fills first
        t0 = time.perf_counter()
        res = run_programs(
            [hello] * n, {"python": spec}, limits.as_dict(), conc, conc
        )  # waits for the refill
        took = time.perf_counter() - t0
        return took, sum(1 for r in res if r["exit_code"] != 0 or r["stdout"].strip() != "hello")

    def service(tests: int) -> tuple[float, int, int]:
        svc = Service({"python": spec}, limits.as_dict(), b"0" * 32, pool=conc, concurrency=conc)
        svc.warm()
        try:
            svc.batch([program(tests)] * conc)  # warm-up, then the pool refills before the clock
            svc.pools.wait()
            t0 = time.perf_counter()
            failed = 0
            for start in range(0, args.programs, args.batch):
                n = min(args.batch, args.programs - start)
                res = svc.batch([program(tests)] * n)["results"]
                failed += sum(r["total"] - r["passed"] for r in res)
            svc.pools.wait()
            return time.perf_counter() - t0, failed, args.programs * tests
        finally:
            svc.close()

    rows: list[dict[str, Any]] = []
    took, bad = docker_run(args.baseline_runs)
    base = {
        "method": "docker run --rm",
        "tests": 1,
        "executions": args.baseline_runs,
        "seconds": took,
        "failed": bad,
    }
    took, bad = pool_per_exec(args.baseline_runs)
    pool = {"method": "warm pool, a container per execution", "tests": 1, "executions": args.baseline_runs,
            "seconds": took, "failed": bad}  # fmt: skip
    rows += [base, pool]
    for t in [int(x) for x in args.tests.split(",")]:
        took, bad, n = service(t)
        rows.append(
            {"method": "sandbox service", "tests": t, "executions": n, "seconds": took, "failed": bad}
        )
    took, bad = docker_run(args.baseline_runs)  # again at the end: the machine's load drifts
    rows.append({"method": "docker run --rm (again)", "tests": 1, "executions": args.baseline_runs,
                 "seconds": took, "failed": bad})  # fmt: skip
    for r in rows:
        r["exec_per_s"] = r["executions"] / r["seconds"]
    peer = (rows[0]["exec_per_s"] + rows[-1]["exec_per_s"]) / 2
    lines = [
        MARK_BEGIN,
        "## Sandbox executions per second: the sandbox service against `docker run --rm` (`bench/sandbox_service.py`)",
        "",
        f"Machine: {machine()}. Python programs, the same limits for every method, {conc} at a time. "
        "An execution is one program run against one test's input. The service gets "
        f"{args.programs} programs per measurement in requests of {args.batch}, each program with T "
        "tests, every output checked; its time runs until the pool has refilled after the last "
        "request. The peers run one container per execution.",
        "",
        "| method | tests per program | executions | seconds | executions/s | failed | against `docker run --rm` |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['tests']} | {r['executions']} | {r['seconds']:.2f} | {r['exec_per_s']:.1f} | "
            f"{r['failed']} | {r['exec_per_s'] / peer:.1f}x |"
        )
    lines += [
        "",
        "The ratio is against the mean of the two `docker run --rm` measurements. A program's tests "
        "share its container (killed between tests: every process the test left, and /tmp); no two "
        "programs ever share one. With one test per program the service pays what the pool pays, "
        "a container per execution.",
        MARK_END,
    ]
    publish({"machine": machine(), "concurrency": conc, "rows": rows}, "\n".join(lines), args.json, args.out,
            MARK_BEGIN, MARK_END)  # fmt: skip


if __name__ == "__main__":
    main()
