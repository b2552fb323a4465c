"""The sandbox self-test's attacks: each one's program and how its containment is judged. Pure.

An attack is one or more programs (run one after another, or at once when `together`) and a
`judge(results, host)` over the runs' JSON results (one per program, in order: exit_code, stdout,
stderr, truncated, timed_out, oom_killed, wall_ms) and the host check made after them
(`labctl/agent/sandbox/hostcheck.py` `compare`: clean, problems, hostname). The programs print
`ESCAPED ...` when they see that they got out (a connection made, a host file read, a mount done);
the judges also look at what the programs cannot see themselves: the run's end, the output cap,
processes or containers left behind, disk and memory not given back.

The limits assumed are labctl's defaults for a run: one CPU, the memory asked for (equal to
memory+swap), tmpfs work folder and /tmp of a few tens of MiB, a pids limit, no network.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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
MARKER = "labctl-selftest-marker"


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
        """The runs, as `sandbox_run` takes them."""
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

# ---------------------------------------------------------------- python

PY_FORK = """\
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""

PY_MEMORY = """\
chunks = []
mb = 0
while mb < 2048:
    chunks.append(b"x" * (16 << 20))
    mb += 16
    print("MB", mb, flush=True)
print("ESCAPED allocated", mb, "MiB")
"""

PY_MEMORY_THREADS = """\
import threading
total = [0]
lock = threading.Lock()
def grab():
    held = []
    for _ in range(32):
        held.append(b"x" * (8 << 20))
        with lock:
            total[0] += 8
            print("MB", total[0], flush=True)
threads = [threading.Thread(target=grab) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
if total[0] >= 2048:
    print("ESCAPED allocated", total[0], "MiB across 8 threads")
"""

PY_DISK = """\
import os
path = {path!r}
total = 0
err = "reached the goal"
try:
    for i in range(128):
        with open(os.path.join(path, "fill%d" % i), "wb") as f:
            for _ in range(8):
                f.write(b"x" * (1 << 20))
                total += 1
except OSError as e:
    err = str(e)
print("WROTE", total, "MiB in", path, "-", err, flush=True)
if total >= 1024:
    print("ESCAPED wrote", total, "MiB into", path)
"""

PY_READONLY_ROOT = """\
import os
for d in ("/", "/etc", "/usr/local", "/var/tmp", "/home", "/root", "/opt"):
    p = os.path.join(d, "labctl-selftest-write")
    try:
        with open(p, "w") as f:
            f.write("x")
        print("ESCAPED wrote", p)
    except OSError as e:
        print("BLOCKED write", p, e.strerror)
"""

PY_PLANT = f"""\
import os
done = []
for d in ("/work", "/tmp", "/dev/shm", "/var/tmp", "/"):
    try:
        with open(os.path.join(d, "{MARKER}"), "w") as f:
            f.write("left by an earlier run")
        done.append(d)
    except OSError:
        pass
print("PLANTED", ",".join(done))
"""

PY_FIND = f"""\
import os
for d in ("/work", "/tmp", "/dev/shm", "/var/tmp", "/"):
    if os.path.exists(os.path.join(d, "{MARKER}")):
        print("ESCAPED found the earlier run's marker in", d)
print("CHECKED /work /tmp /dev/shm /var/tmp /")
"""

PY_FLOOD = """\
import os
line = b"A" * 65535 + b"\\n"
for _ in range(1600):
    os.write({fd}, line)
"""

PY_LINE = """\
import os
chunk = b"B" * 65536
for _ in range(1600):
    os.write(1, chunk)
"""

PY_IGNORE_TERM = """\
import signal, time
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
print("IGNORING", flush=True)
while True:
    try:
        time.sleep(1)
    except BaseException:
        pass
"""

# The grandchild lives on after the run's program exits: only the host check can see it.
PY_DOUBLE_FORK = """\
import os, signal, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)
        if {close}:
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
        while True:
            time.sleep(1)
    os._exit(0)
os.wait()
print("DETACHED", flush=True)
"""

PY_CPU = """\
import os, time
n = max(4, 2 * (os.cpu_count() or 1))
start = time.time()
end = start + 2.0
kids = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        while time.time() < end:
            pass
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
t = os.times()
print("CPU %.3f WALL %.3f WORKERS %d" % (t.children_user + t.children_system, time.time() - start, n))
"""

PY_NET_HEAD = """\
import socket, struct
def gateway():
    try:
        for line in open("/proc/net/route").read().splitlines()[1:]:
            f = line.split()
            if f[1] == "00000000":
                return socket.inet_ntoa(struct.pack("<L", int(f[2], 16)))
    except (OSError, IndexError, ValueError):
        pass
    return "172.17.0.1"
def tcp(host, port):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, port))
        print("ESCAPED connected to %s:%d" % (host, port))
    except ConnectionRefusedError:
        print("ESCAPED reached %s:%d (refused: something answered)" % (host, port))
    except OSError as e:
        print("BLOCKED tcp %s:%d %s" % (host, port, e))
    finally:
        s.close()
"""

PY_NET_GATEWAY = (
    PY_NET_HEAD
    + """\
for port in (22, 80, 2375, 2376):
    tcp(gateway(), port)
"""
)

PY_NET_OUTSIDE = (
    PY_NET_HEAD
    + """\
for host, port in (("1.1.1.1", 443), ("8.8.8.8", 53), ("9.9.9.9", 80)):
    tcp(host, port)
"""
)

