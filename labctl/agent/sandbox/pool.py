"""A warm pool of idle sandbox containers per config: claim one by renaming it, use it once,
kill it (dockerd removes it: AutoRemove) and start a fresh one in its place, in the background.

The pool lives in Docker, not in this process: idle containers carry the pool's labels and a
`labctl-sbx-LANG-` name, so the next agent call (another process) adopts them as they are.
"""

from __future__ import annotations

import fcntl
import os
import threading
import uuid
from typing import Any, Dict, List, Optional, Tuple

from .docker import Client, DockerError

# Docker's rename re-reads the container's current name under its lock, so two claimers that
# both resolved an idle name would both succeed (the second renames the first's claim). A
# host-wide flock around choosing and renaming makes the claim one at a time across agents;
# /run is where the Docker socket lives, so every agent on this dockerd shares it.
CLAIM_LOCK = "/run/lock/labctl-sandbox-claim.lock"


def _uid() -> str:
    return uuid.uuid4().hex[:12]


class _Flock:
    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1
        self.local = threading.Lock()

    def __enter__(self) -> "_Flock":
        self.local.acquire()
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
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


class Pool:
    def __init__(self, client: Client, lang: str, config: Dict[str, Any], size: int) -> None:
        self.client = client
        self.lang = lang
        self.config = config
        self.size = max(0, size)
        self.pool_id = str(config["Labels"]["labctl.pool"])
        self.prefix = f"labctl-sbx-{lang}-"
        self.lock = threading.Lock()
        self.pending = 0  # fresh containers being created by this process
        self.idle: List[str] = []  # names this process believes idle, oldest first
        self.threads: List[threading.Thread] = []
        self.errors: List[str] = []

    def _listed(self, same_pool: bool) -> List[str]:
        label = f"labctl.pool={self.pool_id}" if same_pool else "labctl.sandbox=1"
        names = []
        for c in self.client.list([label, f"labctl.lang={self.lang}"]):
            if not same_pool and (c.get("Labels") or {}).get("labctl.pool") == self.pool_id:
                continue
            for n in c.get("Names") or []:
                if n.lstrip("/").startswith(self.prefix):
                    names.append(n.lstrip("/"))
        return names

    def open(self) -> None:
        """Adopt the idle containers Docker already holds, drop idle ones made with other
        limits (a changed config: they would never be claimed again), top up to `size`."""
        with _CLAIM:
            for name in self._listed(same_pool=False):
                if self.client.rename(name, "labctl-run-" + _uid()):
                    self.release(name)
            idle = self._listed(same_pool=True)
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
                    new = "labctl-run-" + _uid()
                    if self.client.rename(name, new):
                        self.refill()
                        return new, True
                if not listed:
                    fresh = self._listed(same_pool=True)
                    with self.lock:
                        self.idle = fresh
        new = "labctl-run-" + _uid()  # none idle: a cold one, as docker run would
        self._create(new)
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
