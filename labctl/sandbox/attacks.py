"""The sandbox self-test's attacks: each one's program and how its containment is judged. Pure.

An attack is one or more programs (run one after another, or at once when `together`) and a
`judge(results, host)` over the runs' JSON results (one per program, in order: exit_code, stdout,
stderr, truncated, timed_out, oom_killed, wall_ms) and the host check made after them
(`labctl/agent/sandbox/hostcheck.py` `compare`: clean, problems, hostname). The programs print
`ESCAPED ...` when they see that they got out (a connection made, a host file read, a mount done);
the judges also look at what the programs cannot see themselves: the run's end, the output cap,
processes or containers left behind, disk and memory not given back.

The table, ATTACKS, holds each attack once (`AttackSpec`: its name, family and what it tries)
with the program that makes it in each language that has one (`Program`), in the order the
self-test runs them; `attacks_for(lang)` makes one language's runnable `Attack`s from it.

The limits assumed are labctl's defaults for a run: one CPU, the memory asked for (equal to
memory+swap), tmpfs work folder and /tmp of a few tens of MiB, a pids limit, no network.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from labctl.sandbox.programs.c import (
    C_CPU,
    C_DISK,
    C_DOUBLE_FORK,
    C_FIND,
    C_FLOOD,
    C_FORK,
    C_IGNORE_TERM,
    C_INCLUDE_HOST,
    C_INCLUDE_SHADOW,
    C_INCLUDE_ZERO,
    C_KEYCTL,
    C_LINE,
    C_MEMORY,
    C_MEMORY_THREADS,
    C_MOUNT,
    C_NEIGHBOUR,
    C_NET_DNS,
    C_NET_GATEWAY,
    C_NET_OUTSIDE,
    C_NET_SOCKETS,
    C_NET_UDP,
    C_PEERS,
    C_PLANT,
    C_PROC,
    C_READONLY_ROOT,
    C_UNSHARE,
)
from labctl.sandbox.programs.python import (
    PY_CPU,
    PY_DISK,
    PY_DOUBLE_FORK,
    PY_FIND,
    PY_FLOOD,
    PY_FORK,
    PY_IGNORE_TERM,
    PY_KEYCTL,
    PY_LINE,
    PY_MEMORY,
    PY_MEMORY_THREADS,
    PY_MOUNT,
    PY_NEIGHBOUR,
    PY_NET_DNS,
    PY_NET_GATEWAY,
    PY_NET_OUTSIDE,
    PY_NET_SOCKETS,
    PY_NET_UDP,
    PY_PEERS,
    PY_PLANT,
    PY_PROC,
    PY_READONLY_ROOT,
    PY_UNSHARE,
)
from labctl.sandbox.programs.scripts import (
    BASH_DISK,
    BASH_DOUBLE_FORK,
    BASH_FIND,
    BASH_FLOOD,
    BASH_FORK,
    BASH_IGNORE_TERM,
    BASH_LINE,
    BASH_MEMORY,
    BASH_NET,
    BASH_PLANT,
    JS_DOUBLE_FORK,
    JS_FIND,
    JS_FLOOD,
    JS_MEMORY,
    JS_NET,
    JS_PLANT,
)

Result = dict[str, Any]
Host = dict[str, Any]
Verdict = tuple[bool, str]

# What a killed container may take beyond its timeout before the run's end counts as escaped:
# docker kill, the init's reaping and the result's trip back. Generous: the judge looks for runs
# that never ended, not for slow ones.
GRACE_S = 20.0
# Bytes of stdout+stderr a run may hand back after its cap: the cap is labctl's (MiBs); a flood
# writes 100 MiB, so anything under this means a cap held.
OUTPUT_BOUND = 16 << 20
# A CPU burn on every core may use this many cores' worth of time: the quota is one core; the rest
# is accounting noise.
CPU_BOUND = 1.5


@dataclass(frozen=True)
class Attack:
    name: str
    lang: str
    kind: str  # the family, for the table and the unit tests: fork, memory, disk, output...
    what: str  # one line: what the program tries
    programs: tuple[str, ...]
    judge: Callable[[Sequence[Result], Host], Verdict]
    together: bool = False  # the programs run at once (two runs signalling each other)
    timeout: float = 5.0
    memory_mb: int = 256

    def requests(self) -> list[dict[str, Any]]:
        """The runs, as `sandbox.run` takes them."""
        return [
            {
                "lang": self.lang,
                "source": src,
                "stdin": "",
                "timeout": self.timeout,
                "memory_mb": self.memory_mb,
            }
            for src in self.programs
        ]


# ---------------------------------------------------------------- judging


def _out(r: Result) -> str:
    return f"{r.get('stdout') or ''}{r.get('stderr') or ''}"


def _escaped_line(results: Sequence[Result]) -> str | None:
    for r in results:
        for line in (r.get("stdout") or "").splitlines():
            if line.startswith("ESCAPED"):
                return line[:300]
    return None


def _host_problem(host: Host) -> str | None:
    if host.get("clean", False):
        return None
    problems = host.get("problems") or ["the host check did not come back clean"]
    return "; ".join(str(p) for p in problems)[:500]


def _ended(r: Result, timeout: float) -> str | None:
    """Why the run did not end within its timeout (plus grace), or None when it did."""
    wall = float(r.get("wall_ms") or 0) / 1000
    if wall > timeout + GRACE_S:
        return f"the run lasted {wall:.1f} s with a {timeout:g} s timeout"
    return None


def _common(results: Sequence[Result], host: Host, timeout: float) -> str | None:
    """The checks every attack shares: the host left clean, every run ended, no ESCAPED line."""
    for check in (
        _host_problem(host),
        *(_ended(r, timeout) for r in results),
        _escaped_line(results),
    ):
        if check:
            return check
    return None


def _field(r: Result, word: str) -> str:
    """The rest of the first stdout line starting with `word`, '' when none."""
    for line in (r.get("stdout") or "").splitlines():
        if line.startswith(word + " ") or line == word:
            return line[len(word) :].strip()
    return ""


def _judge_bounded(timeout: float) -> Callable[[Sequence[Result], Host], Verdict]:
    """Runs meant to be stopped by a limit (fork bomb, CPU burn through the timeout)."""

    def judge(results: Sequence[Result], host: Host) -> Verdict:
        bad = _common(results, host, timeout)
        if bad:
            return False, bad
        r = results[-1]
        how = "timed out" if r.get("timed_out") else f"exit {r.get('exit_code')}"
        return True, f"stopped ({how}) after {float(r.get('wall_ms') or 0) / 1000:.1f} s; host clean"

    return judge


def _judge_memory(timeout: float) -> Callable[[Sequence[Result], Host], Verdict]:
    def judge(results: Sequence[Result], host: Host) -> Verdict:
        bad = _common(results, host, timeout)
        if bad:
            return False, bad
        r = results[-1]
        if not r.get("oom_killed") and r.get("exit_code") == 0:
            return False, "the program ended normally without reaching its goal or being stopped"
        got = (r.get("stdout") or "").split()
        last = next((got[i + 1] for i in range(len(got) - 1, -1, -1) if got[i] == "MB"), "?")
        return (
            True,
            f"stopped at {last} MiB (oom_killed={bool(r.get('oom_killed'))}, exit {r.get('exit_code')})",
        )

    return judge


def _judge_disk(timeout: float) -> Callable[[Sequence[Result], Host], Verdict]:
    def judge(results: Sequence[Result], host: Host) -> Verdict:
        bad = _common(results, host, timeout)
        if bad:
            return False, bad
        r = results[-1]
        wrote = _field(r, "WROTE")
        if not wrote and not (r.get("oom_killed") or r.get("timed_out") or r.get("exit_code")):
            return False, "the program neither reported how far it got nor was stopped"
        return True, f"wrote {wrote or '(killed before reporting)'}; host disk back"

    return judge


def _judge_blocked(timeout: float) -> Callable[[Sequence[Result], Host], Verdict]:
    """Programs that try things one by one and print BLOCKED (or ESCAPED) for each."""

    def judge(results: Sequence[Result], host: Host) -> Verdict:
        bad = _common(results, host, timeout)
        if bad:
            return False, bad
        lines = [
            ln for r in results for ln in (r.get("stdout") or "").splitlines() if ln.startswith("BLOCKED")
        ]
        if not lines:
            r = results[-1]
            return False, f"no attempt reported (exit {r.get('exit_code')}): {_out(r)[:200]!r}"
        return True, f"{len(lines)} blocked: " + " | ".join(ln[8:70] for ln in lines[:4])

    return judge


def _judge_output(timeout: float) -> Callable[[Sequence[Result], Host], Verdict]:
    def judge(results: Sequence[Result], host: Host) -> Verdict:
        bad = _common(results, host, timeout)
        if bad:
            return False, bad
        r = results[-1]
        size = len(r.get("stdout") or "") + len(r.get("stderr") or "")
        if size > OUTPUT_BOUND:
            return False, f"{size >> 20} MiB of output came back (truncated={bool(r.get('truncated'))})"
        if not r.get("truncated"):
            return False, f"the output ({size} bytes) was not marked truncated after a 100 MiB flood"
        return True, f"capped at {size} bytes, truncated"

    return judge


def _judge_leftover(timeout: float) -> Callable[[Sequence[Result], Host], Verdict]:
    def judge(results: Sequence[Result], host: Host) -> Verdict:
        bad = _common(results, host, timeout)
        if bad:
            return False, bad
        planted, checked = _field(results[0], "PLANTED"), _field(results[-1], "CHECKED")
        if not planted:
            return False, f"the first run planted nothing (exit {results[0].get('exit_code')})"
        if not checked:
            return False, f"the second run did not report its check (exit {results[-1].get('exit_code')})"
        return True, f"planted in {planted}; the next run found none"

    return judge


def _judge_cpu(timeout: float) -> Callable[[Sequence[Result], Host], Verdict]:
    def judge(results: Sequence[Result], host: Host) -> Verdict:
        bad = _common(results, host, timeout)
        if bad:
            return False, bad
        r = results[-1]
        words = _field(r, "CPU").split()
        try:
            cpu, wall = float(words[0]), float(words[2])
        except (IndexError, ValueError):
            if r.get("timed_out"):
                return True, "stopped by the timeout before measuring"
            return False, f"no measurement (exit {r.get('exit_code')}): {_out(r)[:200]!r}"
        cores = cpu / wall if wall > 0 else 0.0
        if cores > CPU_BOUND:
            return False, f"used {cores:.2f} cores ({cpu:.1f} s CPU in {wall:.1f} s) past a 1-core quota"
        return True, f"{cores:.2f} cores used of the quota"

    return judge


def _judge_peers(timeout: float) -> Callable[[Sequence[Result], Host], Verdict]:
    def judge(results: Sequence[Result], host: Host) -> Verdict:
        bad = _common(results, host, timeout)
        if bad:
            return False, bad
        for i, r in enumerate(results):
            if "SURVIVED" not in (r.get("stdout") or ""):
                return False, f"run {i + 1} did not survive (exit {r.get('exit_code')}): killed by the other?"
        return True, "neither run could see or signal the other"

    return judge


def _judge_neighbour(timeout: float) -> Callable[[Sequence[Result], Host], Verdict]:
    def judge(results: Sequence[Result], host: Host) -> Verdict:
        bad = _common(results, host, timeout)
        if bad:
            return False, bad
        if "SURVIVED" not in (results[-1].get("stdout") or ""):
            r = results[-1]
            return (
                False,
                f"the run beside the bomb did not finish (exit {r.get('exit_code')}): {_out(r)[:200]!r}",
            )
        return True, f"the run beside the bomb forked {_field(results[-1], 'FORKED') or '?'} times"

    return judge


def _judge_compiler(timeout: float) -> Callable[[Sequence[Result], Host], Verdict]:
    def judge(results: Sequence[Result], host: Host) -> Verdict:
        bad = _common(results, host, timeout)
        if bad:
            return False, bad
        r = results[-1]
        text = _out(r)
        name = str(host.get("hostname") or "")
        # gcc quotes the identifier the included hostname became: 'vm' undeclared.
        if name and re.search(f"[‘'`]{re.escape(name)}[’']", text):
            return False, f"the compiler's output holds the host's hostname {name!r}: it read a host file"
        if "root:" in text:
            return False, "the compiler's output holds /etc/shadow lines: it read the file as root"
        if r.get("exit_code") == 0 and not r.get("timed_out"):
            return False, "the program compiled and ran with the file included"
        return True, f"refused or contained (exit {r.get('exit_code')}, timed_out={bool(r.get('timed_out'))})"

    return judge


def _judge_host_identity(timeout: float) -> Callable[[Sequence[Result], Host], Verdict]:
    blocked = _judge_blocked(timeout)

    def judge(results: Sequence[Result], host: Host) -> Verdict:
        name = str(host.get("hostname") or "")
        seen = _field(results[-1], "HOSTNAME")
        if name and seen == name:
            return False, f"the program sees the host's hostname {name!r} (UTS namespace shared)"
        return blocked(results, host)

    return judge


JUDGES: dict[str, Callable[[float], Callable[[Sequence[Result], Host], Verdict]]] = {
    "fork": _judge_bounded,
    "memory": _judge_memory,
    "disk": _judge_disk,
    "leftover": _judge_leftover,
    "output": _judge_output,
    "time": _judge_bounded,
    "cpu": _judge_cpu,
    "network": _judge_blocked,
    "proc": _judge_host_identity,
    "privilege": _judge_blocked,
    "peers": _judge_peers,
    "neighbour": _judge_neighbour,
    "compiler": _judge_compiler,
}

# ---------------------------------------------------------------- the table


@dataclass(frozen=True)
class Program:
    """One language's way of making an attack: its program(s), the time each run may take, and
    the line the table shows where this language tries it differently from the attack's `what`."""

    sources: tuple[str, ...]
    timeout: float
    what: str | None = None


