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

from labctl.agent.core.fsutil import write_atomic
from labctl.agent.core.textedit import body, newline_of, split_lines, text_lines
from labctl.transport.localfiles import known_hosts_problem, line_fields, local_file_error

if TYPE_CHECKING:
    import paramiko


def fingerprint(key: paramiko.PKey) -> str:
    """The fingerprint OpenSSH prints: SHA256:base64 without padding."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


def load_known_hosts(path: Path | None, host: str = "") -> paramiko.HostKeys:
    """The keys pinned in `path` (none when it does not exist yet); a file that is not a
    known_hosts file is an InputError naming it, never "not pinned" blamed on a host."""
    import paramiko

    keys = paramiko.HostKeys()
    if path is None:
        return keys
    problem = known_hosts_problem(path)
    if problem is not None:
        raise local_file_error("known_hosts", path, [host] if host else [], problem)
    if not path.exists():
        return keys
    # Not keys.load(): it splits on single spaces, so a line aligned with two would pin nothing.
    for line in text_lines(path.read_bytes().decode("utf-8", "surrogateescape")):
        fields = line_fields(line)
        if len(fields) < 3 or fields[0].startswith(("#", "@")):
            continue  # blank, a comment, or an OpenSSH marker paramiko has no use for
        entry = paramiko.hostkeys.HostKeyEntry.from_line(" ".join(fields[:3]))
        if entry is not None and entry.key is not None:
            for name in entry.hostnames:
                keys.add(name, entry.key.get_name(), entry.key)
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
    problem = known_hosts_problem(path, writing=True)
    if problem is not None:
        raise local_file_error("known_hosts", path, [], problem)
    name = known_hosts_name(address, port)
    try:
        # Bytes cut at b"\n" only, as ssh reads the file: a comment holding U+2028 or a lone
        # \r stays one comment, and every line but the pinned host's keeps its bytes.
        data = path.read_bytes() if path.exists() else b""
        kept = b"".join(_without_host(piece, name) for piece in split_lines(data))
        newline = newline_of(data)
        if kept and not kept.endswith(b"\n"):
            kept += newline
        kept += f"{name} {key.get_name()} {key.get_base64()}".encode() + newline
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(str(path), kept, mode=0o600)
    except OSError as e:
        raise local_file_error(
            "known_hosts",
            path,
            [],
            (
                f"could not be written: {e.strerror}.",
                "Make its folder writable, then run `labctl trust` again.",
            ),
        ) from None


def _without_host(piece: bytes, name: str) -> bytes:
    """One known_hosts line with `name`'s pin taken out: gone when it pins only `name`, its
    other hosts kept (their pins are not this host's to drop). Comments and @markers stay."""
    line = body(piece).decode("utf-8", "surrogateescape")
    fields = line_fields(line)
    if not fields or fields[0].startswith(("#", "@")):
        return piece
    hosts = fields[0].split(",")
    if name not in hosts:
        return piece
    others = [h for h in hosts if h != name]
    if not others:
        return b""
    start = line.index(fields[0])
    line = line[:start] + ",".join(others) + line[start + len(fields[0]) :]
    return line.encode("utf-8", "surrogateescape") + piece[len(body(piece)) :]