PY_NET_UDP = (
    PY_NET_HEAD
    + """\
query = b"\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x07example\\x03com\\x00\\x00\\x01\\x00\\x01"
for host in ("8.8.8.8", gateway()):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    try:
        s.sendto(query, (host, 53))
        print("ESCAPED sent a UDP datagram to %s:53" % host)
    except OSError as e:
        print("BLOCKED udp %s:53 %s" % (host, e))
    finally:
        s.close()
"""
)

PY_NET_DNS = """\
import socket
for name in ("deb.debian.org", "example.com"):
    try:
        print("ESCAPED resolved", name, socket.getaddrinfo(name, 80)[0][4])
    except OSError as e:
        print("BLOCKED dns", name, e)
"""

PY_NET_SOCKETS = """\
import os, socket
for path in ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock"):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        print("ESCAPED connected to", path)
    except OSError as e:
        print("BLOCKED unix", path, e.strerror)
    finally:
        s.close()
ifaces = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
others = [i for i in ifaces if i != "lo"]
if others:
    print("ESCAPED network interfaces besides lo:", others)
else:
    print("BLOCKED interfaces: only", ifaces)
"""

PY_PROC = """\
import os, socket
print("HOSTNAME", socket.gethostname())
if os.getuid() == 0 or os.geteuid() == 0:
    print("ESCAPED runs as root")
host_names = ("dockerd", "containerd", "containerd-shim", "sshd", "systemd", "init", "cron", "agetty")
pids = [p for p in os.listdir("/proc") if p.isdigit()]
seen = []
for p in pids:
    try:
        comm = open("/proc/%s/comm" % p).read().strip()
    except OSError:
        continue
    if comm in host_names:
        seen.append(p + ":" + comm)
if seen:
    print("ESCAPED sees host processes:", seen[:4])
else:
    print("BLOCKED proc: %d pids, none of the host's" % len(pids))
for p in pids:
    try:
        env = open("/proc/%s/environ" % p, "rb").read()
    except OSError:
        continue
    if b"SSH_" in env or b"LABCTL_HOST" in env:
        print("ESCAPED read a host process's environment via /proc/%s/environ" % p)
for path in ("/etc/shadow", "/proc/kcore", "/dev/mem", "/dev/kmsg", "/dev/sda", "/dev/vda", "/dev/nvme0n1"):
    try:
        with open(path, "rb") as f:
            data = f.read(16)
        print("ESCAPED read", path, data[:8])
    except OSError as e:
        print("BLOCKED read", path, e.strerror)
for path, data in (("/proc/sysrq-trigger", "h"), ("/proc/sys/kernel/hostname", "pwned"),
                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "-1")):
    try:
        with open(path, "w") as f:
            f.write(data)
        print("ESCAPED wrote", path)
    except OSError as e:
        print("BLOCKED write", path, e.strerror)
"""

# python3-minimal has no ctypes: then the util-linux tools make the same system calls.
PY_PRIVILEGE = """\
import os, subprocess
try:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
except ImportError:
    libc = None
def call(what, fn, *args):
    if libc is None:
        return False
    rc = getattr(libc, fn)(*args)
    if rc == -1:
        print("BLOCKED", what, os.strerror(ctypes.get_errno()))
    else:
        print("ESCAPED", what, "returned", rc)
    return True
def tool(what, argv):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as e:
        print("BLOCKED", what, e)
        return
    if p.returncode == 0:
        print("ESCAPED", what, "succeeded:", " ".join(argv))
    else:
        print("BLOCKED", what, " ".join((p.stderr or p.stdout).split())[:120])
{body}
"""

PY_MOUNT = PY_PRIVILEGE.format(
    body="""\
if not call("mount tmpfs", "mount", b"none", b"/tmp", b"tmpfs", 0, None):
    tool("mount tmpfs", ["mount", "-t", "tmpfs", "none", "/tmp"])
if not call("mount proc", "mount", b"proc", b"/work", b"proc", 0, None):
    tool("mount proc", ["mount", "-t", "proc", "proc", "/work"])
"""
)

PY_UNSHARE = PY_PRIVILEGE.format(
    body="""\
for flag, name, opt in ((0x10000000, "user", "-Ur"), (0x00020000, "mount", "-m"), (0x20000000, "pid", "-pf")):
    if not call("unshare " + name, "unshare", flag):
        tool("unshare " + name, ["unshare", opt, "true"])
"""
)

PY_KEYCTL = PY_PRIVILEGE.format(
    body="""\
if libc is None:
    try:
        open("/proc/keys").read()
        print("BLOCKED keyctl: no ctypes here; /proc/keys lists only this user's keys")
    except OSError as e:
        print("BLOCKED keyctl: /proc/keys", e.strerror)
else:
    call("keyctl join", "syscall", 250, 1, b"labctl-selftest")
    call("add_key", "syscall", 248, b"user", b"labctl-selftest", b"x", 1, -3)
"""
)

PY_PEERS = """\
import os, signal, time
me = os.getpid()
own = open("/proc/self/cmdline", "rb").read()
mine = set()
p = me
while p > 1:
    mine.add(p)
    p = int(open("/proc/%d/stat" % p).read().rsplit(")", 1)[1].split()[1])
print("STARTED", flush=True)
killed = set()
deadline = time.time() + 3
while time.time() < deadline:
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in mine or name == "1":
            continue
        try:
            cmd = open("/proc/%s/cmdline" % name, "rb").read()
        except OSError:
            continue
        if cmd == own:
            try:
                os.kill(int(name), signal.SIGKILL)
                killed.add(int(name))
            except OSError:
                pass
    time.sleep(0.05)
if killed:
    print("ESCAPED killed the other run's pids", sorted(killed))
print("SURVIVED", flush=True)
"""

