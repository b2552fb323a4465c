"""SSH connections through paramiko: one per host per run, strict host keys, classified errors."""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
import select
import threading
import time
from typing import TYPE_CHECKING

from labctl.inventory.model import Host
from labctl.transport.base import (
    AuthFailed,
    CommandResult,
    ConnectionLost,
    HostKeyError,
    LineCallback,
    LineSplitter,
    TransportError,
    Unreachable,
    file_error,
)
from labctl.transport.hostkeys import fingerprint, known_hosts_name, load_known_hosts
from labctl.transport.localfiles import inspect_key, local_file_error
from labctl.transport.shell import command_line, env_assignments
from labctl.transport.wrap import GRACE_SECONDS, wrap_with_watchdog

if TYPE_CHECKING:
    import paramiko

# A host that stops answering (its link down, its kernel hung) sends no RST: TCP alone would
# wait for minutes. Every connection probes a quiet host every KEEPALIVE_INTERVAL seconds and
# counts it gone after KEEPALIVE_COUNT_MAX probes without a word back; a system `ssh` that labctl
# starts gets the same limits as OpenSSH options (OPENSSH_KEEPALIVE).
KEEPALIVE_INTERVAL = 10
KEEPALIVE_COUNT_MAX = 3
DEAD_AFTER = KEEPALIVE_INTERVAL * KEEPALIVE_COUNT_MAX
OPENSSH_KEEPALIVE = (
    "-o",
    f"ServerAliveInterval={KEEPALIVE_INTERVAL}",
    "-o",
    f"ServerAliveCountMax={KEEPALIVE_COUNT_MAX}",
)

# Runs on the host with its python (3.8 or newer, as the agent): receives a file on stdin into
# a temporary name, reads it back, and renames it into place only when size and sha256 match.
# Answers one JSON object on stdout; rc 3: an OSError (errno name, reason, path), 4: a mismatch.
UPLOAD = r"""
import errno, hashlib, json, os, sys
dest, size, digest, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4], 8)
dir_mode = None if sys.argv[5] == "-" else int(sys.argv[5], 8)
folder = os.path.dirname(dest) or "."
tmp = os.path.join(folder, ".%s.%d.upload" % (os.path.basename(dest), os.getpid()))
def answer(rc, **kw):
    sys.stdout.write(json.dumps(kw))
    sys.stdout.flush()
    os._exit(rc)
try:
    if dir_mode is not None:
        if not os.path.isdir(folder):
            os.makedirs(folder, dir_mode)
        if os.stat(folder).st_mode & 0o7777 != dir_mode:
            os.chmod(folder, dir_mode)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            while True:
                block = sys.stdin.buffer.read(1 << 16)
                if not block:
                    break
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        h, n = hashlib.sha256(), 0
        with open(tmp, "rb") as f:
            for block in iter(lambda: f.read(1 << 16), b""):
                h.update(block)
                n += len(block)
        if n != size or h.hexdigest() != digest:
            os.unlink(tmp)
            answer(4, size=n, sha256=h.hexdigest())
        os.chmod(tmp, mode)
        os.rename(tmp, dest)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
except OSError as e:
    answer(3, errno=errno.errorcode.get(e.errno, str(e.errno)), error=e.strerror or str(e), path=e.filename or folder)
answer(0)
"""


def _quiet_paramiko() -> None:
    """Keep paramiko's own log lines and thread tracebacks off the terminal.

    Its transport thread logs a failed handshake (a port that answers but is not SSH) with a
    traceback; the connection's caller reports the same failure as one clean row.
    """
    log = logging.getLogger("paramiko")
    if not any(isinstance(h, logging.NullHandler) for h in log.handlers):
        log.addHandler(logging.NullHandler())
        log.propagate = False


