"""Benchmark: a `labctl provision` re-run with nothing to change, against ansible-core.

Same simulated hosts, same run. Both tools first converge the hosts (and must then report no
change on a second run); only no-change re-runs are timed, and every timed run is checked to
have changed nothing. Each side checks a file, a cron job, a tmpfs mount, its /etc/fstab line
and the cache's manifest folder. Host key checking is on for both, and each run is cold:
nothing from one run's SSH connections is reused by the next.

    .venv/bin/python bench/provision_nochange.py --out docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MARK_BEGIN = "<!-- bench:provision_nochange:begin -->"
MARK_END = "<!-- bench:provision_nochange:end -->"

sys.path.insert(0, str(REPO))  # run as a script: make the `bench` package importable
from bench.common import machine, publish  # noqa: E402
from bench.exec_fanout import ansible_inventory  # noqa: E402

HOST_TEXT = "# written by bench/provision_nochange.py\nbench=provision_nochange\n"
CACHE_GB = 1

# labctl side: the same file, cron job and RAM cache on every host.
LABCTL_PLAYBOOK = f"""\
name: provision no-change benchmark
plays:
  - name: a file, a cron job and a RAM model cache on every host
    hosts: all
    resources:
      # Straight in /var/lib/labctl: labctl's `file` makes no missing parent folder (as
      # ansible's `copy`) and labctl has no folder resource.
      - file:
          path: /var/lib/labctl/bench-host.txt
          mode: "0644"
          content: {json.dumps(HOST_TEXT)}
      - cron:
          name: bench-job
          schedule: "*/15 * * * *"
          command: "true"
      - model_cache: {{reserve_gb: 1}}