# Runs beside a fork bomb: a per-user process limit (RLIMIT_NPROC) counts every container's
# processes of the sandbox uid together, so one run's bomb would starve its neighbours.
PY_NEIGHBOUR = """\
import os, time
time.sleep(1.5)
ok = 0
for _ in range(8):
    try:
        pid = os.fork()
    except OSError as e:
        print("ESCAPED the neighbour's fork bomb starved this run:", e)
        break
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    ok += 1
print("FORKED", ok)
print("SURVIVED")
"""

# ---------------------------------------------------------------- c

C_FORK = """\
#include <unistd.h>
int main(void) { for (;;) fork(); }
"""

C_MEMORY = """\
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
    size_t mb = 0;
    while (mb < 2048) {
        char *p = malloc(16 << 20);
        if (!p) { printf("MB %zu malloc failed\\n", mb); return 1; }
        memset(p, 1, 16 << 20);
        mb += 16;
        printf("MB %zu\\n", mb); fflush(stdout);
    }
    printf("ESCAPED allocated %zu MiB\\n", mb);
    return 0;
}
"""

C_MEMORY_THREADS = """\
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static size_t total = 0;
static void *grab(void *arg) {
    (void)arg;
    for (int i = 0; i < 32; i++) {
        char *p = malloc(8 << 20);
        if (!p) return NULL;
        memset(p, 1, 8 << 20);
        pthread_mutex_lock(&lock);
        total += 8;
        printf("MB %zu\\n", total); fflush(stdout);
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}
int main(void) {
    pthread_t t[8];
    for (int i = 0; i < 8; i++) pthread_create(&t[i], NULL, grab, NULL);
    for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
    if (total >= 2048) printf("ESCAPED allocated %zu MiB across 8 threads\\n", total);
    return 0;
}
"""

C_DISK = """\
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int main(void) {
    static char buf[1 << 20];
    const char *path = "{path}";
    char name[256];
    size_t total = 0;
    const char *err = "reached the goal";
    memset(buf, 'x', sizeof buf);
    signal(SIGXFSZ, SIG_IGN);
    for (int i = 0; i < 128 && total < 1024; i++) {
        snprintf(name, sizeof name, "%s/fill%d", path, i);
        int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) { err = strerror(errno); break; }
        for (int j = 0; j < 8; j++) {
            if (write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) { err = strerror(errno); i = 1 << 20; break; }
            total++;
        }
        close(fd);
    }
    printf("WROTE %zu MiB in %s - %s\\n", total, path, err);
    if (total >= 1024) printf("ESCAPED wrote %zu MiB into %s\\n", total, path);
    return 0;
}
"""

C_READONLY_ROOT = """\
#include <errno.h>
#include <stdio.h>
#include <string.h>
int main(void) {
    const char *dirs[] = {"/", "/etc", "/usr/local", "/var/tmp", "/home", "/root", "/opt"};
    char p[256];
    for (unsigned i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        snprintf(p, sizeof p, "%s/labctl-selftest-write", dirs[i]);
        FILE *f = fopen(p, "w");
        if (f) { fclose(f); printf("ESCAPED wrote %s\\n", p); }
        else printf("BLOCKED write %s %s\\n", p, strerror(errno));
    }
    return 0;
}
"""

C_PLANT = f"""\
#include <stdio.h>
int main(void) {{
    const char *dirs[] = {{"/work", "/tmp", "/dev/shm", "/var/tmp", ""}};
    char p[256];
    printf("PLANTED ");
    for (unsigned i = 0; i < 5; i++) {{
        snprintf(p, sizeof p, "%s/{MARKER}", dirs[i]);
        FILE *f = fopen(p, "w");
        if (f) {{ fputs("left by an earlier run", f); fclose(f); printf("%s,", dirs[i][0] ? dirs[i] : "/"); }}
    }}
    printf("\\n");
    return 0;
}}
"""

C_FIND = f"""\
#include <stdio.h>
#include <unistd.h>
int main(void) {{
    const char *dirs[] = {{"/work", "/tmp", "/dev/shm", "/var/tmp", ""}};
    char p[256];
    for (unsigned i = 0; i < 5; i++) {{
        snprintf(p, sizeof p, "%s/{MARKER}", dirs[i]);
        if (access(p, F_OK) == 0) printf("ESCAPED found the earlier run's marker in %s\\n", p);
    }}
    printf("CHECKED /work /tmp /dev/shm /var/tmp /\\n");
    return 0;
}}
"""

C_FLOOD = """\
#include <string.h>
#include <unistd.h>
int main(void) {
    static char line[65536];
    memset(line, 'A', sizeof line);
    line[sizeof line - 1] = '\\n';
    for (int i = 0; i < 1600; i++)
        if (write({fd}, line, sizeof line) < 0) return 1;
    return 0;
}
"""

C_LINE = """\
#include <string.h>
#include <unistd.h>
int main(void) {
    static char chunk[65536];
    memset(chunk, 'B', sizeof chunk);
    for (int i = 0; i < 1600; i++)
        if (write(1, chunk, sizeof chunk) < 0) return 1;
    return 0;
}
"""

