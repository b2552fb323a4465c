"""SSH connections through paramiko: one per host per run, strict host keys, classified errors."""

from __future__ import annotations

import io
import select
import shlex
import threading
import time
from typing import TYPE_CHECKING

from labctl.inventory.model import Host
from labctl.transport.base import (
    AuthFailed,
    CommandResult,
    HostKeyError,
    LineCallback,
    LineSplitter,
    TransportError,
    Unreachable,
)
from labctl.transport.hostkeys import fingerprint, known_hosts_name, load_known_hosts
from labctl.transport.wrap import wrap_with_watchdog

if TYPE_CHECKING:
    import paramiko


def _unknown_key_policy(host: Host) -> paramiko.MissingHostKeyPolicy:
    import paramiko

    class RefuseUnknown(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
            raise HostKeyError(
                f"{host.name} ({host.address}:{host.port}) offered host key {fingerprint(key)} ({key.get_name()}), "
                f"which is not pinned in {host.known_hosts or 'a known_hosts file'}; nothing was run there.",
                f"If that fingerprint is the host's (check with `ssh-keygen -lf /etc/ssh/ssh_host_{key.get_name().split('-')[-1]}_key.pub` "
                f"on its console), pin it with `labctl trust {host.name}`.",
                offered=fingerprint(key),
            )

    return RefuseUnknown()


class SSHConnection:
    def __init__(self, host: Host, connect_timeout: float | None = None) -> None:
        self.host = host
        self.name = host.name
        self.connect_timeout = connect_timeout or host.connect_timeout
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None

    def connect(self) -> None:
        import paramiko

        h = self.host
        client = paramiko.SSHClient()
        # Only the inventory's file is trusted: ~/.ssh/known_hosts is deliberately not read.
        client._host_keys = load_known_hosts(h.known_hosts)  # type: ignore[attr-defined]
        client.set_missing_host_key_policy(_unknown_key_policy(h))
        key = str(h.ssh_key) if h.ssh_key else None
        t = self.connect_timeout
        try:
            client.connect(
                h.address,
                port=h.port,
                username=h.user,
                key_filename=key,
                allow_agent=key is None,
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
            raise AuthFailed(
                f"{h.name} ({h.address}) refused to log in user '{h.user}' with "
                f"{'key ' + key if key else 'your ssh-agent/~/.ssh keys'}: {e}.",
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
            transport.set_keepalive(15)
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
    ) -> CommandResult:
        if env:
            exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            command = f"export {exports}; {command}"
        if watchdog and not self.host.is_windows:
            command = wrap_with_watchdog(command)
        start = time.monotonic()
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise Unreachable(f"The SSH connection to {self.name} dropped.", "Run the command again.")
        try:
            chan = transport.open_session(timeout=self.connect_timeout)
            chan.exec_command(command)
        except Exception as e:
            raise TransportError(
                f"{self.name}: could not start the command: {e}.", "Check the host's sshd log."
            ) from None
        out = LineSplitter("stdout", on_line)
        err = LineSplitter("stderr", on_line)
        timed_out = cancelled = False
        deadline = None if timeout is None else start + timeout
        exited_at: float | None = None
        try:
            while True:
                if chan.recv_ready():
                    out.feed(chan.recv(65536))
                    continue
                if chan.recv_stderr_ready():
                    err.feed(chan.recv_stderr(65536))
                    continue
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
        finally:
            # Closing the channel is what stops the remote command (see wrap.py).
            chan.close()
        return CommandResult(
            rc=rc,
            stdout=out.finish(),
            stderr=err.finish(),
            seconds=time.monotonic() - start,
            timed_out=timed_out,
            cancelled=cancelled,
        )

    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = self.client.open_sftp()
        return self._sftp

    def put_bytes(self, data: bytes, remote_path: str, mode: int = 0o644) -> None:
        """Write a file atomically: upload beside it, set the mode, rename over."""
        sftp = self.sftp()
        tmp = f"{remote_path}.labctl-tmp"
        sftp.putfo(io.BytesIO(data), tmp, confirm=False)
        sftp.chmod(tmp, mode)
        sftp.posix_rename(tmp, remote_path)

    def close(self) -> None:
        if self._sftp is not None:
            self._sftp.close()
            self._sftp = None
        if self._client is not None:
            self._client.close()
            self._client = None


def describe(host: Host) -> str:
    return f"{host.user}@{known_hosts_name(host.address, host.port)}"
