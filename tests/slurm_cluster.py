"""A real one-node Slurm cluster for the tests: Debian's slurm-wlm and munge, on this machine.

`one_node_cluster()` writes a slurm.conf of its own into a temp folder (its own ports, state and
spool folders, so it never touches a cluster this machine may already run), starts munged when
none runs, then slurmctld and slurmd, waits until the node is idle, and yields the environment
that points sbatch, squeue, scontrol and scancel at it. On the way out it cancels its jobs and
stops only what it started.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGED = "/usr/sbin/munged"


def missing() -> str | None:
    """Why no cluster can start here (None when it can)."""
    for path in (SLURMCTLD, SLURMD, MUNGED):
        if not os.path.exists(path):
            return f"{path} is not installed (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "slurmd must run as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]
        return port


def _munge_works() -> bool:
    try:
        token = subprocess.run(["munge", "-n"], capture_output=True, timeout=10, check=True).stdout
        return subprocess.run(["unmunge"], input=token, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _start_munged() -> int | None:
    """Start munged if no working one answers; its pid when this started it."""
    if _munge_works():
        return None
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        subprocess.run(["mungekey", "--create"], check=True, timeout=30)
        shutil.chown(key, "munge", "munge")
    Path("/run/munge").mkdir(exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", MUNGED], check=True, timeout=30)
    deadline = time.monotonic() + 10
    while not _munge_works():
        assert time.monotonic() < deadline, "munged did not answer within 10 s"
        time.sleep(0.1)
    return int(Path("/run/munge/munged.pid").read_text())


def _stop(pid_file: Path) -> None:
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


@contextmanager
def one_node_cluster() -> Iterator[dict[str, str]]:
    """A running one-node cluster; yields the environment its clients need (SLURM_CONF)."""
    with cluster(1) as env:
        yield env


@contextmanager
def cluster(nodes: int) -> Iterator[dict[str, str]]:
    """A running cluster of `nodes` nodes on this machine; yields its clients' environment.

    One node is this host under its own name. Several are one slurmd each (`slurmd -N NAME`),
    named labctl-n1..., each with its own port, spool and pid files, all reached at 127.0.0.1
    (their NodeAddr, which the sbatch script's rendezvous goes by).
    """
    root = Path(tempfile.mkdtemp(prefix="labctl-slurm-"))
    host = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    mem_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8 / nodes)
    (root / "state").mkdir()
    if nodes == 1:
        names = [host]
        node_lines = f"NodeName={host} CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN"
    else:
        names = [f"labctl-n{i + 1}" for i in range(nodes)]
        node_lines = "\n".join(
            f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={_free_port()} CPUs={cpus} "
            f"RealMemory={mem_mb} State=UNKNOWN"
            for n in names
        )
    for n in names:
        (root / f"spool-{n}").mkdir()
    conf = root / "slurm.conf"
    conf.write_text(
        f"""\
ClusterName=labctltest
SlurmctldHost={host}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ReturnToService=2
MpiDefault=none
JobRequeue=1
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
{node_lines}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    munged = _start_munged()
    try:
        subprocess.run([SLURMCTLD, "-f", str(conf), "-c"], env=env, check=True, timeout=30)
        for n in names:
            subprocess.run([SLURMD, "-f", str(conf), "-c", "-N", n], env=env, check=True, timeout=30)
        deadline = time.monotonic() + 60
        while True:
            state = subprocess.run(
                ["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            if state == "idle":
                break
            assert time.monotonic() < deadline, (
                f"the node is {state!r}, not idle, after 60 s: {root}/slurmd.log"
            )
            time.sleep(0.2)
        yield env
    finally:
        subprocess.run(["scancel", "--full", "--user=root"], env=env, capture_output=True, timeout=30)
        for n in names:
            _stop(root / f"slurmd-{n}.pid")
        _stop(root / "slurmctld.pid")
        if munged:
            try:
                os.kill(munged, signal.SIGTERM)
            except ProcessLookupError:
                pass
        shutil.rmtree(root, ignore_errors=True)


def job_state(job_id: str, env: dict[str, str]) -> str:
    """The job's state as scontrol says it (PENDING, RUNNING, COMPLETED, ...)."""
    out = subprocess.run(
        ["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True, timeout=10
    ).stdout
    for word in out.split():
        if word.startswith("JobState="):
            return word.split("=", 1)[1]
    return "UNKNOWN"


def wait_for(job_id: str, env: dict[str, str], states: set[str], timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    while (state := job_state(job_id, env)) not in states:
        assert time.monotonic() < deadline, f"job {job_id} is {state}, not {states}, after {timeout} s"
        time.sleep(0.2)
    return state
