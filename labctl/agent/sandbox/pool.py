"""A warm pool of idle sandbox containers per config: claim one by renaming it, use it once,
kill it (dockerd removes it: AutoRemove) and start a fresh one in its place, in the background.

The pool lives in Docker, not in this process: idle containers carry the pool's labels and a
`labctl-sbx-LANG-` name, so the next agent call (another process) adopts them as they are.
A claimed container is recorded with the claiming agent's process; a container whose agent
died mid-run (killed, its SSH session gone) is killed by the next agent that opens a pool.

Every container carries its lab (`labctl.lab`, the inventory's lab name): labs whose sandbox
hosts share one dockerd never claim, count, reap or kill each other's containers. Containers
from before that label belong to no lab that can be told, so no lab touches them either: one
might be a lab's that still runs an older labctl, which would refill what another lab killed,
over and over. They are removed by hand once (README, `labctl sandbox`).
"""

from __future__ import annotations

import fcntl
import os
import threading
import uuid
from typing import Any, Dict, List, Optional, Tuple

from ..core import paths
from ..core.errors import AgentError
from . import LABEL_LAB
from .docker import Client, DockerError

RUN_PREFIX = "labctl-run-"
# Docker's rename re-reads the container's current name under its lock, so two claimers that
# both resolved an idle name would both succeed (the second renames the first's claim). A
# host-wide flock around choosing and renaming makes the claim one at a time across agents.
CLAIM_LOCK = paths.SANDBOX_RUN_DIR + "/claim.lock"


def _uid() -> str:
    return uuid.uuid4().hex[:12]


