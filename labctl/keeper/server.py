"""The keeper process: holds one inventory's connections between commands.

`python -m labctl.keeper.server --inventory FILE --persist SECONDS` (what `client.spawn` starts,
detached). It takes the lock beside its socket (a second keeper for the same inventory leaves),
listens, and serves each client on a thread of its own. Requests (one per socket):

  open  {inventory, host, persist}            -> ok | error | unwilling
  run   {..., command, timeout, env, watchdog, grace, stream}
                                               -> line* then exit | error | unwilling
        the client may send {op: cancel}; its socket closing cancels too: the command's
        channel is closed, and the remote watchdog ends what it started (transport/wrap.py).
  agent {..., python, path, digest, argv, read_only, timeout, stream}
                                               -> line* then exit | error | unwilling
        an agent call, run by the agent kept on that connection (keeper/agents.py); unwilling
        when there is none to offer (the caller then runs it with `run`). Cancelled as `run`.
  put   {..., data (base64), path, mode, dir_mode} -> ok | error | unwilling
  list                                         -> list {connections: [...]}
  close {host: NAME | null}                    -> closed {hosts: [...]}
  stop                                         -> ok, then the keeper exits

A connection is opened with the same code a command uses (pool.open_connection: the pinned host
key, the inventory's key and user), kept under `wire.connection_key`, probed before each reuse
(`alive`), and dropped when idle for `persist` seconds. The keeper exits when it has served
nothing for `persist` seconds, when its inventory file is gone, when its socket is removed or
taken over, and when asked.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labctl.inventory.model import Host
from labctl.keeper import sock as ks
from labctl.keeper.agents import AgentSession, SessionUnavailable
from labctl.keeper.wire import connection_key, error_to_wire, host_from_wire
from labctl.transport.base import CommandResult, Connection

ConnectionFactory = Callable[[Host], Connection]
AGENT_RETRY = 60.0  # seconds before a kept agent that would not start is tried again


def _default_factory(host: Host) -> Connection:
    from labctl.transport.pool import open_connection

    return open_connection(host)


def alive(conn: Connection, timeout: float = 3.0) -> bool:
    """Whether a held connection still answers; a connection with no way to tell is taken as alive."""
    probe = getattr(conn, "alive", None)
    if probe is None:
        return True
    try:
        return bool(probe(timeout))
    except Exception:
        return False


@dataclass
class Entry:
    key: str
    host: Host
    conn: Connection | None = None
    since: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    served: int = 0
    in_use: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The agents kept running on this connection, by (python, path, digest, read_only); those
    # being started; and those that would not start, with when to try again (at once when the
    # agent at that path is put there again).
    agents: dict[tuple[str, str, str, bool], AgentSession] = field(default_factory=dict)
    starting: set[tuple[str, str, str, bool]] = field(default_factory=set)
    declined: dict[tuple[str, str, str, bool], float] = field(default_factory=dict)
    put_at: dict[str, float] = field(default_factory=dict)  # when a file was last put at a path
    agent_lock: threading.Lock = field(default_factory=threading.Lock)


class Keeper:
    def __init__(
        self,
        inventory: Path,
        persist: float,
        sock_path: Path,
        factory: ConnectionFactory = _default_factory,
        tick: float = 1.0,
        alive_timeout: float = 3.0,
    ) -> None:
        self.inventory = str(Path(inventory).absolute())
        self.persist = persist
        self.sock_path = sock_path
        self.factory = factory
        self.tick = tick
        self.alive_timeout = alive_timeout
        self.entries: dict[str, Entry] = {}
        self.guard = threading.Lock()
        self.busy = 0
        self.last_activity = time.monotonic()
        self.stopping = threading.Event()
        self.why_stopped = ""
        self._listener: socket.socket | None = None
        self._ino: int | None = None
        self._lock_fd: int | None = None

    # -- lifetime ---------------------------------------------------------------------------

    def bind(self) -> bool:
        """Take the lock and listen; False when another keeper holds this inventory."""
        folder = ks.ensure_dir(self.sock_path.parent)
        fd = os.open(ks.lock_path(self.sock_path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._lock_fd = fd
        try:
            os.unlink(self.sock_path)
        except FileNotFoundError:
            pass
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            s.bind(str(self.sock_path))
        finally:
            os.umask(old)
        s.listen(64)
        s.settimeout(self.tick)
        self._listener = s
        self._ino = os.stat(self.sock_path).st_ino
        del folder
        return True

    def serve(self) -> str:
        """Accept until told to stop or idle; returns why it stopped."""
        assert self._listener is not None
        house = threading.Thread(target=self._housekeeping, daemon=True, name="keeper-house")
        house.start()
        while not self.stopping.is_set():
            try:
                c, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self.stopping.is_set():
                    break
                raise
            threading.Thread(target=self._client, args=(c,), daemon=True, name="keeper-client").start()
        self._shutdown()
        return self.why_stopped

    def stop(self, why: str) -> None:
        if not self.stopping.is_set():
            self.why_stopped = why
            self.stopping.set()

    def _shutdown(self) -> None:
        if self._listener is not None:
            self._listener.close()
        try:
            if os.stat(self.sock_path).st_ino == self._ino:
                os.unlink(self.sock_path)
        except OSError:
            pass
        with self.guard:
            entries = list(self.entries.values())
            self.entries.clear()
        for e in entries:
            self._close_entry(e)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _housekeeping(self) -> None:
        while not self.stopping.wait(self.tick):
            if not os.path.exists(self.inventory):
                self.stop("inventory file removed")
                return
            try:
                if os.stat(self.sock_path).st_ino != self._ino:
                    self.stop("socket taken over")
                    return
            except OSError:
                self.stop("socket removed")
                return
            now = time.monotonic()
            idle: list[Entry] = []
            with self.guard:
                for k, e in list(self.entries.items()):
                    if e.in_use == 0 and now - e.last_used > self.persist:
                        idle.append(self.entries.pop(k))
                quiet = self.busy == 0 and now - self.last_activity > self.persist
            for e in idle:
                self._close_entry(e)
            if quiet:
                self.stop("idle")
                return

    # -- connections ------------------------------------------------------------------------

    @staticmethod
    def _close_entry(e: Entry) -> None:
        with e.agent_lock:
            sessions = list(e.agents.values())
            e.agents.clear()
            e.declined.clear()
        for session in sessions:
            session.close()
        conn, e.conn = e.conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def _acquire(self, host: Host, key: str) -> Entry:
        """The entry for `key`, connected and checked, its in_use raised (release with _release)."""
        with self.guard:
            e = self.entries.get(key)
            if e is None:
                e = self.entries[key] = Entry(key=key, host=host)
            e.in_use += 1
        try:
            with e.lock:
                if e.conn is not None and not alive(e.conn, self.alive_timeout):
                    self._close_entry(e)  # dead: dropped, and opened again just below
                if e.conn is None:
                    e.conn = self.factory(host)
                    e.since = time.time()
                    e.served = 0
        except BaseException:
            self._release(e)
            with self.guard:
                if e.conn is None and e.in_use == 0 and self.entries.get(key) is e:
                    del self.entries[key]
            raise
        return e

    def _release(self, e: Entry) -> None:
        with self.guard:
            e.in_use -= 1
            e.last_used = time.monotonic()

    # -- requests ---------------------------------------------------------------------------

    def _client(self, c: socket.socket) -> None:
        try:
            if ks.peer_uid(c) != os.geteuid():
                return  # another user: not a word
            c.settimeout(None)
            req = ks.recv_frame(c)
            if req is None:
                return
            with self.guard:
                self.busy += 1
                self.last_activity = time.monotonic()
            try:
                self._dispatch(c, req)
            finally:
                with self.guard:
                    self.busy -= 1
                    self.last_activity = time.monotonic()
        except (OSError, ConnectionError, ValueError):
            pass  # the client went away or spoke nonsense: nothing to answer
        finally:
            ks.close_quietly(c)

    def _dispatch(self, c: socket.socket, req: dict[str, Any]) -> None:
        op = req.get("op")
        if self.stopping.is_set():
            ks.send_frame(c, {"t": "unwilling", "reason": "the keeper is stopping"})
        elif req.get("v") != ks.PROTOCOL:
            # Another labctl version asks: it connects itself this time, and starts a keeper of
            # its own version next time (this one leaves for it; its connections close).
            ks.send_frame(c, {"t": "unwilling", "reason": f"a keeper of protocol {ks.PROTOCOL}"})
            self.stop("another labctl version")
        elif op == "list":
            ks.send_frame(
                c,
                {
                    "t": "list",
                    "connections": self.listing(),
                    "pid": os.getpid(),
                    "inventory": self.inventory,
                    "persist": self.persist,
                },
            )
        elif op == "close":
            ks.send_frame(c, {"t": "closed", "hosts": self.close(req.get("host"))})
        elif op == "stop":
            ks.send_frame(c, {"t": "ok"})
            self.stop("asked")
        elif op in ("open", "run", "put", "agent"):
            self._host_op(c, op, req)
        else:
            ks.send_frame(c, {"t": "unwilling", "reason": f"no request {op!r}"})

    def _host_op(self, c: socket.socket, op: str, req: dict[str, Any]) -> None:
        if self.stopping.is_set():
            ks.send_frame(c, {"t": "unwilling", "reason": "the keeper is stopping"})
            return
        if req.get("inventory") != self.inventory:
            ks.send_frame(c, {"t": "unwilling", "reason": "another inventory's keeper"})
            return
        try:
            wire_host = dict(req["host"])
            host = host_from_wire(wire_host)
        except (KeyError, TypeError, ValueError) as bad:
            ks.send_frame(c, {"t": "unwilling", "reason": f"bad host settings: {bad}"})
            return
        persist = req.get("persist")
        if isinstance(persist, (int, float)) and persist > 0:
            self.persist = float(persist)  # the inventory's value as the latest command read it
        agent = req.get("ssh_auth_sock")
        if isinstance(agent, str) and agent:
            os.environ["SSH_AUTH_SOCK"] = agent  # the agent of the command asking, for a new login
        key = connection_key(self.inventory, wire_host)
        cancel = threading.Event()
        if op in ("run", "agent"):
            # Watching from now: a client gone while its connection is opened runs nothing.
            threading.Thread(target=self._watch, args=(c, cancel), daemon=True, name="keeper-watch").start()
        try:
            e = self._acquire(host, key)
        except Exception as err:
            ks.send_frame(c, error_to_wire(err))
            return
        try:
            assert e.conn is not None
            if op != "open":
                # Counted before the answer goes out: a client that lists right after its
                # command's answer sees it counted.
                with self.guard:
                    e.served += 1
            if op == "open":
                ks.send_frame(c, {"t": "ok"})
            elif op == "put":
                try:
                    e.conn.put_bytes(
                        base64.b64decode(req["data"]),
                        str(req["path"]),
                        int(req["mode"]),
                        None if req.get("dir_mode") is None else int(req["dir_mode"]),
                    )
                except Exception as err:
                    ks.send_frame(c, error_to_wire(err))
                else:
                    ks.send_frame(c, {"t": "ok"})
                    with e.agent_lock:  # an agent put in place may start now
                        e.declined = {k: t for k, t in e.declined.items() if k[1] != str(req["path"])}
                        if str(req["path"]).endswith(".pyz"):
                            e.put_at[str(req["path"])] = time.monotonic()
            elif cancel.is_set():  # cancelled before it started: as SSHConnection answers that
                try:
                    ks.send_frame(
                        c,
                        {
                            "t": "exit",
                            "rc": None,
                            "stdout": "",
                            "stderr": "",
                            "seconds": 0.0,
                            "timed_out": False,
                            "cancelled": True,
                            "may_still_run": False,
                        },
                    )
                except OSError:
                    pass
            elif op == "agent":
                self._agent(c, e, req, cancel)
            else:
                self._run(c, e, req, cancel)
        finally:
            self._release(e)

    def _session(self, e: Entry, req: dict[str, Any]) -> AgentSession | None:
        """The agent kept on `e`'s connection for this call; None when there is none ready (the
        call then goes the direct way). A missing one is started in the background, so that no
        call waits on a start (a slow disk, a loaded host): the calls after it use it. None also
        where there can be none (not an SSH connection, a Windows host), and for AGENT_RETRY
        seconds after a start failed (no agent of that digest there yet)."""
        from labctl.agent.core.boot import boot_line
        from labctl.transport.ssh import SSHConnection

        key = (str(req["python"]), str(req["path"]), str(req["digest"]), bool(req.get("read_only")))
        conn = e.conn
        if not isinstance(conn, SSHConnection) or e.host.is_windows:
            return None
        with e.agent_lock:
            session = e.agents.get(key)
            if session is not None and session.usable():
                return session
            if session is not None:
                del e.agents[key]
                session.retire()  # gone already, or leaving once its calls are done
            if key in e.starting or time.monotonic() < e.declined.get(key, 0.0):
                return None
            e.declined.pop(key, None)
            e.starting.add(key)
        # The login's LC_CTYPE, before the host's Python changes it (agent/core/serve.py).
        line = 'LABCTL_LC_CTYPE="${LC_CTYPE+set:$LC_CTYPE}" ' + boot_line(
            key[0], key[1], key[2], ["--serve", key[2]], key[3]
        )
        threading.Thread(
            target=self._start_session,
            args=(e, key, AgentSession(conn, line)),
            daemon=True,
            name="keeper-agent-start",
        ).start()
        return None

    @staticmethod
    def _start_session(e: Entry, key: tuple[str, str, str, bool], session: AgentSession) -> None:
        began = time.monotonic()
        try:
            session.start()
        except SessionUnavailable:
            with e.agent_lock:
                e.starting.discard(key)
                # Not declined when the agent was put there while this start ran (it may have
                # looked before the upload): the next call tries again at once.
                if e.put_at.get(key[1], 0.0) < began:
                    e.declined[key] = time.monotonic() + AGENT_RETRY
            return
        with e.agent_lock:
            e.starting.discard(key)
            if e.conn is not session.conn:  # the connection was closed or replaced meanwhile
                session.close()
                return
            # One labctl's agent per connection: a newer one's replaces those before it (each
            # leaves once the calls it runs are done).
            for old in [k for k in e.agents if k[1] != key[1]]:
                e.agents.pop(old).retire()
            e.agents[key] = session

    def _agent(self, c: socket.socket, e: Entry, req: dict[str, Any], cancel: threading.Event) -> None:
        reply = _Reply(c, cancel)
        on_line = reply.line
        timeout = req.get("timeout")
        frame: dict[str, Any] = {"t": "unwilling", "reason": "no kept agent on this connection"}
        try:
            session = self._session(e, req)
            if session is not None:
                res = session.call(
                    [str(a) for a in req["argv"]],
                    read_only=bool(req.get("read_only")),
                    timeout=None if timeout is None else float(timeout),
                    on_line=on_line if req.get("stream") else None,
                    cancel=cancel,
                )
                frame = _exit_frame(res)
        except SessionUnavailable as gone:
            # Gone, or its files changed on disk (stale): this call goes the direct way, which
            # uploads the agent again where needed; the next call starts another.
            frame = {"t": "unwilling", "reason": str(gone)}
        except Exception as err:
            frame = error_to_wire(err)
        reply.last(frame)

    @staticmethod
    def _watch(c: socket.socket, cancel: threading.Event) -> None:
        """A cancel frame, the client's socket closing, or anything unreadable: stop the command."""
        try:
            while True:
                msg = ks.recv_frame(c)
                if msg is None or msg.get("op") == "cancel":
                    break
        except (OSError, ConnectionError, ValueError):
            pass
        cancel.set()

    def _kept_session(self, e: Entry) -> AgentSession | None:
        """An agent already kept on `e`'s connection (one that writes, if there is one), to run a
        shell command in; none is started for that."""
        with e.agent_lock:
            usable = [s for k, s in sorted(e.agents.items(), key=lambda kv: kv[0][3]) if s.usable()]
        return usable[0] if usable else None

    def _run(self, c: socket.socket, e: Entry, req: dict[str, Any], cancel: threading.Event) -> None:
        conn = e.conn
        assert conn is not None
        reply = _Reply(c, cancel)
        on_line = reply.line
        timeout = req.get("timeout")
        command, env, grace = str(req["command"]), req.get("env") or None, int(req.get("grace", 3))
        watchdog = bool(req.get("watchdog", True))
        # A command the watchdog would guard runs in the agent kept there, when there is one: no
        # new SSH session and no watchdog shells on the host for it. The same shell, stdin,
        # process group and ending (keeper/agents.py).
        session = self._kept_session(e) if watchdog and not e.host.is_windows else None
        try:
            res = None
            if session is not None:
                from labctl.transport.shell import env_assignments

                line = (
                    f"export {env_assignments(env, 'the command environment')}; {command}" if env else command
                )
                try:
                    res = session.shell(
                        line,
                        grace=grace,
                        timeout=None if timeout is None else float(timeout),
                        on_line=on_line if req.get("stream") else None,
                        cancel=cancel,
                    )
                except SessionUnavailable:
                    res = None  # gone before it started: run it the direct way
            if res is None:
                res = conn.run(
                    command,
                    timeout=None if timeout is None else float(timeout),
                    env=env,
                    on_line=on_line if req.get("stream") else None,
                    cancel=cancel,
                    watchdog=watchdog,
                    grace=grace,
                )
        except Exception as err:
            frame = error_to_wire(err)
        else:
            frame = _exit_frame(res)
        reply.last(frame)

    def listing(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        with self.guard:
            return [
                {
                    "host": e.host.name,
                    "address": e.host.address,
                    "port": e.host.port,
                    "user": e.host.user,
                    "since": e.since,
                    "idle": 0.0 if e.in_use else now - e.last_used,
                    "running": e.in_use,
                    "served": e.served,
                    # The agent kept running there (keeper/agents.py): its pid and calls served.
                    "agents": [
                        {"pid": a.pid, "calls": a.calls} for a in list(e.agents.values()) if a.usable()
                    ],
                }
                for e in self.entries.values()
                if e.conn is not None
            ]

    def close(self, name: str | None) -> list[str]:
        """Drop the idle connections to `name` (every host when None); a connection running a
        command is closed once it is done (its entry is taken out now)."""
        with self.guard:
            gone = [k for k, e in self.entries.items() if name is None or e.host.name == name]
            entries = [self.entries.pop(k) for k in gone]
        closed = []
        for e in entries:
            if e.conn is not None:
                closed.append(e.host.name)
            if e.in_use == 0:
                self._close_entry(e)
            else:
                threading.Thread(target=self._close_when_done, args=(e,), daemon=True).start()
        return sorted(set(closed))

    def _close_when_done(self, e: Entry) -> None:
        while e.in_use:
            time.sleep(0.1)
        self._close_entry(e)


class _Reply:
    """A command's answers to its client: output lines as they come (none once it is cancelled;
    a client that cannot be written to cancels it), then its last frame."""

    def __init__(self, c: socket.socket, cancel: threading.Event) -> None:
        self.c = c
        self.cancel = cancel
        self.lock = threading.Lock()

    def line(self, stream: str, line: str) -> None:
        if self.cancel.is_set():
            return
        try:
            with self.lock:
                ks.send_frame(self.c, {"t": "line", "s": stream, "l": line})
        except OSError:
            self.cancel.set()

    def last(self, frame: dict[str, Any]) -> None:
        try:
            with self.lock:
                ks.send_frame(self.c, frame)
        except OSError:
            pass


def _exit_frame(res: CommandResult) -> dict[str, Any]:
    return {
        "t": "exit",
        "rc": res.rc,
        "stdout": res.stdout,
        "stderr": res.stderr,
        "seconds": res.seconds,
        "timed_out": res.timed_out,
        "cancelled": res.cancelled,
        "may_still_run": res.may_still_run,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="labctl-keeper")
    p.add_argument("--inventory", required=True)
    p.add_argument("--persist", type=float, required=True)
    p.add_argument("--socket")
    a = p.parse_args(argv)
    inventory = Path(a.inventory).absolute()
    try:
        sock_path = Path(a.socket) if a.socket else ks.socket_path(inventory)
        keeper = Keeper(inventory, a.persist, sock_path)
        if not keeper.bind():
            return 0  # another keeper serves this inventory
    except ks.KeeperUnavailable as e:
        print(f"labctl keeper: {e}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: keeper.stop("terminated"))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C is for the command
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    keeper.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