class Heartbeat:
    """Notices a host that stopped answering, and closes its session so nothing waits on it.

    paramiko's own keepalive only sends, wants no reply, and only after a pause in what we
    write. Here a probe that asks for a reply (keepalive@openssh.com, as OpenSSH's
    ServerAliveInterval sends; servers answer "unknown request") goes out whenever the host has
    said nothing for `interval` seconds, and any packet from the host counts as an answer. After
    `dead_after` seconds of silence the transport is closed, which wakes every channel waiting
    on it, an upload stuck on a full socket included.
    """

    def __init__(self, transport: paramiko.Transport, interval: float, dead_after: float) -> None:
        self.transport = transport
        self.interval = interval
        self.dead_after = dead_after
        self.heard = time.monotonic()
        self.stopped_answering = False
        self._stop = threading.Event()
        self._sender: threading.Thread | None = None
        packetizer = transport.packetizer
        read_message = packetizer.read_message

        def read_and_note() -> tuple[int, paramiko.Message]:
            message = read_message()
            self.heard = time.monotonic()
            return message

        # The transport's reader thread calls this for every packet, the probes' answers included.
        packetizer.read_message = read_and_note  # type: ignore[method-assign]
        threading.Thread(target=self._watch, daemon=True, name="ssh-heartbeat").start()

    def _watch(self) -> None:
        last_probe = time.monotonic()
        while not self._stop.wait(1.0) and self.transport.is_active():
            now = time.monotonic()
            if now - self.heard > self.dead_after:
                self.stopped_answering = True
                self.transport.close()
                return
            if now - self.heard >= self.interval and now - last_probe >= self.interval:
                last_probe = now
                # Its own thread: a send can block behind a write stuck on a dead link, and this
                # thread must stay free to give up on the host.
                if self._sender is None or not self._sender.is_alive():
                    self._sender = threading.Thread(target=self._probe, daemon=True, name="ssh-keepalive")
                    self._sender.start()

    def _probe(self) -> None:
        import paramiko
        from paramiko.common import cMSG_GLOBAL_REQUEST

        m = paramiko.Message()
        m.add_byte(cMSG_GLOBAL_REQUEST)
        m.add_string("keepalive@openssh.com")
        m.add_boolean(True)  # want a reply: the reply is what proves the host is there
        try:
            self.transport._send_user_message(m)  # type: ignore[attr-defined]
        except Exception:
            pass  # the transport is going away; the watcher or the reader reports it

    def stop(self) -> None:
        self._stop.set()