C_IGNORE_TERM = """\
#include <signal.h>
#include <stdio.h>
#include <unistd.h>
int main(void) {
    signal(SIGTERM, SIG_IGN); signal(SIGINT, SIG_IGN); signal(SIGHUP, SIG_IGN);
    printf("IGNORING\\n"); fflush(stdout);
    for (;;) sleep(1);
}
"""

C_DOUBLE_FORK = """\
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
int main(void) {
    if (fork() == 0) {
        setsid();
        if (fork() == 0) {
            signal(SIGTERM, SIG_IGN); signal(SIGHUP, SIG_IGN); signal(SIGINT, SIG_IGN);
            if ({close}) {
                int null = open("/dev/null", O_RDWR);
                dup2(null, 0); dup2(null, 1); dup2(null, 2);
            }
            for (;;) sleep(1);
        }
        _exit(0);
    }
    wait(NULL);
    printf("DETACHED\\n");
    return 0;
}
"""

C_CPU = """\
#include <stdio.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN) * 2;
    if (n < 4) n = 4;
    double start = now(), end = start + 2.0;
    for (long i = 0; i < n; i++)
        if (fork() == 0) { while (now() < end) {} _exit(0); }
    while (wait(NULL) > 0) {}
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    printf("CPU %.3f WALL %.3f WORKERS %ld\\n", cpu, now() - start, n);
    return 0;
}
"""

C_NET_HEAD = """\
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
static void tcp(const char *host, int port) {
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET; a.sin_port = htons(port); inet_pton(AF_INET, host, &a.sin_addr);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {3, 0};
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(s, (struct sockaddr *)&a, sizeof a) == 0) printf("ESCAPED connected to %s:%d\\n", host, port);
    else if (errno == ECONNREFUSED) printf("ESCAPED reached %s:%d (refused: something answered)\\n", host, port);
    else printf("BLOCKED tcp %s:%d %s\\n", host, port, strerror(errno));
    close(s);
}
static void gateway(char *out, size_t n) {
    FILE *f = fopen("/proc/net/route", "r");
    char line[256], ifc[32];
    unsigned dst, gw;
    snprintf(out, n, "172.17.0.1");
    if (!f) return;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%31s %x %x", ifc, &dst, &gw) == 3 && dst == 0) {
            struct in_addr a = {gw};
            snprintf(out, n, "%s", inet_ntoa(a));
        }
    fclose(f);
}
"""

C_NET_GATEWAY = (
    C_NET_HEAD
    + """\
int main(void) {
    char gw[64];
    gateway(gw, sizeof gw);
    int ports[] = {22, 80, 2375, 2376};
    for (int i = 0; i < 4; i++) tcp(gw, ports[i]);
    return 0;
}
"""
)

C_NET_OUTSIDE = (
    C_NET_HEAD
    + """\
int main(void) { tcp("1.1.1.1", 443); tcp("8.8.8.8", 53); tcp("9.9.9.9", 80); return 0; }
"""
)

C_NET_UDP = (
    C_NET_HEAD
    + """\
int main(void) {
    char gw[64];
    gateway(gw, sizeof gw);
    const char *hosts[] = {"8.8.8.8", gw};
    const char q[] = "\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x07" "example\\x03" "com\\x00\\x00\\x01\\x00\\x01";
    for (int i = 0; i < 2; i++) {
        struct sockaddr_in a = {0};
        a.sin_family = AF_INET; a.sin_port = htons(53); inet_pton(AF_INET, hosts[i], &a.sin_addr);
        int s = socket(AF_INET, SOCK_DGRAM, 0);
        if (sendto(s, q, sizeof q - 1, 0, (struct sockaddr *)&a, sizeof a) >= 0)
            printf("ESCAPED sent a UDP datagram to %s:53\\n", hosts[i]);
        else printf("BLOCKED udp %s:53 %s\\n", hosts[i], strerror(errno));
        close(s);
    }
    return 0;
}
"""
)

C_NET_DNS = (
    C_NET_HEAD
    + """\
int main(void) {
    const char *names[] = {"deb.debian.org", "example.com"};
    for (int i = 0; i < 2; i++) {
        struct addrinfo *res = NULL;
        int rc = getaddrinfo(names[i], "80", NULL, &res);
        if (rc == 0) { printf("ESCAPED resolved %s\\n", names[i]); freeaddrinfo(res); }
        else printf("BLOCKED dns %s %s\\n", names[i], gai_strerror(rc));
    }
    return 0;
}
"""
)

C_NET_SOCKETS = (
    C_NET_HEAD
    + """\
#include <dirent.h>
int main(void) {
    const char *paths[] = {"/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock"};
    for (int i = 0; i < 3; i++) {
        struct sockaddr_un a = {0};
        a.sun_family = AF_UNIX; snprintf(a.sun_path, sizeof a.sun_path, "%s", paths[i]);
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        if (connect(s, (struct sockaddr *)&a, sizeof a) == 0) printf("ESCAPED connected to %s\\n", paths[i]);
        else printf("BLOCKED unix %s %s\\n", paths[i], strerror(errno));
        close(s);
    }
    DIR *d = opendir("/sys/class/net");
    int others = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.' && strcmp(e->d_name, "lo") != 0) { printf("ESCAPED network interface %s\\n", e->d_name); others++; }
    if (d) closedir(d);
    if (!others) printf("BLOCKED interfaces: only lo\\n");
    return 0;
}
"""
)