"""

# ansible side: the same work with ansible.builtin modules only (ansible-core has no
# ansible.posix, so no `mount` module). Its own paths (ansible-*), so the two tools never
# rewrite each other's file, cron job or fstab line: both stay converged.
ANSIBLE_PLAYBOOK = f"""\
- name: provision no-change benchmark (the labctl playbook's equivalent)
  hosts: all
  gather_facts: false  # labctl gathers no facts either
  tasks:
    - name: the log and lock folders labctl's cron resource checks
      ansible.builtin.file:
        path: "{{{{ item }}}}"
        state: directory
        mode: "0755"
      loop: [/var/log/labctl, /var/lib/labctl/locks]

    - name: the file
      ansible.builtin.copy:
        dest: /var/lib/labctl/ansible-bench-host.txt
        content: {json.dumps(HOST_TEXT)}
        mode: "0644"

    # A file in /etc/cron.d, as labctl writes (ansible.builtin.cron needs the `crontab`
    # binary on the host even with cron_file, and the simulated hosts have none).
    - name: the cron job
      ansible.builtin.copy:
        dest: /etc/cron.d/ansible-bench-job
        content: |
          SHELL=/bin/sh
          PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
          */15 * * * * root flock -n /var/lib/labctl/locks/ansible-bench-job.lock sh -c true >>/var/log/labctl/ansible-bench-job.log 2>&1
        mode: "0644"

    - name: the cache's mount point
      ansible.builtin.file:
        path: /mnt/ansible-cache
        state: directory

    - name: is the cache mounted
      ansible.builtin.command: mountpoint -q /mnt/ansible-cache
      register: cache_mounted
      changed_when: false
      failed_when: false

    - name: mount the cache
      ansible.builtin.command: mount -t tmpfs -o size={CACHE_GB}G,mode=0755,nosuid,nodev tmpfs /mnt/ansible-cache
      when: cache_mounted.rc != 0

    # /etc/fstab is a file bind-mounted over the real one on each simulated host: renaming a
    # temporary file onto it (lineinfile's atomic write) fails with EBUSY, so ansible must be
    # allowed to write it in place, which unsafe_writes does (only on that failure).
    - name: the fstab line
      ansible.builtin.lineinfile:
        path: /etc/fstab
        line: tmpfs /mnt/ansible-cache tmpfs size={CACHE_GB}G,mode=0755,nosuid,nodev 0 0
        unsafe_writes: true

    - name: the cache's manifest folder
      ansible.builtin.file:
        path: /mnt/ansible-cache/.labctl
        state: directory
        mode: "0755"
"""

RECAP_RE = re.compile(
    r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE
)


def run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(
            f"benchmark command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
        )
    return elapsed, proc


def labctl_unchanged(proc: subprocess.CompletedProcess[str], hosts: list[str]) -> str | None:
    """Why this `labctl provision --json` run does not count as a no-change run (None: it does)."""
    doc = json.loads(proc.stdout)
    results = doc["results"]
    bad = [f"{r['host']} {r['resource']}: {r['status']}" for r in results if r["status"] != "ok"]
    seen = sorted({r["host"] for r in results})
    if bad:
        return "not every resource is ok: " + "; ".join(bad)
    if seen != sorted(hosts) or len(results) != 3 * len(hosts):
        return f"expected 3 resources on each of {sorted(hosts)}, got {len(results)} on {seen}"
    return None


def ansible_unchanged(proc: subprocess.CompletedProcess[str], hosts: list[str]) -> str | None:
    """Why this `ansible-playbook` run does not count as a no-change run (None: it does)."""
    recap = {m[0]: [int(x) for x in m[1:]] for m in RECAP_RE.findall(proc.stdout)}
    if sorted(recap) != sorted(hosts):
        return f"PLAY RECAP lists {sorted(recap)}, not {sorted(hosts)}"
    bad = [f"{h} changed={c} unreachable={u} failed={f}" for h, (_, c, u, f) in recap.items() if c or u or f]
    return "; ".join(bad) if bad else None


Checker = Callable[[subprocess.CompletedProcess[str], list[str]], str | None]


def timed_unchanged(cmd: list[str], hosts: list[str], check: Checker, env: dict[str, str] | None) -> float:
    """Wall time of one run of `cmd`, which must succeed and change nothing."""
    elapsed, proc = run(cmd, env)
    why = check(proc, hosts)
    if why:
        raise SystemExit(
            f"a timed run changed something: {' '.join(cmd)}\n{why}\n{proc.stdout}\n{proc.stderr}"
        )
    return elapsed


def median_unchanged(
    cmd: list[str],
    hosts: list[str],
    check: Checker,
    reps: int,
    env_for_run: Callable[[], dict[str, str] | None] = lambda: None,
    after_run: Callable[[], None] = lambda: None,
) -> float:
    def once() -> float:
        try:
            return timed_unchanged(cmd, hosts, check, env_for_run())
        finally:
            after_run()

    once()  # warm the page cache and the hosts' sshd
    return statistics.median(once() for _ in range(reps))


def converge(name: str, cmd: list[str], hosts: list[str], check: Checker, env: dict[str, str] | None) -> None:
    """First run (must succeed), then a second that must change nothing; otherwise stop loudly."""
    run(cmd, env)
    _, proc = run(cmd, env)
    why = check(proc, hosts)
    if why:
        raise SystemExit(
            f"{name} does not converge: its second run still changes things.\n{why}\n{proc.stdout}\n{proc.stderr}"
        )


def bench_inventory(src: Path, dst: Path, key: Path, known_hosts: Path) -> None:
    """The sim inventory with the same RAM cache on every host and no Windows host."""
    import yaml

    doc = yaml.safe_load(src.read_text())
    doc["defaults"]["ssh_key"] = str(key)
    doc["defaults"]["known_hosts"] = str(known_hosts)
    for host in doc["hosts"].values():
        if host.get("os") == "windows":
            del host["os"]
        host["model_cache"] = {"path": "/mnt/model-cache", "size_gb": CACHE_GB}
    dst.write_text(yaml.safe_dump(doc, sort_keys=False))


class AnsibleRuns:
    """ansible-playbook's environment with a fresh SSH ControlPath folder for every run.

    ansible's defaults (ControlMaster=auto, ControlPersist=60s) reuse one connection per host
    across a run's tasks; a new folder per run, with the masters closed after it, keeps every
    run cold like labctl's, which opens fresh connections per run.
    """

    def __init__(self, base: dict[str, str], root: Path, pipelining: bool) -> None:
        self.base = {**base, "ANSIBLE_PIPELINING": "True" if pipelining else "False"}
        self.root = root
        self.count = 0
        self.sockets = 0  # control sockets found after runs: proof the connections were kept
        self.current: Path | None = None

    def env(self) -> dict[str, str]:
        self.count += 1
        self.current = Path(tempfile.mkdtemp(prefix=f"cp{self.count}-", dir=self.root))
        return {**self.base, "ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.current)}

    def close(self) -> None:
        if self.current is None:
            return
        for sock in self.current.iterdir():
            self.sockets += 1
            subprocess.run(["ssh", "-S", str(sock), "-O", "exit", "x"], capture_output=True)
        shutil.rmtree(self.current, ignore_errors=True)
        self.current = None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4,16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, help="markdown file to update (docs/benchmarks.md)")
    ap.add_argument("--json", type=Path, default=REPO / "bench/out/provision_nochange.json")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    from labctl.sim import down, up

    sim_dir = Path(tempfile.mkdtemp(prefix="labctl-bench-"))
    cp_root = Path(tempfile.mkdtemp(prefix="lcpa-"))  # short: socket paths are limited to 108 bytes
    rows = []
    try:
        lab = up(sim_dir, count=max(sizes), bridge="lcbp0", prefix="lcp-", subnet="10.248.0.0/24")
        names = list(lab.hosts)
        inv = sim_dir / "bench-inventory.yaml"
        bench_inventory(lab.inventory_path, inv, lab.key_path, lab.known_hosts_path)
        book = sim_dir / "bench-provision.yaml"
        book.write_text(LABCTL_PLAYBOOK)
        ans_book = sim_dir / "bench-provision.ansible.yaml"
        ans_book.write_text(ANSIBLE_PLAYBOOK)
        py = shutil.which("python3", path="/usr/bin") or sys.executable
        ans_inv = sim_dir / "ansible.ini"
        ansible_inventory(ans_inv, lab.hosts, lab.key_path, py)
        ans_base = {
            **os.environ,
            "ANSIBLE_HOST_KEY_CHECKING": "True",
            "ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=60s "
            f"-o UserKnownHostsFile={lab.known_hosts_path} -o StrictHostKeyChecking=yes",
            "ANSIBLE_LOCAL_TEMP": str(sim_dir / "ansible-tmp"),
            "ANSIBLE_NOCOLOR": "1",
        }
        variants = {
            "ansible_s": AnsibleRuns(ans_base, cp_root, pipelining=False),
            "ansible_pipelining_s": AnsibleRuns(ans_base, cp_root, pipelining=True),
        }

        def labctl_cmd(limit: str) -> list[str]:
            return [
                str(BIN / "labctl"),
                "-i",
                str(inv),
                "provision",
                "-p",
                str(book),
                "--limit",
                limit,
                "--json",
            ]

        def ansible_cmd(limit: str, forks: int) -> list[str]:
            return [
                str(BIN / "ansible-playbook"),
                "-i",
                str(ans_inv),
                "-l",
                limit,
                "-f",
                str(forks),
                str(ans_book),
            ]

        # ansible first: labctl keeps its fstab entry the file's last line, so a line appended
        # after it (ansible's, on a first run) makes labctl rewrite /etc/fstab once more.
        everyone = ",".join(names)
        first = variants["ansible_s"]
        ansible_all = ansible_cmd(everyone, len(names))
        try:
            converge("ansible-playbook", ansible_all, names, ansible_unchanged, first.env())
        finally:
            first.close()
        converge("labctl provision", labctl_cmd(everyone), names, labctl_unchanged, None)
        try:  # labctl's runs must not have undone ansible's work either
            timed_unchanged(ansible_all, names, ansible_unchanged, first.env())
        finally:
            first.close()

        for n in sizes:
            chosen = names[:n]
            limit = ",".join(chosen)
            row: dict[str, float | int] = {"hosts": n}
            sockets_before = sum(r.sockets for r in variants.values())
            row["labctl_s"] = median_unchanged(labctl_cmd(limit), chosen, labctl_unchanged, args.reps)
            for key, runs in variants.items():
                row[key] = median_unchanged(
                    ansible_cmd(limit, n), chosen, ansible_unchanged, args.reps, runs.env, runs.close
                )
            # ControlPersist sockets left by this size's ansible runs (one per host and run when kept)
            row["ansible_control_sockets"] = sum(r.sockets for r in variants.values()) - sockets_before
            rows.append(row)
            print(
                f"{n:>3} hosts: labctl {row['labctl_s']:.3f}s  ansible {row['ansible_s']:.3f}s  "
                f"ansible+pipelining {row['ansible_pipelining_s']:.3f}s",
                file=sys.stderr,
            )
    finally:
        down(sim_dir)
        shutil.rmtree(sim_dir, ignore_errors=True)
        shutil.rmtree(cp_root, ignore_errors=True)

    ansible_version = subprocess.run(
        [str(BIN / "ansible-playbook"), "--version"], capture_output=True, text=True
    ).stdout.split("\n", 1)[0]
    result = {
        "machine": machine(),
        "python": platform.python_version(),
        "ansible": ansible_version.strip(),
        "date": time.strftime("%Y-%m-%d"),
        "reps": args.reps,
        "rows": rows,
    }
    publish(result, render(result), args.json, args.out, MARK_BEGIN, MARK_END)
    return 0


def render(r: dict) -> str:
    by_hosts = {row["hosts"]: row for row in r["rows"]}
    lines = [
        MARK_BEGIN,
        "## `labctl provision` with nothing to change, against ansible-core",
        "",
        f"Machine: {r['machine']}, Python {r['python']}, {r['ansible']}, {r['date']}. Simulated lab "
        "(network namespaces, one sshd each, links shaped to 1 Gbit). Both tools first converge every "
        "host and must report no change on a second run; then the wall time of the whole command, "
        f"median of {r['reps']} re-runs after one warm-up, each checked to have changed nothing. "
        "Host key checking on for both; every run cold (no connection kept from one run to the next; "
        "within a run ansible keeps one connection per host, its default ControlPersist). "
        "Command: `make bench`.",
        "",
        "Each run checks, on every host:",
        "",
        "- labctl (`provision --json`, a 3-resource playbook): `file` (content, mode), `cron` "
        "(the /etc/cron.d file, its log and lock folders, systemd or not), `model_cache` (the mount, "
        "its size, RAM, the marked /etc/fstab entry, the manifest folder).",
        "- ansible-core (`ansible-playbook`, `gather_facts: false`, forks = hosts, ansible.builtin "
        "only): `file` for 2 folders, `copy` for the file and the /etc/cron.d file, `file` for the "
        "mount point, `command: mountpoint -q` (the mount, run every time), `lineinfile` for the "
        "fstab line, `file` for the manifest folder: 8 module runs per host (the mount itself skipped). It checks no RAM and "
        "no mount size (it would need facts for that).",
        "",
        "| hosts | labctl | ansible-core | ansible-core, pipelining on | labctl vs faster ansible |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in r["rows"]:
        best = min(row["ansible_s"], row["ansible_pipelining_s"])
        lines.append(
            f"| {row['hosts']} | {row['labctl_s']:.3f} s | {row['ansible_s']:.3f} s "
            f"| {row['ansible_pipelining_s']:.3f} s | {best / row['labctl_s']:.1f}x faster |"
        )
    targets = []
    if 4 in by_hosts:
        t = by_hosts[4]["labctl_s"]
        targets.append(f"4-host no-change run under 2 s: {'met' if t < 2 else 'NOT met'} ({t:.2f} s)")
    if 16 in by_hosts:
        row = by_hosts[16]
        ratio = min(row["ansible_s"], row["ansible_pipelining_s"]) / row["labctl_s"]
        targets.append(
            f"at least 3x faster than ansible-core at 16 hosts: {'met' if ratio >= 3 else 'NOT met'} ({ratio:.1f}x)"
        )
    if targets:
        lines += ["", "Targets: " + "; ".join(targets) + "."]
    lines.append(MARK_END)
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