@dataclass(frozen=True)
class AttackSpec:
    """An attack, written once: its name, its family (which picks the judge), what it tries, and
    the program per language that has one. A language without a program skips it."""

    name: str
    kind: str
    what: str
    programs: Mapping[str, Program]
    together: bool = False
    memory_mb: int = 256

    def attack(self, lang: str) -> Attack:
        prog = self.programs[lang]
        timeout = float(prog.timeout)  # a float in every request, as the JSON has always carried it
        return Attack(
            name=self.name,
            lang=lang,
            kind=self.kind,
            what=prog.what or self.what,
            programs=prog.sources,
            judge=JUDGES[self.kind](timeout),
            together=self.together,
            timeout=timeout,
            memory_mb=self.memory_mb,
        )


def _disk_fill(name: str, path: str, bash: bool) -> AttackSpec:
    programs = {
        "python": Program((PY_DISK.format(path=path),), 10),
        "c": Program((C_DISK.replace("{path}", path),), 10),
    }
    if bash:
        programs["bash"] = Program((BASH_DISK.replace("{path}", path),), 10)
    return AttackSpec(f"disk_fill_{name}", "disk", f"write 1 GiB into {path}", programs)


# Every attack once, in the order the self-test runs (and reports) them for each language.
ATTACKS: tuple[AttackSpec, ...] = (
    AttackSpec(
        "fork_bomb",
        "fork",
        "fork without end",
        {
            "python": Program((PY_FORK,), 3),
            "c": Program((C_FORK,), 3),
            "bash": Program((BASH_FORK,), 3, "the classic :(){ :|:& };:"),
        },
    ),
    AttackSpec(
        "fork_bomb_neighbour",
        "neighbour",
        "a run forks beside a fork bomb",
        {"python": Program((PY_FORK, PY_NEIGHBOUR), 5), "c": Program((C_FORK, C_NEIGHBOUR), 8)},
        together=True,
    ),
    AttackSpec(
        "memory_bomb",
        "memory",
        "allocate 2 GiB",
        {
            "python": Program((PY_MEMORY,), 10),
            "c": Program((C_MEMORY,), 10),
            "bash": Program((BASH_MEMORY,), 10, "double a string to 2 GiB"),
            "javascript": Program((JS_MEMORY,), 10, "allocate 2 GiB of buffers"),
        },
    ),
    AttackSpec(
        "memory_bomb_threads",
        "memory",
        "allocate 2 GiB across 8 threads",
        {"python": Program((PY_MEMORY_THREADS,), 10), "c": Program((C_MEMORY_THREADS,), 10)},
    ),
    _disk_fill("work", "/work", bash=True),
    _disk_fill("tmp", "/tmp", bash=True),
    _disk_fill("shm", "/dev/shm", bash=False),
    AttackSpec(
        "write_readonly_root",
        "privilege",
        "write into the image's folders",
        {"python": Program((PY_READONLY_ROOT,), 5), "c": Program((C_READONLY_ROOT,), 10)},
    ),
    AttackSpec(
        "files_for_next_run",
        "leftover",
        "leave a marker for the next run",
        {
            "python": Program((PY_PLANT, PY_FIND), 5),
            "c": Program((C_PLANT, C_FIND), 10),
            "bash": Program((BASH_PLANT, BASH_FIND), 5),
            "javascript": Program((JS_PLANT, JS_FIND), 5),
        },
    ),
    AttackSpec(
        "flood_stdout",
        "output",
        "write 100 MiB to stdout",
        {
            "python": Program((PY_FLOOD.format(fd=1),), 10),
            "c": Program((C_FLOOD.replace("{fd}", "1"),), 10),
            "bash": Program((BASH_FLOOD.format(redirect=""),), 15),
            "javascript": Program((JS_FLOOD,), 15),
        },
    ),
    AttackSpec(
        "flood_stderr",
        "output",
        "write 100 MiB to stderr",
        {
            "python": Program((PY_FLOOD.format(fd=2),), 10),
            "c": Program((C_FLOOD.replace("{fd}", "2"),), 10),
            "bash": Program((BASH_FLOOD.format(redirect=" >&2"),), 15),
        },
    ),
    AttackSpec(
        "enormous_line",
        "output",
        "one 100 MiB line",
        {
            "python": Program((PY_LINE,), 10),
            "c": Program((C_LINE,), 10),
            "bash": Program((BASH_LINE,), 15),
        },
    ),
    AttackSpec(
        "ignore_sigterm",
        "time",
        "ignore SIGTERM and run forever",
        {
            "python": Program((PY_IGNORE_TERM,), 2),
            "c": Program((C_IGNORE_TERM,), 3),
            "bash": Program((BASH_IGNORE_TERM,), 2, "trap '' TERM and loop"),
        },
    ),
    AttackSpec(
        "setsid_double_fork",
        "time",
        "a detached grandchild with closed output outlives the run",
        {
            "python": Program((PY_DOUBLE_FORK.format(close=True),), 3),
            "c": Program((C_DOUBLE_FORK.replace("{close}", "1"),), 5),
            "bash": Program((BASH_DOUBLE_FORK,), 3, "setsid a looping shell"),
            "javascript": Program((JS_DOUBLE_FORK,), 3, "a detached child outlives the run"),
        },
    ),
    AttackSpec(
        "detached_holding_output",
        "time",
        "a detached grandchild keeps stdout open",
        {
            "python": Program((PY_DOUBLE_FORK.format(close=False),), 3),
            "c": Program((C_DOUBLE_FORK.replace("{close}", "0"),), 5),
        },
    ),
    AttackSpec(
        "cpu_burn",
        "cpu",
        "burn every core for 2 s",
        {"python": Program((PY_CPU,), 10), "c": Program((C_CPU,), 10)},
    ),
    AttackSpec(
        "net_tcp_gateway",
        "network",
        "TCP to the Docker gateway",
        {"python": Program((PY_NET_GATEWAY,), 15), "c": Program((C_NET_GATEWAY,), 20)},
    ),
    AttackSpec(
        "net_tcp_outside",
        "network",
        "TCP to outside addresses",
        {
            "python": Program((PY_NET_OUTSIDE,), 15),
            "c": Program((C_NET_OUTSIDE,), 20),
            "bash": Program(
                (BASH_NET.format(targets="1.1.1.1:443 8.8.8.8:53 172.17.0.1:22"),), 15, "TCP via /dev/tcp"
            ),
            "javascript": Program((JS_NET,), 15),
        },
    ),
    AttackSpec(
        "net_udp",
        "network",
        "a UDP DNS query out",
        {"python": Program((PY_NET_UDP,), 10), "c": Program((C_NET_UDP,), 10)},
    ),
    AttackSpec(
        "net_dns",
        "network",
        "resolve a name",
        {"python": Program((PY_NET_DNS,), 15), "c": Program((C_NET_DNS,), 20)},
    ),
    AttackSpec(
        "docker_socket",
        "network",
        "connect to the Docker socket",
        {"python": Program((PY_NET_SOCKETS,), 5), "c": Program((C_NET_SOCKETS,), 10)},
    ),
    AttackSpec(
        "proc_host",
        "proc",
        "host files and processes through /proc and /dev",
        {"python": Program((PY_PROC,), 10), "c": Program((C_PROC,), 10)},
    ),
    AttackSpec(
        "mount",
        "privilege",
        "mount a tmpfs and proc",
        {"python": Program((PY_MOUNT,), 10), "c": Program((C_MOUNT,), 10)},
    ),
    AttackSpec(
        "unshare",
        "privilege",
        "new user, mount and pid namespaces",
        {
            "python": Program((PY_UNSHARE,), 10),
            "c": Program((C_UNSHARE,), 10, "new user, mount, pid and net namespaces"),
        },
    ),
    AttackSpec(
        "keyctl",
        "privilege",
        "the kernel keyring",
        {
            "python": Program((PY_KEYCTL,), 10),
            "c": Program((C_KEYCTL,), 10, "join and add to the kernel keyring"),
        },
    ),
    AttackSpec(
        "signal_other_run",
        "peers",
        "two runs at once kill -9 each other",
        {"python": Program((PY_PEERS, PY_PEERS), 10), "c": Program((C_PEERS, C_PEERS), 15)},
        together=True,
    ),
    AttackSpec(
        "include_shadow",
        "compiler",
        '#include "/etc/shadow"',
        {"c": Program((C_INCLUDE_SHADOW,), 10)},
    ),
    AttackSpec(
        "include_host_file",
        "compiler",
        '#include "/etc/hostname" into an array',
        {"c": Program((C_INCLUDE_HOST,), 10)},
    ),
    AttackSpec(
        "include_dev_zero",
        "compiler",
        '#include "/dev/zero": a compiler that never ends',
        {"c": Program((C_INCLUDE_ZERO,), 5)},
    ),
)


def languages() -> list[str]:
    """The languages that have attacks."""
    return sorted({lang for spec in ATTACKS for lang in spec.programs})


def attacks_for(lang: str) -> list[Attack]:
    """Every attack with a program in `lang`, in the table's order; [] for a language without any."""
    return [spec.attack(lang) for spec in ATTACKS if lang in spec.programs]
