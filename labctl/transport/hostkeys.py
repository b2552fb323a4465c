"""Pinned host keys: OpenSSH-format known_hosts, SHA256 fingerprints, and `trust`.

Host keys are always checked. A host whose key is not pinned is refused with the key's
fingerprint and the command that pins it; a host whose key changed is refused louder.
"""

from __future__ import annotations

import base64
import hashlib
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from labctl.fsutil import write_atomic

if TYPE_CHECKING:
    import paramiko


def fingerprint(key: paramiko.PKey) -> str:
    """The fingerprint OpenSSH prints: SHA256:base64 without padding."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


def load_known_hosts(path: Path | None) -> paramiko.HostKeys:
    import paramiko

    keys = paramiko.HostKeys()
    if path is not None and path.is_file():
        keys.load(str(path))
    return keys


def pinned_keys(path: Path | None, address: str, port: int) -> dict[str, paramiko.PKey]:
    entry = load_known_hosts(path).lookup(known_hosts_name(address, port))
    return dict(entry) if entry else {}


def fetch_host_key(address: str, port: int, timeout: float = 10.0) -> paramiko.PKey:
    """The key a server offers, read from a bare handshake (no authentication)."""
    import paramiko

    from labctl.transport.base import Unreachable

    try:
        sock = socket.create_connection((address, port), timeout=timeout)
    except OSError as e:
        raise Unreachable(
            f"Cannot connect to {address}:{port}: {e.strerror or e}.",
            "Check the host is up and sshd listens there, or fix address/port in the inventory.",
        ) from None
    transport = paramiko.Transport(sock)
    transport.banner_timeout = timeout
    try:
        transport.start_client(timeout=timeout)
        return transport.get_remote_server_key()
    except (paramiko.SSHException, OSError, EOFError) as e:
        raise Unreachable(
            f"{address}:{port} did not complete an SSH handshake: {e}.",
            "Check that an SSH server (not another service) listens on that port.",
        ) from None
    finally:
        transport.close()


def pin_host_key(path: Path, address: str, port: int, key: paramiko.PKey) -> None:
    """Replace every key pinned for address:port with `key`, atomically, mode 0600."""
    name = known_hosts_name(address, port)
    kept: list[str] = []
    if path.is_file():
        for line in path.read_text().splitlines():
            fields = line.split()
            hosts = fields[0].split(",") if fields and not line.lstrip().startswith("#") else []
            if name in hosts:
                continue
            kept.append(line)
    kept.append(f"{name} {key.get_name()} {key.get_base64()}")
    write_atomic(path, "\n".join(kept) + "\n", mode=0o600)