C_PROC = """\
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static size_t slurp(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t got = fread(buf, 1, n - 1, f);
    fclose(f);
    buf[got] = 0;
    for (size_t i = 0; i < got; i++) if (!buf[i]) buf[i] = ' ';
    return got;
}
int main(void) {
    char host[256] = "";
    gethostname(host, sizeof host);
    printf("HOSTNAME %s\\n", host);
    if (getuid() == 0 || geteuid() == 0) printf("ESCAPED runs as root\\n");
    const char *names[] = {"dockerd", "containerd", "containerd-shim", "sshd", "systemd", "init", "cron", "agetty"};
    DIR *d = opendir("/proc");
    struct dirent *e;
    int pids = 0, seen = 0;
    char path[512], buf[4096];
    while (d && (e = readdir(d))) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        pids++;
        snprintf(path, sizeof path, "/proc/%s/comm", e->d_name);
        if (slurp(path, buf, sizeof buf)) {
            buf[strcspn(buf, "\\n")] = 0;
            for (int i = 0; i < 8; i++)
                if (!strcmp(buf, names[i])) { printf("ESCAPED sees host process %s:%s\\n", e->d_name, buf); seen++; break; }
        }
        snprintf(path, sizeof path, "/proc/%s/environ", e->d_name);
        if (slurp(path, buf, sizeof buf) && (strstr(buf, "SSH_") || strstr(buf, "LABCTL_HOST")))
            printf("ESCAPED read a host process's environment via %s\\n", path);
    }
    if (d) closedir(d);
    if (!seen) printf("BLOCKED proc: %d pids, none of the host's\\n", pids);
    const char *reads[] = {"/etc/shadow", "/proc/kcore", "/dev/mem", "/dev/kmsg", "/dev/sda", "/dev/vda", "/dev/nvme0n1"};
    for (int i = 0; i < 7; i++) {
        FILE *f = fopen(reads[i], "rb");
        if (f && fread(buf, 1, 8, f) > 0) printf("ESCAPED read %s\\n", reads[i]);
        else printf("BLOCKED read %s %s\\n", reads[i], f ? "empty" : strerror(errno));
        if (f) fclose(f);
    }
    const char *writes[] = {"/proc/sysrq-trigger", "/proc/sys/kernel/hostname", "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
    const char *data[] = {"h", "pwned", "-1"};
    for (int i = 0; i < 3; i++) {
        FILE *f = fopen(writes[i], "w");
        if (f && fputs(data[i], f) >= 0 && fclose(f) == 0) printf("ESCAPED wrote %s\\n", writes[i]);
        else printf("BLOCKED write %s %s\\n", writes[i], strerror(errno));
    }
    return 0;
}
"""

C_MOUNT = """\
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
int main(void) {
    if (mount("none", "/tmp", "tmpfs", 0, NULL) == 0) printf("ESCAPED mounted a tmpfs\\n");
    else printf("BLOCKED mount tmpfs %s\\n", strerror(errno));
    if (mount("proc", "/work", "proc", 0, NULL) == 0) printf("ESCAPED mounted proc\\n");
    else printf("BLOCKED mount proc %s\\n", strerror(errno));
    return 0;
}
"""

C_UNSHARE = """\
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
int main(void) {
    int flags[] = {CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET};
    const char *names[] = {"user", "mount", "pid", "net"};
    for (int i = 0; i < 4; i++)
        if (unshare(flags[i]) == 0) printf("ESCAPED unshare %s\\n", names[i]);
        else printf("BLOCKED unshare %s %s\\n", names[i], strerror(errno));
    return 0;
}
"""

C_KEYCTL = """\
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(void) {
    long r = syscall(SYS_keyctl, 1, "labctl-selftest");
    if (r >= 0) printf("ESCAPED keyctl join returned %ld\\n", r);
    else printf("BLOCKED keyctl join %s\\n", strerror(errno));
    r = syscall(SYS_add_key, "user", "labctl-selftest", "x", 1, -3);
    if (r >= 0) printf("ESCAPED add_key returned %ld\\n", r);
    else printf("BLOCKED add_key %s\\n", strerror(errno));
    return 0;
}
"""

C_PEERS = """\
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static size_t slurp(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    return got;
}
int main(void) {
    char own[1024], cmd[1024], path[256], stat[1024];
    size_t own_n = slurp("/proc/self/cmdline", own, sizeof own);
    int mine[64], nmine = 0;
    for (int p = getpid(); p > 1 && nmine < 64;) {
        mine[nmine++] = p;
        snprintf(path, sizeof path, "/proc/%d/stat", p);
        size_t n = slurp(path, stat, sizeof stat - 1);
        stat[n] = 0;
        char *close_paren = strrchr(stat, ')');
        if (!close_paren) break;
        p = atoi(close_paren + 4);
    }
    printf("STARTED\\n"); fflush(stdout);
    int killed = 0;
    time_t end = time(NULL) + 3;
    while (time(NULL) < end) {
        DIR *d = opendir("/proc");
        struct dirent *e;
        while (d && (e = readdir(d))) {
            int pid = atoi(e->d_name), skip = pid <= 1;
            for (int i = 0; i < nmine; i++) skip |= pid == mine[i];
            if (skip) continue;
            snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
            size_t n = slurp(path, cmd, sizeof cmd);
            if (n == own_n && memcmp(cmd, own, n) == 0 && kill(pid, SIGKILL) == 0) killed++;
        }
        if (d) closedir(d);
        usleep(50000);
    }
    if (killed) printf("ESCAPED killed %d of the other run's pids\\n", killed);
    printf("SURVIVED\\n");
    return 0;
}
"""

C_INCLUDE_SHADOW = """\
#include "/etc/shadow"
int main(void) { return 0; }
"""

