"""The attack programs in Python."""

from labctl.sandbox.programs import MARKER

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
