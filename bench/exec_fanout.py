"""Benchmark: `labctl exec -- true` against ansible-core ad-hoc and parallel OpenSSH.

Same simulated hosts, same run, host key checking on for all three, each run cold (no
connection reused between runs: ansible's ControlPersist is turned off, labctl and ssh
open fresh connections). Also times `labctl --help` and checks it imports no heavy module.

    .venv/bin/python bench/exec_fanout.py --out docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MARK_BEGIN = "<!-- bench:exec_fanout:begin -->"
MARK_END = "<!-- bench:exec_fanout:end -->"

sys.path.insert(0, str(REPO))  # run as a script: make the `bench` package importable
from bench.common import machine, publish  # noqa: E402

HEAVY = ("torch", "paramiko", "pydantic", "yaml", "cryptography", "matplotlib", "docker", "pynvml")


def timed(cmd: list[str], env: dict[str, str] | None = None, cwd: Path = REPO) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(
            f"benchmark command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
        )
    return elapsed


def median_of(
    cmd: list[str], reps: int, env: dict[str, str] | None = None, warmups: int = 1, cwd: Path = REPO
) -> float:
    for _ in range(warmups):  # warm the page cache and the hosts' sshd
        timed(cmd, env, cwd)
    return statistics.median(timed(cmd, env, cwd) for _ in range(reps))


def ansible_inventory(path: Path, hosts: dict[str, str], key: Path, python: str) -> None:
    lines = ["[lab]"]
    for name, addr in hosts.items():
        lines.append(f"{name} ansible_host={addr} ansible_user=root ansible_python_interpreter={python}")
    lines += ["", "[lab:vars]", f"ansible_ssh_private_key_file={key}"]
    path.write_text("\n".join(lines) + "\n")


def help_startup(reps: int) -> tuple[float, list[str]]:
    labctl = str(BIN / "labctl")
    t = median_of([labctl, "--help"], reps)
    probe = (
        "import sys, runpy; sys.argv=['labctl','--help']\n"
        "try:\n    runpy.run_module('labctl', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO)
    loaded = [m for m in proc.stderr.strip().splitlines()[-1].split(",") if m] if proc.stderr.strip() else []
    return t, loaded


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,4,16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, help="markdown file to update (docs/benchmarks.md)")
    ap.add_argument("--json", type=Path, default=REPO / "bench/out/exec_fanout.json")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    from labctl.sim import down, up

    sim_dir = Path(tempfile.mkdtemp(prefix="labctl-bench-"))
    lab = up(sim_dir, count=max(sizes), bridge="lcbench0", prefix="lcb-", subnet="10.249.0.0/24")
    rows = []
    try:
        names = list(lab.hosts)
        inv = str(lab.inventory_path)
        py = shutil.which("python3", path="/usr/bin") or sys.executable
        ans_inv = sim_dir / "ansible.ini"
        ansible_inventory(ans_inv, lab.hosts, lab.key_path, py)
        ans_env = {
            **os.environ,
            "ANSIBLE_HOST_KEY_CHECKING": "True",
            "ANSIBLE_SSH_ARGS": f"-o ControlMaster=no -o UserKnownHostsFile={lab.known_hosts_path} -o StrictHostKeyChecking=yes",
            "ANSIBLE_LOCAL_TEMP": str(sim_dir / "ansible-tmp"),
            "ANSIBLE_NOCOLOR": "1",
        }
        ssh_base = (
            f"ssh -i {lab.key_path} -o UserKnownHostsFile={lab.known_hosts_path} -o StrictHostKeyChecking=yes "
            "-o BatchMode=yes -o ControlMaster=no"
        )
        for n in sizes:
            chosen = names[:n]
            limit = ",".join(chosen)
            t_labctl = median_of(
                [str(BIN / "labctl"), "-i", inv, "exec", "-l", limit, "--json", "--", "true"], args.reps
            )
            t_ansible = median_of(
                [
                    str(BIN / "ansible"),
                    "lab",
                    "-i",
                    str(ans_inv),
                    "-l",
                    limit,
                    "-m",
                    "command",
                    "-a",
                    "true",
                    "-f",
                    str(n),
                ],
                args.reps,
                ans_env,
            )
            par = " ".join(f"{ssh_base} root@{lab.hosts[h]} true & " for h in chosen) + "wait"
            t_ssh = median_of(["bash", "-c", par], args.reps)
            rows.append({"hosts": n, "labctl_s": t_labctl, "ansible_s": t_ansible, "openssh_s": t_ssh})
            print(
                f"{n:>3} hosts: labctl {t_labctl:.3f}s  ansible {t_ansible:.3f}s  openssh {t_ssh:.3f}s",
                file=sys.stderr,
            )
    finally:
        down(sim_dir)
        shutil.rmtree(sim_dir, ignore_errors=True)

    help_s, heavy_loaded = help_startup(max(args.reps, 10))
    result = {
        "machine": machine(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "rows": rows,
        "help_median_s": help_s,
        "help_heavy_imports": heavy_loaded,
    }
    publish(result, render(result), args.json, args.out, MARK_BEGIN, MARK_END)
    return 0


def render(r: dict) -> str:
    lines = [
        MARK_BEGIN,
        "## `labctl exec -- true`: fan-out against ansible-core and parallel OpenSSH",
        "",
        f"Machine: {r['machine']}, Python {r['python']}, {r['date']}. Simulated lab (network namespaces, "
        "one sshd each, links shaped to 1 Gbit). Wall time of the whole command, median of 5 cold runs "
        "(no connection reuse between runs), host key checking on in all three. Command: `make bench`.",
        "",
        "| hosts | labctl | ansible-core `-m command` (forks = hosts) | parallel `ssh` | labctl vs ansible | labctl / ssh |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['hosts']} | {row['labctl_s']:.3f} s | {row['ansible_s']:.3f} s | {row['openssh_s']:.3f} s "
            f"| {row['ansible_s'] / row['labctl_s']:.1f}x faster | {row['labctl_s'] / row['openssh_s']:.2f}x |"
        )
    heavy = ", ".join(r["help_heavy_imports"]) or "none"
    lines += [
        "",
        f"`labctl --help`: median {r['help_median_s'] * 1000:.0f} ms over 10 runs; heavy modules imported: {heavy}.",
        MARK_END,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
