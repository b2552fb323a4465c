"""Benchmark: labctl with its connection keeper (warm) and without (cold), against ansible-core
with ControlPersist and OpenSSH with ControlMaster, in the same run on the same simulated hosts.

Rows (median wall time of the whole command, after warm-up runs):
- `labctl exec -- true` on 16 hosts: cold (LABCTL_KEEPER=off: each command connects), warm
  (the keeper holds the connections), ansible-core `-m command -a true` with its ControlPersist
  warm, parallel `ssh` through warm ControlMaster sockets;
- `labctl facts` on 16 hosts: cold, warm; ansible-core `-m setup` with ControlPersist warm;
- `labctl status` on a 4-host lab shaped as `make demo`'s: cold, warm.
Host key checking is on everywhere.

    .venv/bin/python bench/keeper.py --before 1707ca9 --agent-before 8420da8 --out docs/benchmarks.md

--before: a commit before the keeper, timed cold; --agent-before: the keeper before the agent it
keeps on each connection (8420da8), timed warm.
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
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MARK_BEGIN = "<!-- bench:keeper:begin -->"
MARK_END = "<!-- bench:keeper:end -->"

sys.path.insert(0, str(REPO))
from bench.common import machine, publish  # noqa: E402
from bench.exec_fanout import ansible_inventory, median_of, timed  # noqa: E402

WARMUPS = 2
GOALS = {
    "exec_warm_s": 0.35,  # at most, 16 hosts
    "exec_vs_ansible": 8.0,  # at least, against ansible-core with ControlPersist
    "facts_warm_s": 0.8,  # at most, 16 hosts
    "status_warm_s": 0.4,  # under, the 4-host demo lab
}


def wait_for_keeper(inventory: Path, folder: Path) -> None:
    from labctl.keeper import sock as ks
    from labctl.keeper.client import list_connections

    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            list_connections(inventory, folder)
            return
        except ks.KeeperUnavailable:
            time.sleep(0.05)
    raise SystemExit(f"no keeper started for {inventory}")


def labctl_rows(
    inv: Path,
    folder: Path,
    reps: int,
    jobs: dict[str, list[str]],
    before: Path | None,
    agent_before: Path | None = None,
    prime: dict[str, list[str]] | None = None,
) -> dict[str, float]:
    """{job_cold: s, job_first: s, job_warm: s, job_before: s, job_agent_before_warm: s} for each
    labctl job on `inv` (`before`: a checkout timed cold; `agent_before`: one timed warm)."""
    from labctl.keeper.client import stop

    base = {k: v for k, v in os.environ.items() if not k.startswith("LABCTL_KEEPER")}
    cold = {**base, "LABCTL_KEEPER": "off"}
    warm = {**base, "LABCTL_KEEPER": "on", "LABCTL_KEEPER_DIR": str(folder)}
    out: dict[str, float] = {}
    for name, args in jobs.items():
        cmd = [str(BIN / "labctl"), "-i", str(inv), *args]
        if before is not None:
            # The same command from a checkout of the commit before the keeper, in this run.
            old = [sys.executable, "-m", "labctl", "-i", str(inv), *args]
            out[f"{name}_before_s"] = median_of(
                old, reps, {**cold, "PYTHONPATH": str(before)}, WARMUPS, before
            )
        if agent_before is not None:
            # That commit warm, with a keeper of its own (another protocol: a folder of its own).
            theirs = folder.parent / "kb"
            theirs.mkdir(mode=0o700, exist_ok=True)
            env = {
                **base,
                "LABCTL_KEEPER": "on",
                "LABCTL_KEEPER_DIR": str(theirs),
                "PYTHONPATH": str(agent_before),
            }
            old = [sys.executable, "-m", "labctl", "-i", str(inv), *args]
            timed(old, env, agent_before)  # connects itself and starts that keeper when done
            time.sleep(3)
            out[f"{name}_agent_before_warm_s"] = median_of(old, reps, env, WARMUPS, agent_before)
            subprocess.run(["pkill", "-f", str(theirs)], capture_output=True)
        out[f"{name}_cold_s"] = median_of(cmd, reps, cold, WARMUPS)
        # The first command with keeping on: no keeper yet, so it connects itself and starts one.
        firsts = []
        for _ in range(reps):
            stop(inv, folder)
            time.sleep(0.3)
            firsts.append(timed(cmd, warm))
        out[f"{name}_first_s"] = statistics.median(firsts)
        timed(cmd, warm)  # no keeper yet: this one connects itself and starts it
        wait_for_keeper(inv, folder)
        out[f"{name}_warm_s"] = median_of(cmd, reps, warm, WARMUPS)
        if prime and name in prime:
            # Warm again once an agent call (`prime`) has left an agent kept on each connection,
            # as on a lab where `facts` or `status` ran before: shell commands then run in it.
            timed([str(BIN / "labctl"), "-i", str(inv), *prime[name]], warm)
            out[f"{name}_warm_kept_s"] = median_of(cmd, reps, warm, WARMUPS)
        print(f"{name}: cold {out[f'{name}_cold_s']:.3f}s warm {out[f'{name}_warm_s']:.3f}s", file=sys.stderr)
    stop(inv, folder)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--out", type=Path, help="markdown file to update (docs/benchmarks.md)")
    ap.add_argument("--json", type=Path, default=REPO / "bench/out/keeper.json")
    ap.add_argument("--before", metavar="REV", help="also time each command cold from a checkout of REV")
    ap.add_argument(
        "--agent-before",
        metavar="REV",
        help="also time each command warm from a checkout of REV (a keeper without the kept agent)",
    )
    args = ap.parse_args()

    from labctl.sim import down, up

    work = Path(tempfile.mkdtemp(prefix="lkb", dir="/tmp"))
    folder = work / "k"  # short: a Unix socket's path is capped at 107 bytes
    os.mkdir(folder, 0o700)
    big_dir, demo_dir = work / "lab16", work / "lab4"
    result: dict[str, Any] = {}
    checkouts: dict[str, Path] = {}
    for key, rev in (("before", args.before), ("agent_before", args.agent_before)):
        if rev:
            checkouts[key] = work / key
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(checkouts[key]), rev],
                check=True,
            )
            result[key] = subprocess.run(
                ["git", "-C", str(REPO), "rev-parse", "--short", rev], capture_output=True, text=True
            ).stdout.strip()
    before, agent_before = checkouts.get("before"), checkouts.get("agent_before")
    try:
        big = up(big_dir, count=args.hosts, bridge="lckeep0", prefix="lkp-", subnet="10.247.0.0/24")
        demo = up(demo_dir, bridge="lckeep1", prefix="lkd-", subnet="10.247.1.0/24")
        n = len(big.hosts)
        result.update(labctl_rows(big.inventory_path, folder, args.reps, {
            "exec": ["exec", "--json", "--", "true"],
            "facts": ["facts", "--json"],
        }, before, agent_before, prime={"exec": ["facts", "--json"]}))  # fmt: skip
        result.update(
            labctl_rows(
                demo.inventory_path, folder, args.reps, {"status": ["status", "--json"]}, before, agent_before
            )
        )

        py = shutil.which("python3", path="/usr/bin") or sys.executable
        ans_inv = work / "ansible.ini"
        ansible_inventory(ans_inv, big.hosts, big.key_path, py)
        control = work / "cp"
        control.mkdir()
        persist = f"-o ControlMaster=auto -o ControlPersist=600s -o UserKnownHostsFile={big.known_hosts_path} -o StrictHostKeyChecking=yes"
        ans_env = {
            **os.environ,
            "ANSIBLE_HOST_KEY_CHECKING": "True",
            "ANSIBLE_SSH_ARGS": persist,
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control),
            "ANSIBLE_LOCAL_TEMP": str(work / "ansible-tmp"),
            "ANSIBLE_NOCOLOR": "1",
        }
        ansible = [str(BIN / "ansible"), "lab", "-i", str(ans_inv), "-f", str(n)]
        result["ansible_exec_warm_s"] = median_of(
            [*ansible, "-m", "command", "-a", "true"], args.reps, ans_env, WARMUPS
        )
        result["ansible_setup_warm_s"] = median_of([*ansible, "-m", "setup"], args.reps, ans_env, WARMUPS)
        ssh = (
            f"ssh -i {big.key_path} -o UserKnownHostsFile={big.known_hosts_path} -o StrictHostKeyChecking=yes "
            f"-o BatchMode=yes -o ControlMaster=auto -o ControlPersist=600s -o ControlPath={control}/ssh-%C"
        )
        par = " ".join(f"{ssh} root@{addr} true & " for addr in big.hosts.values()) + "wait"
        result["openssh_exec_warm_s"] = median_of(["bash", "-c", par], args.reps, dict(os.environ), WARMUPS)
        for sock in control.glob("ssh-*"):
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True)
        subprocess.run(["pkill", "-f", f"ControlPath={control}"], capture_output=True)
        subprocess.run(["pkill", "-f", str(control)], capture_output=True)
        result.update(hosts=n, demo_hosts=len(demo.hosts), reps=args.reps)
    finally:
        for d in (big_dir, demo_dir):
            if (d / "state.json").exists():
                down(d)
        for checkout in checkouts.values():
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(checkout)], check=False
            )
        shutil.rmtree(work, ignore_errors=True)
    result.update(machine=machine(), python=platform.python_version(), date=time.strftime("%Y-%m-%d"))
    publish(result, render(result), args.json, args.out, MARK_BEGIN, MARK_END)
    return 0


def _verdict(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def render(r: dict[str, Any]) -> str:
    n, reps = r["hosts"], r["reps"]
    ex_w, ex_c, ans = r["exec_warm_s"], r["exec_cold_s"], r["ansible_exec_warm_s"]
    fa_w, fa_c = r["facts_warm_s"], r["facts_cold_s"]
    st_w, st_c = r["status_warm_s"], r["status_cold_s"]
    lines = [
        MARK_BEGIN,
        "## Connections kept between commands: labctl's keeper against ControlPersist",
        "",
        f"Machine: {r['machine']}, Python {r['python']}, {r['date']}. Simulated lab (network namespaces, one "
        f"sshd each, on this machine's cores). Wall time of the whole command, median of {reps} runs after "
        "two warm-up runs; host key checking on everywhere. Cold: `LABCTL_KEEPER=off`, each command connects "
        "as before this change. Warm: the keeper holds the connections. ansible-core and `ssh` keep theirs "
        "with ControlMaster/ControlPersist, warmed the same way. Command: `.venv/bin/python bench/keeper.py`.",
        "",
        "| what | labctl cold (keeping off) | labctl, first command (starts the keeper) | labctl warm | peer, warm | labctl warm vs peer |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        f"| `exec -- true`, {n} hosts | {ex_c:.3f} s | {r['exec_first_s']:.3f} s | {ex_w:.3f} s | ansible-core `-m command` {ans:.3f} s "
        f"| {ans / ex_w:.1f}x faster |",
        f"| `exec -- true`, {n} hosts | | | | parallel `ssh` (ControlMaster) {r['openssh_exec_warm_s']:.3f} s "
        f"| {r['openssh_exec_warm_s'] / ex_w:.2f}x |",
        f"| `facts`, {n} hosts | {fa_c:.3f} s | {r['facts_first_s']:.3f} s | {fa_w:.3f} s | ansible-core `-m setup` {r['ansible_setup_warm_s']:.3f} s "
        f"| {r['ansible_setup_warm_s'] / fa_w:.1f}x faster |",
        f"| `status`, the {r['demo_hosts']}-host demo lab | {st_c:.3f} s | {r['status_first_s']:.3f} s | {st_w:.3f} s | | |",
        "",
        f"- `exec -- true` warm at most {GOALS['exec_warm_s']} s: {ex_w:.3f} s, {_verdict(ex_w <= GOALS['exec_warm_s'])}"
        + (
            f" on connections where no agent call has run yet; {r['exec_warm_kept_s']:.3f} s, "
            f"{_verdict(r['exec_warm_kept_s'] <= GOALS['exec_warm_s'])}, once one has (a `facts` before: the shell "
            "command then runs in the agent kept there, with no SSH session of its own)"
            if "exec_warm_kept_s" in r
            else ""
        )
        + "; "
        f"at least {GOALS['exec_vs_ansible']:g}x ansible-core with ControlPersist: {ans / ex_w:.1f}x, "
        f"{_verdict(ans / ex_w >= GOALS['exec_vs_ansible'])}.",
        f"- Cold no slower: the first command with keeping on against keeping off, `exec` "
        f"{r['exec_first_s'] / ex_c:.2f}x, `facts` {r['facts_first_s'] / fa_c:.2f}x, `status` {r['status_first_s'] / st_c:.2f}x"
        + (
            f"; against the same commands from {r['before']} (before the keeper), in this run: `exec` "
            f"{r['exec_before_s']:.3f} s, `facts` {r['facts_before_s']:.3f} s, `status` {r['status_before_s']:.3f} s, "
            f"so the first command takes {r['exec_first_s'] / r['exec_before_s']:.2f}x, "
            f"{r['facts_first_s'] / r['facts_before_s']:.2f}x and {r['status_first_s'] / r['status_before_s']:.2f}x of that."
            if "before" in r
            else "."
        ),
        f"- `facts` warm at most {GOALS['facts_warm_s']} s: {fa_w:.3f} s, {_verdict(fa_w <= GOALS['facts_warm_s'])}.",
        f"- `status` warm under {GOALS['status_warm_s']} s: {st_w:.3f} s, {_verdict(st_w < GOALS['status_warm_s'])}.",
        *(
            [
                f"- What the agent kept on each connection adds: {r['agent_before']} (the keeper without it) also ran "
                f"warm, with a keeper of its own: connections kept, but each agent call starting the host's Python and "
                f"the agent anew. `facts` {r['facts_agent_before_warm_s']:.3f} s against {fa_w:.3f} s now "
                f"({r['facts_agent_before_warm_s'] / fa_w:.2f}x), `status` {r['status_agent_before_warm_s']:.3f} s against "
                f"{st_w:.3f} s ({r['status_agent_before_warm_s'] / st_w:.2f}x), `exec` (no agent call) "
                f"{r['exec_agent_before_warm_s']:.3f} s against {ex_w:.3f} s."
            ]
            if "facts_agent_before_warm_s" in r
            else []
        ),
        MARK_END,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