def _unknown_key_policy(host: Host) -> paramiko.MissingHostKeyPolicy:
    import paramiko

    class RefuseUnknown(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
            where = host.known_hosts or "a known_hosts file (the inventory sets none for this host)"
            check = (
                f"if that fingerprint is the host's (check with `ssh-keygen -lf /etc/ssh/ssh_host_"
                f"{key.get_name().split('-')[-1]}_key.pub` on its console), pin it with `labctl trust {host.name}`."
            )
            raise HostKeyError(
                f"{host.name} ({host.address}:{host.port}) offered host key {fingerprint(key)} ({key.get_name()}), "
                f"which is not pinned in {where}; nothing was run there.",
                check[0].upper() + check[1:]
                if host.known_hosts
                else f"Add known_hosts: keys/known_hosts to the inventory's defaults; then, {check}",
                offered=fingerprint(key),
            )

    return RefuseUnknown()


class SSHConnection:
    def __init__(self, host: Host, connect_timeout: float | None = None) -> None:
        self.host = host
        self.name = host.name
        self.connect_timeout = connect_timeout or host.connect_timeout
        self._client: paramiko.SSHClient | None = None
        self._heartbeat: Heartbeat | None = None

    def connect(self) -> None:
        import paramiko

        _quiet_paramiko()
        h = self.host
        # This machine's files first: a bad one is the user's input, never "cannot reach".
        key = None
        if h.ssh_key is not None:
            found = inspect_key(h.ssh_key)
            if isinstance(found, tuple):
                raise local_file_error("ssh_key", h.ssh_key, [h.name], found)
            key = found
        host_keys = load_known_hosts(h.known_hosts, h.name)
        client = paramiko.SSHClient()
        # Only the inventory's file is trusted: ~/.ssh/known_hosts is deliberately not read.
        client._host_keys = host_keys  # type: ignore[attr-defined]
        client.set_missing_host_key_policy(_unknown_key_policy(h))
        # A key with a passphrase signs through the ssh-agent that holds it (inspect_key checked).
        key_file = str(key.path) if key is not None and not key.via_agent else None
        t = self.connect_timeout
        try:
            client.connect(
                h.address,
                port=h.port,
                username=h.user,
                key_filename=key_file,
                allow_agent=key is None or key.via_agent,
                look_for_keys=key is None,
                timeout=t,
                banner_timeout=t,
                auth_timeout=t,
                channel_timeout=t,
            )
        except HostKeyError:
            client.close()
            raise
        except paramiko.BadHostKeyException as e:
            client.close()
            raise HostKeyError(
                f"{h.name} ({h.address}:{h.port}) offered host key {fingerprint(e.key)}, but {h.known_hosts} pins "
                f"{fingerprint(e.expected_key)} for it. The host was reinstalled, or someone is in between; "
                "nothing was run there.",
                f"If you rebuilt {h.name} and its console shows the new fingerprint, run `labctl trust {h.name} --replace`.",
                offered=fingerprint(e.key),
                pinned=fingerprint(e.expected_key),
            ) from None
        except paramiko.AuthenticationException as e:
            client.close()
            used = (
                "your ssh-agent/~/.ssh keys"
                if key is None
                else f"key {key.path} (through the ssh-agent)"
                if key.via_agent
                else f"key {key.path}"
            )
            raise AuthFailed(
                f"{h.name} ({h.address}) refused to log in user '{h.user}' with {used}: {e}.",
                "Add the public key to that user's ~/.ssh/authorized_keys on the host, or fix user/ssh_key in the inventory.",
            ) from None
        except TimeoutError:
            client.close()
            raise Unreachable(
                f"{h.name} ({h.address}:{h.port}) did not answer within {t:g} s.",
                "Check that it is powered on and on the network, or raise connect_timeout in the inventory.",
            ) from None
        except (OSError, paramiko.SSHException, EOFError) as e:
            client.close()
            reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
            raise Unreachable(
                f"Cannot reach {h.name} at {h.address}:{h.port}: {reason}.",
                "Check that the host is up and sshd runs on that port (`labctl sim status` in the simulated lab), "
                "or fix address/port in the inventory.",
            ) from None
        transport = client.get_transport()
        if transport is not None:
            self._heartbeat = Heartbeat(transport, KEEPALIVE_INTERVAL, DEAD_AFTER)
        self._client = client

    @property
    def client(self) -> paramiko.SSHClient:
        if self._client is None:
            self.connect()
        assert self._client is not None
        return self._client

    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        on_line: LineCallback | None = None,
        cancel: threading.Event | None = None,
        watchdog: bool = True,
        grace: int = GRACE_SECONDS,
    ) -> CommandResult:
        if env:
            command = f"export {env_assignments(env, 'the command environment')}; {command}"
        if watchdog and not self.host.is_windows:
            command = wrap_with_watchdog(command, grace=grace)
        result = self._exec(command, timeout=timeout, on_line=on_line, cancel=cancel)
        # Win32-OpenSSH has no process groups to kill: closing the channel does not stop it there.
        result.may_still_run = (result.timed_out or result.cancelled) and self.host.is_windows
        return result

    def _exec(
        self,
        command: str,
        *,
        timeout: float | None = None,
        on_line: LineCallback | None = None,
        cancel: threading.Event | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        """One exec channel: `command` as given, `stdin` sent then closed (else left open)."""
        import paramiko

        start = time.monotonic()
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise self._lost("before the command started")
        try:
            chan = transport.open_session(timeout=self.connect_timeout)
            chan.exec_command(command)
        except Exception as e:
            if not transport.is_active():
                raise self._lost("before the command started") from None
            raise TransportError(
                f"{self.name}: could not start the command: {e}.", "Check the host's sshd log."
            ) from None
        out = LineSplitter("stdout", on_line)
        err = LineSplitter("stderr", on_line)
        timed_out = cancelled = False
        deadline = None if timeout is None else start + timeout
        exited_at: float | None = None
        try:
            if stdin is not None:
                try:
                    chan.settimeout(timeout)  # a host that never reads must not hold us past the deadline
                    chan.sendall(stdin)
                    chan.shutdown_write()
                except OSError:
                    pass  # the command ended before reading it all: its answer says why
            while True:
                if chan.recv_ready():
                    out.feed(chan.recv(65536))
                    continue
                if chan.recv_stderr_ready():
                    err.feed(chan.recv_stderr(65536))
                    continue
                if chan.closed:
                    break  # drained, and nothing more can come
                now = time.monotonic()
                if chan.exit_status_ready():
                    # A background child left holding stdout would keep EOF away for ever.
                    exited_at = exited_at or now
                    if chan.eof_received or now - exited_at > 1.0:
                        break
                if cancel is not None and cancel.is_set():
                    cancelled = True
                    break
                if deadline is not None and now > deadline:
                    timed_out = True
                    break
                if chan.eof_received:
                    chan.status_event.wait(0.1)
                else:
                    select.select([chan], [], [], 0.1)
            rc = None if (timed_out or cancelled) else chan.recv_exit_status()
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise self._lost("while a command ran there", f" ({type(e).__name__}: {e})") from None
        finally:
            # Closing the channel is what stops the remote command (see wrap.py).
            chan.close()
        if rc == -1 and not transport.is_active():
            # No exit status, and the session is gone: the command's fate is unknown.
            raise self._lost("while a command ran there", "; it may not have finished")
        return CommandResult(
            rc=rc,
            stdout=out.finish(),
            stderr=err.finish(),
            seconds=time.monotonic() - start,
            timed_out=timed_out,
            cancelled=cancelled,
        )

    def _lost(self, when: str, why: str = "") -> ConnectionLost:
        """The session went away `when`; `why` is what the transport said (unless the host simply
        stopped answering, which says all)."""
        h = self.host
        if self._heartbeat is not None and self._heartbeat.stopped_answering:
            return ConnectionLost(
                f"{h.name} ({h.address}:{h.port}) stopped answering for {self._heartbeat.dead_after:g} s "
                f"(link down or host hung) {when}; labctl stopped waiting for it.",
                f"Check {h.name}'s network link and console (`ping {h.address}`); once it answers, run the "
                "command again (what it was running there may or may not have finished).",
            )
        return ConnectionLost(
            f"connection to {h.name} ({h.address}:{h.port}) lost {when}{why}.",
            "Check that the host is up and on the network (a reboot, a dropped link, sshd restarted), "
            "then run the command again.",
        )

    def alive(self, timeout: float = 3.0, fresh: float = 1.0) -> bool:
        """Whether the host still answers on this session: heard from within `fresh` seconds,
        or answers a keepalive probe within `timeout` (what the keeper asks before it reuses a
        connection it has held)."""
        transport = self._client.get_transport() if self._client is not None else None
        hb = self._heartbeat
        if transport is None or not transport.is_active() or hb is None or hb.stopped_answering:
            return False
        if time.monotonic() - hb.heard <= fresh:
            return True
        asked = time.monotonic()
        hb._probe()
        deadline = asked + timeout
        while time.monotonic() < deadline:
            if hb.heard >= asked:
                return True
            if not transport.is_active():
                return False
            time.sleep(0.01)
        return False

    def put_bytes(
        self, data: bytes, remote_path: str, mode: int = 0o644, dir_mode: int | None = None
    ) -> None:
        """Write a file whole or not at all, over the exec channel (hosts need no SFTP subsystem).

        The host's python receives the bytes into a temporary name beside the file, reads them
        back, and renames them into place only when their size and sha256 match: one round trip,
        and a failure names its cause (disk full, read-only) instead of leaving half a file.
        """
        digest = hashlib.sha256(data).hexdigest()
        argv = [
            remote_path,
            str(len(data)),
            digest,
            f"{mode:o}",
            "-" if dir_mode is None else f"{dir_mode:o}",
        ]
        line = f"exec {command_line([self.host.python, '-c', UPLOAD, *argv])}"
        res = self._exec(line, timeout=max(60.0, len(data) / 1e6), stdin=data)
        if res.rc == 0:
            return
        folder = posixpath.dirname(remote_path) or "."
        try:
            answer = json.loads(res.stdout)
        except ValueError:
            answer = None
        if res.rc == 3 and isinstance(answer, dict):
            raise file_error(
                self.name,
                str(answer.get("path") or folder),
                str(answer.get("errno")),
                str(answer.get("error")),
            )
        if res.rc == 4 and isinstance(answer, dict):
            raise TransportError(
                f"{self.name}: {remote_path} arrived with {answer.get('size')} of {len(data)} bytes "
                "(or a different sha256); it was not put in place.",
                "Run the command again; if it happens again, check the host's disk and memory.",
            )
        if res.rc == 127:
            raise TransportError(
                f"{self.name}: no Python at {self.host.python} to receive {remote_path} "
                f"({(res.stderr or res.stdout).strip()[-200:]}).",
                "Install python3 on the host or set `python:` for it in the inventory.",
            )
        raise TransportError(
            f"{self.name}: could not write {remote_path} (rc {res.rc}): {(res.stderr or res.stdout).strip()[-400:]}",
            "Check that folder on the host, then run the command again.",
        )

    def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self._client is not None:
            self._client.close()
            self._client = None


def describe(host: Host) -> str:
    return f"{host.user}@{known_hosts_name(host.address, host.port)}"