def _start_time(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot: with the pid, it names one process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def _me() -> str:
    return f"{os.getpid()} {_start_time(os.getpid())}"


def _alive(record: str) -> bool:
    pid, _, start = record.strip().partition(" ")
    try:
        return _start_time(int(pid)) == start
    except ValueError:
        return False


class _Flock:
    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1
        self.local = threading.Lock()

    def __enter__(self) -> "_Flock":
        self.local.acquire()
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError:
            self.fd = -1  # no /run/lock: the in-process lock still serialises this agent
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.local.release()


_CLAIM = _Flock(CLAIM_LOCK)


def _record_path(name: str) -> str:
    return os.path.join(paths.SANDBOX_RUN_DIR, name)


def _record(name: str) -> None:
    try:
        with open(_record_path(name), "w") as f:
            f.write(_me())
    except OSError:
        pass  # unrecorded: never reaped, as before records existed


def _forget(name: str) -> None:
    try:
        os.unlink(_record_path(name))
    except OSError:
        pass


def check_lab(lab: object) -> str:
    """The lab a pool belongs to: its containers are labelled with it and only it."""
    if not isinstance(lab, str) or not lab:
        raise AgentError(
            "lab is required: the inventory's lab name (sandbox containers are labelled with it)", "bad_args"
        )
    return lab


def _names(c: Dict[str, Any]) -> List[str]:
    return [n.lstrip("/") for n in c.get("Names") or []]


def _owner(c: Dict[str, Any]) -> Optional[str]:
    """The lab a listed container belongs to; None for one made before containers had a lab."""
    return (c.get("Labels") or {}).get(LABEL_LAB)


def reap_orphans(client: Client, lab: str) -> List[str]:
    """Kill this lab's claimed containers whose agent is gone (its run can never finish or be
    released); drop records whose container is gone. Another lab's containers and records, and
    those of no lab, are not this lab's to judge. Call under _CLAIM. The names killed."""
    running: Dict[str, Optional[str]] = {}  # a claimed container's name -> its lab
    for c in client.list(["labctl.sandbox=1"]):
        running.update((n, _owner(c)) for n in _names(c) if n.startswith(RUN_PREFIX))
    killed: List[str] = []
    try:
        names = [n for n in os.listdir(paths.SANDBOX_RUN_DIR) if n.startswith(RUN_PREFIX)]
    except OSError:
        return killed
    for name in names:
        if name in running and running[name] != lab:
            continue
        try:
            with open(_record_path(name)) as f:
                record = f.read()
        except OSError:
            continue
        if name in running and _alive(record):
            continue
        if name in running:
            client.kill(name)
            client.remove(name)
            killed.append(name)
        _forget(name)
    return killed


class Pool:
    def __init__(self, client: Client, lang: str, config: Dict[str, Any], size: int, lab: str) -> None:
        self.client = client
        self.lang = lang
        self.lab = check_lab(lab)
        # the controller's config names no lab: the same limits make the same pool in every lab
        self.config = dict(config, Labels=dict(config["Labels"], **{LABEL_LAB: lab}))
        self.size = max(0, size)
        self.pool_id = str(config["Labels"]["labctl.pool"])
        self.prefix = f"labctl-sbx-{lang}-"
        self.lock = threading.Lock()
        self.pending = 0  # fresh containers being created by this process
        self.idle: List[str] = []  # names this process believes idle, oldest first
        self.threads: List[threading.Thread] = []
        self.errors: List[str] = []
        self.reaped: List[str] = []

    def filters(self) -> List[str]:
        """The labels of this pool's containers: its config's, in this lab."""
        return [f"labctl.pool={self.pool_id}", f"labctl.lang={self.lang}", f"{LABEL_LAB}={self.lab}"]

    def _listed(self) -> List[str]:
        names: List[str] = []
        for c in self.client.list(self.filters()):
            # dockerd filtered on the labels already; checked again here because claiming
            # another lab's container is the one mistake this must never make
            if _owner(c) == self.lab:
                names.extend(n for n in _names(c) if n.startswith(self.prefix))
        return names

    def open(self) -> None:
        """Reap what this lab's dead agents left claimed, adopt this lab's idle containers Docker
        already holds, and top the pool up to `size`."""
        with _CLAIM:
            self.reaped = reap_orphans(self.client, self.lab)
            idle = self._listed()
        with self.lock:
            self.idle = idle
        self.refill()

    def claim(self) -> Tuple[str, bool]:
        """A container for one run, renamed labctl-run-*: (its name, whether it came warm).

        Names this process knows to be idle come first (no listing on the run's path); another
        agent may have taken one meanwhile, and then its rename fails and the next is tried."""
        with _CLAIM:
            for listed in (False, True):
                while True:
                    with self.lock:
                        if not self.idle:
                            break
                        name = self.idle.pop(0)
                    new = RUN_PREFIX + _uid()
                    _record(new)
                    if self.client.rename(name, new):
                        self.refill()
                        return new, True
                    _forget(new)
                if not listed:
                    fresh = self._listed()
                    with self.lock:
                        self.idle = fresh
        new = RUN_PREFIX + _uid()  # none idle: a cold one, as docker run would
        _record(new)
        try:
            self._create(new)
        except BaseException:
            _forget(new)
            raise
        self.refill()
        return new, False

    def _create(self, name: str) -> None:
        cid = self.client.create(self.config, name)
        try:
            self.client.start(cid)
        except DockerError:
            self.client.remove(cid)
            raise

    def refill(self) -> None:
        with self.lock:
            missing = self.size - len(self.idle) - self.pending
            if missing <= 0:
                return
            self.pending += missing
        for _ in range(missing):
            self._background(self._spawn)

    def _spawn(self) -> None:
        try:
            name = self.prefix + _uid()
            self._create(name)
            with self.lock:
                self.idle.append(name)
        except (DockerError, OSError) as e:
            with self.lock:
                self.errors.append(str(e))
        finally:
            with self.lock:
                self.pending -= 1

    def release(self, name: str) -> None:
        """Used once: kill it in the background (AutoRemove takes it away), never reuse it."""
        self._background(lambda: self._discard(name))

    def _discard(self, name: str) -> None:
        try:
            self.client.kill(name)
            self.client.remove(name)  # AutoRemove may already have; a stopped leftover goes too
            _forget(name)
        except (DockerError, OSError) as e:
            with self.lock:
                self.errors.append(str(e))

    def _background(self, fn: Any) -> None:
        t = threading.Thread(target=fn, daemon=True)
        with self.lock:
            self.threads = [x for x in self.threads if x.is_alive()]
            self.threads.append(t)
        t.start()

    def wait(self, timeout: Optional[float] = None) -> None:
        """Until every background kill and refill of this process is done."""
        while True:
            with self.lock:
                alive = [t for t in self.threads if t.is_alive()]
            if not alive:
                return
            for t in alive:
                t.join(timeout)
