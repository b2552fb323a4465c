"""The agent kept running on a host for labctl's connection keeper (`agent --serve`).

Started once per kept connection (labctl/keeper/agents.py), over an SSH channel of its own: one
Python start-up and one set of imports then serve every agent call on that connection. Each call
forks a child of this warm process, which runs the command exactly as `agent COMMAND ARGS` would:
in a session of its own (what the remote watchdog gives a direct call), stdin /dev/null, stdout
and stderr to pipes read here. The parent imports a command's handler before its first fork, so
the next calls start with it loaded; the child's own state dies with it.

Frames both ways: a 4-byte big-endian length and that many bytes of UTF-8 JSON.
  in:  {"id": N, "argv": [COMMAND, ARGS], "ro": BOOL}   run a command (ro: write no bytecode)
       {"id": N, "sh": COMMAND, "grace": S}              run a shell command (`sh -c`), as the
                                                         remote watchdog runs one (transport/wrap.py)
       {"id": N, "cancel": true}                        TERM its process group, KILL after grace
       {"id": 0, "retire": true}                        take no new call (answer stale), and leave
                                                         once the running ones are done
  out: {"ready": PID}                                    once, first
       {"id": N, "s": "o" | "e", "d": BASE64}            output as it comes
       {"id": N, "rc": RC}                               it exited (128+SIG when killed, as sh says)
       {"id": N, "stale": true}                          not run: this agent's files are no longer
                                                         whole on disk (removed, damaged, a disk
                                                         mounted over them); it leaves once its
                                                         calls are done, and the keeper starts
                                                         another the way a direct call would
When stdin closes (the channel, the connection or the keeper is gone), every running command's
group is ended the same way and the server exits: a command never outlives the connection that
asked for it. Stdlib only, Python 3.8.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import selectors
import signal
import struct
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

GRACE = 3.0  # as transport/wrap.py's GRACE_SECONDS: TERM, then KILL what is left
MAX_FRAME = 64 * 1024 * 1024


class _Child:
    def __init__(self, cid: int, pid: int, pipes: Dict[int, str], grace: float = GRACE) -> None:
        self.cid = cid
        self.pid = pid
        self.grace = grace
        self.pipes = pipes  # fd -> "o" | "e"
        self.status: Optional[int] = None


def _rc(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        view = view[n:]


class Server:
    def __init__(self, rfd: int, wfd: int, agent: "Agent", digest: str, here: Optional[str] = None) -> None:
        self.rfd = rfd
        self.wfd = wfd
        self.agent = agent
        # What BOOT checked before it started us, checked again before each call: the zipapp
        # still whole (its sha256 still starts with `digest`) and the folder we import from
        # still extracted. A call's child imports from there what this process has not loaded.
        if here is None:
            from .launch import IMPORT_ROOT  # …/agent-x, or …/agent-x.pyz

            here = IMPORT_ROOT
        self.folder: Optional[str] = None if here.endswith(".pyz") else here
        self.pyz: str = here if self.folder is None else here + ".pyz"
        self.digest = digest
        self.checked: Optional[Tuple[int, int, int, int]] = None
        self.inbuf = b""
        self.children: Dict[int, _Child] = {}  # by call id
        self.by_fd: Dict[int, _Child] = {}
        self.kills: List[Tuple[float, int]] = []  # (when, process group) for SIGKILL
        self.closing = False
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)

    def send(self, frame: Dict[str, Any]) -> None:
        body = json.dumps(frame, separators=(",", ":")).encode()
        try:
            _write_all(self.wfd, struct.pack(">I", len(body)) + body)
        except OSError:
            self._stdin_closed()  # nobody reads us any more: the same as being told to go

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> int:
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        self.sel.register(self.rfd, selectors.EVENT_READ, "in")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.send({"ready": os.getpid()})
        while not (self.closing and not self.children and not self.kills):
            timeout = None
            if self.kills:
                # Woken often enough to notice a group gone before its grace is over.
                timeout = min(0.1, max(0.0, min(when for when, _ in self.kills) - time.monotonic()))
            for key, _ in self.sel.select(timeout):
                if key.data == "in":
                    self._read_requests()
                elif key.data == "wake":
                    self._drain_wake()
                else:
                    self._read_output(key.fd)
            self._reap()
            self._kill_due()
        return 0

    def _drain_wake(self) -> None:
        try:
            while os.read(self.wake_r, 512):
                pass
        except OSError:
            pass

    def _read_requests(self) -> None:
        try:
            data = os.read(self.rfd, 1 << 16)
        except OSError:
            data = b""
        if not data:
            self._stdin_closed()
            return
        self.inbuf += data
        while len(self.inbuf) >= 4:
            (n,) = struct.unpack(">I", self.inbuf[:4])
            if n > MAX_FRAME:
                self._stdin_closed()  # not our keeper speaking: stop as if it had gone
                return
            if len(self.inbuf) < 4 + n:
                return
            body, self.inbuf = self.inbuf[4 : 4 + n], self.inbuf[4 + n :]
            try:
                req = json.loads(body)
                cid = int(req["id"])
            except (ValueError, KeyError, TypeError):
                continue
            if req.get("retire"):
                self.closing = True
            elif req.get("cancel"):
                child = self.children.get(cid)
                if child is not None and child.status is None:
                    self._end_group(child.pid, child.grace)
            elif self.closing or self._stale():
                self.closing = True  # no new calls; leaves once the running ones are done
                self.send({"id": cid, "stale": True})
            elif isinstance(req.get("sh"), str):
                grace = req.get("grace")
                self._start(
                    cid, [], False, req["sh"], float(grace) if isinstance(grace, (int, float)) else GRACE
                )
            else:
                self._start(cid, [str(a) for a in req.get("argv") or []], bool(req.get("ro")))

    def _stale(self) -> bool:
        """Whether the agent's files are no longer what this process was started from."""
        try:
            st = os.stat(self.pyz)
            if self.folder is not None and not os.path.exists(os.path.join(self.folder, ".complete")):
                return True
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if key == self.checked:
                return False
            with open(self.pyz, "rb") as f:
                whole = hashlib.sha256(f.read()).hexdigest().startswith(self.digest)
        except OSError:
            return True
        self.checked = key if whole else None
        return not whole

    def _stdin_closed(self) -> None:
        if self.closing:
            return
        self.closing = True
        try:
            self.sel.unregister(self.rfd)
        except (KeyError, ValueError):
            pass
        for child in self.children.values():
            if child.status is None:
                self._end_group(child.pid, child.grace)

    def _end_group(self, pgid: int, grace: float) -> None:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except OSError:
            return
        self.kills.append((time.monotonic() + grace, pgid))

    def _kill_due(self) -> None:
        """KILL the groups whose grace is over; forget those already gone."""
        now = time.monotonic()
        left = []
        for when, pgid in self.kills:
            try:
                os.killpg(pgid, signal.SIGKILL if when <= now else 0)
            except OSError:
                continue
            if when > now:
                left.append((when, pgid))
        self.kills = left

    # -- one call -------------------------------------------------------------------------------

    def _start(
        self, cid: int, argv: List[str], read_only: bool, shell: Optional[str] = None, grace: float = GRACE
    ) -> None:
        if argv:
            try:
                # Imported here, in the parent, so that the next call's child has it already.
                self.agent.load(argv[0])
            except Exception:
                pass  # the child meets the same error and answers it
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            if shell is not None:
                _shell_child(shell, out_w, err_w)  # never returns
            _child(self.agent, argv, read_only, out_w, err_w)  # never returns
        os.close(out_w)
        os.close(err_w)
        child = _Child(cid, pid, {out_r: "o", err_r: "e"}, grace)
        self.children[cid] = child
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
            self.by_fd[fd] = child
            self.sel.register(fd, selectors.EVENT_READ, "out")

    def _read_output(self, fd: int) -> None:
        child = self.by_fd.get(fd)
        if child is None:
            return
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self.send({"id": child.cid, "s": child.pipes[fd], "d": base64.b64encode(data).decode()})
        else:
            self._close_pipe(fd)

    def _close_pipe(self, fd: int) -> None:
        child = self.by_fd.pop(fd, None)
        try:
            self.sel.unregister(fd)
        except (KeyError, ValueError):
            pass
        os.close(fd)
        if child is not None:
            child.pipes.pop(fd, None)

    def _reap(self) -> None:
        for child in list(self.children.values()):
            if child.status is None:
                try:
                    pid, status = os.waitpid(child.pid, os.WNOHANG)
                except ChildProcessError:
                    pid, status = child.pid, 255 << 8
                if pid == 0:
                    continue
                child.status = status
            # Everything the child wrote before it exited is in its pipes now; a process it left
            # behind that still holds them does not keep the answer back (as ssh.py: it stops
            # waiting once the command has exited).
            for fd in list(child.pipes):
                for _ in range(64):  # bounded: a process left behind may go on writing
                    if fd not in child.pipes or not self._readable(fd):
                        break
                    self._read_output(fd)
                if fd in child.pipes:
                    self._close_pipe(fd)
            del self.children[child.cid]
            self.send({"id": child.cid, "rc": _rc(child.status)})

    @staticmethod
    def _readable(fd: int) -> bool:
        import select

        return bool(select.select([fd], [], [], 0)[0])