C_INCLUDE_HOST = """\
static const char leak[] = {
#include "/etc/hostname"
};
int main(void) { return leak[0]; }
"""

C_INCLUDE_ZERO = """\
#include "/dev/zero"
int main(void) { return 0; }
"""

C_NEIGHBOUR = """\
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
int main(void) {
    usleep(1500000);
    int ok = 0;
    for (int i = 0; i < 8; i++) {
        pid_t pid = fork();
        if (pid < 0) { printf("ESCAPED the neighbour's fork bomb starved this run: %s\\n", strerror(errno)); break; }
        if (pid == 0) _exit(0);
        waitpid(pid, NULL, 0);
        ok++;
    }
    printf("FORKED %d\\nSURVIVED\\n", ok);
    return 0;
}
"""

# ---------------------------------------------------------------- bash, javascript

# The bomb detaches from the script at once: the sleep keeps the run going while it grows.
BASH_FORK = ":(){ :|:& };:\nsleep 10\n"

BASH_MEMORY = """\
x=xxxxxxxxxxxxxxxx
mb=0
while [ ${#x} -lt 2147483648 ]; do x=$x$x; echo "MB $(( ${#x} >> 20 ))"; done
echo "ESCAPED allocated $(( ${#x} >> 20 )) MiB"
"""

BASH_DISK = """\
total=0
err="reached the goal"
for i in $(seq 0 127); do
  if ! head -c 8388608 /dev/zero > {path}/fill$i 2>/dev/null; then err="write failed"; break; fi
  total=$((total + 8))
done
echo "WROTE $total MiB in {path} - $err"
[ $total -ge 1024 ] && echo "ESCAPED wrote $total MiB into {path}"
true
"""

BASH_PLANT = f"""\
done=""
for d in /work /tmp /dev/shm /var/tmp; do
  echo "left by an earlier run" 2>/dev/null > $d/{MARKER} && done="$done$d,"
done
echo "PLANTED $done"
"""

BASH_FIND = f"""\
for d in /work /tmp /dev/shm /var/tmp; do
  [ -e $d/{MARKER} ] && echo "ESCAPED found the earlier run's marker in $d"
done
echo "CHECKED /work /tmp /dev/shm /var/tmp"
"""

BASH_FLOOD = "head -c 104857600 /dev/zero | tr '\\0' 'A' | fold -w 65535{redirect}\n"
BASH_LINE = "head -c 104857600 /dev/zero | tr '\\0' 'B'\n"

BASH_IGNORE_TERM = "trap '' TERM INT HUP\necho IGNORING\nwhile :; do sleep 1; done\n"

BASH_DOUBLE_FORK = """\
setsid sh -c 'trap "" TERM HUP INT; while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &
echo DETACHED
"""

BASH_NET = """\
for target in {targets}; do
  if timeout 3 bash -c "exec 3<>/dev/tcp/${{target%:*}}/${{target#*:}}" 2>/dev/null; then
    echo "ESCAPED connected to $target"
  else
    echo "BLOCKED tcp $target"
  fi
done
"""

JS_MEMORY = """\
const held = [];
let mb = 0;
while (mb < 2048) {
  held.push(Buffer.alloc(16 << 20, 1));
  mb += 16;
  console.log("MB " + mb);
}
console.log("ESCAPED allocated " + mb + " MiB");
"""

JS_FLOOD = """\
const line = Buffer.alloc(65536, 65);
line[65535] = 10;
for (let i = 0; i < 1600; i++) require("fs").writeSync(1, line);
"""

JS_DOUBLE_FORK = """\
const { spawn } = require("child_process");
const child = spawn("sh", ["-c", "trap '' TERM HUP INT; while :; do sleep 1; done"], {
  detached: true, stdio: "ignore",
});
child.unref();
console.log("DETACHED");
"""

JS_NET = """\
const net = require("net");
const targets = [["1.1.1.1", 443], ["8.8.8.8", 53]];
let left = targets.length;
for (const [host, port] of targets) {
  const s = net.connect({ host, port, timeout: 3000 });
  const done = (msg) => { console.log(msg); s.destroy(); if (--left === 0) process.exit(0); };
  s.on("connect", () => done(`ESCAPED connected to ${host}:${port}`));
  s.on("timeout", () => done(`BLOCKED tcp ${host}:${port} timeout`));
  s.on("error", (e) => done(e.code === "ECONNREFUSED"
    ? `ESCAPED reached ${host}:${port} (refused: something answered)`
    : `BLOCKED tcp ${host}:${port} ${e.code}`));
}
"""

JS_PLANT = f"""\
const fs = require("fs");
const done = [];
for (const d of ["/work", "/tmp", "/dev/shm", "/var/tmp"]) {{
  try {{ fs.writeFileSync(d + "/{MARKER}", "left by an earlier run"); done.push(d); }} catch (e) {{}}
}}
console.log("PLANTED " + done.join(","));
"""

JS_FIND = f"""\
const fs = require("fs");
for (const d of ["/work", "/tmp", "/dev/shm", "/var/tmp"]) {{
  if (fs.existsSync(d + "/{MARKER}")) console.log("ESCAPED found the earlier run's marker in " + d);
}}
console.log("CHECKED /work /tmp /dev/shm /var/tmp");
"""

# ---------------------------------------------------------------- the table

# (name, kind, what, programs, together, timeout, memory_mb) per language.
Spec = tuple[str, str, str, tuple[str, ...], bool, float, int]

_DISK_DIRS = (("work", "/work"), ("tmp", "/tmp"), ("shm", "/dev/shm"))


def _python() -> list[Spec]:
    specs: list[Spec] = [
        ("fork_bomb", "fork", "fork without end", (PY_FORK,), False, 3, 256),
        (
            "fork_bomb_neighbour",
            "neighbour",
            "a run forks beside a fork bomb",
            (PY_FORK, PY_NEIGHBOUR),
            True,
            5,
            256,
        ),
        ("memory_bomb", "memory", "allocate 2 GiB", (PY_MEMORY,), False, 10, 256),
        (
            "memory_bomb_threads",
            "memory",
            "allocate 2 GiB across 8 threads",
            (PY_MEMORY_THREADS,),
            False,
            10,
            256,
        ),
    ]
    specs += [
        (f"disk_fill_{n}", "disk", f"write 1 GiB into {p}", (PY_DISK.format(path=p),), False, 10, 256)
        for n, p in _DISK_DIRS
    ]
    specs += [
        (
            "write_readonly_root",
            "privilege",
            "write into the image's folders",
            (PY_READONLY_ROOT,),
            False,
            5,
            256,
        ),
        (
            "files_for_next_run",
            "leftover",
            "leave a marker for the next run",
            (PY_PLANT, PY_FIND),
            False,
            5,
            256,
        ),
        ("flood_stdout", "output", "write 100 MiB to stdout", (PY_FLOOD.format(fd=1),), False, 10, 256),
        ("flood_stderr", "output", "write 100 MiB to stderr", (PY_FLOOD.format(fd=2),), False, 10, 256),
        ("enormous_line", "output", "one 100 MiB line", (PY_LINE,), False, 10, 256),
        ("ignore_sigterm", "time", "ignore SIGTERM and run forever", (PY_IGNORE_TERM,), False, 2, 256),
        (
            "setsid_double_fork",
            "time",
            "a detached grandchild with closed output outlives the run",
            (PY_DOUBLE_FORK.format(close=True),),
            False,
            3,
            256,
        ),
        (
            "detached_holding_output",
            "time",
            "a detached grandchild keeps stdout open",
            (PY_DOUBLE_FORK.format(close=False),),
            False,
            3,
            256,
        ),
        ("cpu_burn", "cpu", "burn every core for 2 s", (PY_CPU,), False, 10, 256),
        ("net_tcp_gateway", "network", "TCP to the Docker gateway", (PY_NET_GATEWAY,), False, 15, 256),
        ("net_tcp_outside", "network", "TCP to outside addresses", (PY_NET_OUTSIDE,), False, 15, 256),
        ("net_udp", "network", "a UDP DNS query out", (PY_NET_UDP,), False, 10, 256),
        ("net_dns", "network", "resolve a name", (PY_NET_DNS,), False, 15, 256),
        ("docker_socket", "network", "connect to the Docker socket", (PY_NET_SOCKETS,), False, 5, 256),
        ("proc_host", "proc", "host files and processes through /proc and /dev", (PY_PROC,), False, 10, 256),
        ("mount", "privilege", "mount a tmpfs and proc", (PY_MOUNT,), False, 10, 256),
        ("unshare", "privilege", "new user, mount and pid namespaces", (PY_UNSHARE,), False, 10, 256),
        ("keyctl", "privilege", "the kernel keyring", (PY_KEYCTL,), False, 10, 256),
        (
            "signal_other_run",
            "peers",
            "two runs at once kill -9 each other",
            (PY_PEERS, PY_PEERS),
            True,
            10,
            256,
        ),
    ]
    return specs