def _become_call(out_w: int, err_w: int) -> None:
    """In the forked child: a session of its own, stdin /dev/null, stdout and stderr to the
    parent's pipes, nothing else of the server's open."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    _close_inherited()  # the channel, the other calls' pipes, the selector


# The login environment's LC_CTYPE, as the keeper's line passed it ("set:VALUE", or "" when it
# was unset): Python's start-up sets LC_CTYPE=C.UTF-8 where the locale is C (PEP 538), which a
# shell command started directly never has.
LC_CTYPE_VAR = "LABCTL_LC_CTYPE"
_login_lc_ctype: Optional[str] = None
_lc_ctype_known = False


def _note_login_locale() -> None:
    global _login_lc_ctype, _lc_ctype_known
    passed = os.environ.pop(LC_CTYPE_VAR, None)  # popped: no call's environment shows it
    if passed is not None:
        _lc_ctype_known = True
        _login_lc_ctype = passed[4:] if passed.startswith("set:") else None


def _shell_child(command: str, out_w: int, err_w: int) -> None:
    """In the forked child: `sh -c COMMAND`, as the remote watchdog starts a command."""
    try:
        _become_call(out_w, err_w)
        env = dict(os.environ)
        if _lc_ctype_known:
            env.pop("LC_CTYPE", None)
            if _login_lc_ctype is not None:
                env["LC_CTYPE"] = _login_lc_ctype
        # The signals as the watchdog's `setsid sh -c CMD &` has them: Python's ignored SIGPIPE
        # and SIGXFSZ back to the defaults (an ignored signal stays ignored across exec), and
        # SIGINT and SIGQUIT ignored, as sh leaves them for a command it starts in the background.
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        for sig in (signal.SIGINT, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_IGN)
        os.execve("/bin/sh", ["sh", "-c", command], env)
    except BaseException as e:
        try:
            os.write(2, f"labctl agent: cannot run /bin/sh: {e}\n".encode())
        except BaseException:
            pass
    os._exit(127)


def _child(agent: "Agent", argv: List[str], read_only: bool, out_w: int, err_w: int) -> None:
    """In the forked child: become the command, as a direct `agent COMMAND ARGS` call is."""
    rc = 1
    try:
        _become_call(out_w, err_w)
        if read_only:
            sys.dont_write_bytecode = True
        sys.argv = sys.argv[:1] + argv
        rc = agent.main(argv)
    except SystemExit as e:
        code = e.code
        rc = code if isinstance(code, int) else (0 if code is None else 1)
        if not isinstance(code, (int, type(None))):
            sys.stderr.write(str(code) + "\n")
    except BaseException:
        traceback.print_exc()
        rc = 1
    # What a normal interpreter exit does: wait for the command's own threads, run its atexit
    # handlers, flush; then leave without unwinding into the server's loop.
    try:
        for t in threading.enumerate():
            if t is not threading.current_thread() and not t.daemon:
                t.join()
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(rc & 0xFF)


def _close_inherited() -> None:
    """Close every descriptor above 2: those open are listed in /proc (closing up to a limit one
    by one costs a Python without close_range tens of thousands of calls)."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        os.closerange(3, 65536)
        return
    for fd in fds:
        if fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own descriptor, closed already


class Agent:
    """What a call runs, handed in by the agent's entry point (core imports no command table):
    `main(argv)` as `agent COMMAND ARGS` runs it, and `load(command)` imports its handler."""

    def __init__(self, main: Callable[[List[str]], int], load: Callable[[str], Any]) -> None:
        self.main = main
        self.load = load


def serve(agent: Agent, digest: str, here: Optional[str] = None) -> int:
    """Serve agent calls on stdin/stdout until stdin closes; `digest`: the zipapp's, as BOOT had
    it; `here`: the folder or zipapp the agent runs from (the tests'; else this file's)."""
    _note_login_locale()
    try:
        sys.stdout.flush()
        wfd = os.dup(1)
        # Frames go to the saved descriptor; anything else printed by mistake goes to stderr.
        os.dup2(2, 1)
    except OSError as e:
        sys.stderr.write("agent --serve: " + os.strerror(e.errno or errno.EIO) + "\n")
        return 1
    return Server(0, wfd, agent, digest, here).run()