def _c() -> list[Spec]:
    specs: list[Spec] = [
        ("fork_bomb", "fork", "fork without end", (C_FORK,), False, 3, 256),
        (
            "fork_bomb_neighbour",
            "neighbour",
            "a run forks beside a fork bomb",
            (C_FORK, C_NEIGHBOUR),
            True,
            8,
            256,
        ),
        ("memory_bomb", "memory", "allocate 2 GiB", (C_MEMORY,), False, 10, 256),
        (
            "memory_bomb_threads",
            "memory",
            "allocate 2 GiB across 8 threads",
            (C_MEMORY_THREADS,),
            False,
            10,
            256,
        ),
    ]
    specs += [
        (
            f"disk_fill_{n}",
            "disk",
            f"write 1 GiB into {p}",
            (C_DISK.replace("{path}", p),),
            False,
            10,
            256,
        )
        for n, p in _DISK_DIRS
    ]
    specs += [
        (
            "write_readonly_root",
            "privilege",
            "write into the image's folders",
            (C_READONLY_ROOT,),
            False,
            10,
            256,
        ),
        (
            "files_for_next_run",
            "leftover",
            "leave a marker for the next run",
            (C_PLANT, C_FIND),
            False,
            10,
            256,
        ),
        (
            "flood_stdout",
            "output",
            "write 100 MiB to stdout",
            (C_FLOOD.replace("{fd}", "1"),),
            False,
            10,
            256,
        ),
        (
            "flood_stderr",
            "output",
            "write 100 MiB to stderr",
            (C_FLOOD.replace("{fd}", "2"),),
            False,
            10,
            256,
        ),
        ("enormous_line", "output", "one 100 MiB line", (C_LINE,), False, 10, 256),
        ("ignore_sigterm", "time", "ignore SIGTERM and run forever", (C_IGNORE_TERM,), False, 3, 256),
        (
            "setsid_double_fork",
            "time",
            "a detached grandchild with closed output outlives the run",
            (C_DOUBLE_FORK.replace("{close}", "1"),),
            False,
            5,
            256,
        ),
        (
            "detached_holding_output",
            "time",
            "a detached grandchild keeps stdout open",
            (C_DOUBLE_FORK.replace("{close}", "0"),),
            False,
            5,
            256,
        ),
        ("cpu_burn", "cpu", "burn every core for 2 s", (C_CPU,), False, 10, 256),
        ("net_tcp_gateway", "network", "TCP to the Docker gateway", (C_NET_GATEWAY,), False, 20, 256),
        ("net_tcp_outside", "network", "TCP to outside addresses", (C_NET_OUTSIDE,), False, 20, 256),
        ("net_udp", "network", "a UDP DNS query out", (C_NET_UDP,), False, 10, 256),
        ("net_dns", "network", "resolve a name", (C_NET_DNS,), False, 20, 256),
        ("docker_socket", "network", "connect to the Docker socket", (C_NET_SOCKETS,), False, 10, 256),
        ("proc_host", "proc", "host files and processes through /proc and /dev", (C_PROC,), False, 10, 256),
        ("mount", "privilege", "mount a tmpfs and proc", (C_MOUNT,), False, 10, 256),
        ("unshare", "privilege", "new user, mount, pid and net namespaces", (C_UNSHARE,), False, 10, 256),
        ("keyctl", "privilege", "join and add to the kernel keyring", (C_KEYCTL,), False, 10, 256),
        (
            "signal_other_run",
            "peers",
            "two runs at once kill -9 each other",
            (C_PEERS, C_PEERS),
            True,
            15,
            256,
        ),
        ("include_shadow", "compiler", '#include "/etc/shadow"', (C_INCLUDE_SHADOW,), False, 10, 256),
        (
            "include_host_file",
            "compiler",
            '#include "/etc/hostname" into an array',
            (C_INCLUDE_HOST,),
            False,
            10,
            256,
        ),
        (
            "include_dev_zero",
            "compiler",
            '#include "/dev/zero": a compiler that never ends',
            (C_INCLUDE_ZERO,),
            False,
            5,
            256,
        ),
    ]
    return specs


def _bash() -> list[Spec]:
    return [
        ("fork_bomb", "fork", "the classic :(){ :|:& };:", (BASH_FORK,), False, 3, 256),
        ("memory_bomb", "memory", "double a string to 2 GiB", (BASH_MEMORY,), False, 10, 256),
        (
            "disk_fill_work",
            "disk",
            "write 1 GiB into /work",
            (BASH_DISK.replace("{path}", "/work"),),
            False,
            10,
            256,
        ),
        (
            "disk_fill_tmp",
            "disk",
            "write 1 GiB into /tmp",
            (BASH_DISK.replace("{path}", "/tmp"),),
            False,
            10,
            256,
        ),
        (
            "files_for_next_run",
            "leftover",
            "leave a marker for the next run",
            (BASH_PLANT, BASH_FIND),
            False,
            5,
            256,
        ),
        (
            "flood_stdout",
            "output",
            "write 100 MiB to stdout",
            (BASH_FLOOD.format(redirect=""),),
            False,
            15,
            256,
        ),
        (
            "flood_stderr",
            "output",
            "write 100 MiB to stderr",
            (BASH_FLOOD.format(redirect=" >&2"),),
            False,
            15,
            256,
        ),
        ("enormous_line", "output", "one 100 MiB line", (BASH_LINE,), False, 15, 256),
        ("ignore_sigterm", "time", "trap '' TERM and loop", (BASH_IGNORE_TERM,), False, 2, 256),
        ("setsid_double_fork", "time", "setsid a looping shell", (BASH_DOUBLE_FORK,), False, 3, 256),
        (
            "net_tcp_outside",
            "network",
            "TCP via /dev/tcp",
            (BASH_NET.format(targets="1.1.1.1:443 8.8.8.8:53 172.17.0.1:22"),),
            False,
            15,
            256,
        ),
    ]


def _javascript() -> list[Spec]:
    return [
        ("memory_bomb", "memory", "allocate 2 GiB of buffers", (JS_MEMORY,), False, 10, 256),
        (
            "files_for_next_run",
            "leftover",
            "leave a marker for the next run",
            (JS_PLANT, JS_FIND),
            False,
            5,
            256,
        ),
        ("flood_stdout", "output", "write 100 MiB to stdout", (JS_FLOOD,), False, 15, 256),
        ("setsid_double_fork", "time", "a detached child outlives the run", (JS_DOUBLE_FORK,), False, 3, 256),
        ("net_tcp_outside", "network", "TCP to outside addresses", (JS_NET,), False, 15, 256),
    ]


_TABLES: dict[str, Callable[[], list[Spec]]] = {
    "python": _python,
    "c": _c,
    "bash": _bash,
    "javascript": _javascript,
}


def languages() -> list[str]:
    """The languages that have attacks."""
    return sorted(_TABLES)


def attacks_for(lang: str) -> list[Attack]:
    """Every attack for `lang`, [] for a language without any."""
    table = _TABLES.get(lang)
    if table is None:
        return []
    return [
        Attack(
            name=name,
            lang=lang,
            kind=kind,
            what=what,
            programs=programs,
            judge=JUDGES[kind](float(timeout)),
            together=together,
            timeout=float(timeout),
            memory_mb=memory_mb,
        )
        for name, kind, what, programs, together, timeout, memory_mb in table()
    ]
