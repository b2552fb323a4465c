"""What travels between a command and its keeper besides frames: a host's connection settings,
the key a kept connection is filed under, and errors with their class and hint."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from labctl.inventory.model import Host
from labctl.output import errors as output_errors
from labctl.transport import base

# What decides how a connection is opened and used. Any change in one of these (or in the
# inventory file named, or in the bytes of the key or known_hosts file) files the connection
# under another key: an old one is never reused for it.
KEY_FIELDS = (
    "name",
    "connection",
    "address",
    "port",
    "user",
    "ssh_key",
    "known_hosts",
    "os",
    "python",
    "connect_timeout",
)

ERRORS: dict[str, type[output_errors.LabctlError]] = {
    c.__name__: c
    for c in (
        output_errors.LabctlError,
        output_errors.InputError,
        output_errors.HostError,
        base.TransportError,
        base.Unreachable,
        base.AuthFailed,
        base.HostKeyError,
        base.ConnectionLost,
        base.CommandTimeout,
        base.Cancelled,
    )
}


def host_to_wire(host: Host) -> dict[str, Any]:
    """`host`'s connection settings, its file paths absolute (the keeper runs in another folder)."""
    out: dict[str, Any] = {}
    for f in KEY_FIELDS:
        v = getattr(host, f)
        if isinstance(v, Path):
            v = str(v.expanduser().absolute())
        out[f] = v
    return out


def host_from_wire(d: dict[str, Any]) -> Host:
    """The Host the keeper connects with; a value the inventory model refuses raises ValueError."""
    if set(d) != set(KEY_FIELDS):
        raise ValueError(f"host settings with keys {sorted(d)}")
    return Host.model_validate(d)


def _file_digest(path: str | None) -> str | None:
    if not path:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as e:
        return f"unreadable:{e.errno}"


def connection_key(inventory: str, host: dict[str, Any]) -> str:
    """The key a connection is kept under: the inventory's path, every field in KEY_FIELDS, and
    digests of the key and known_hosts files as they are now (a re-pinned host key or a
    replaced key file is a new connection). Held in memory only."""
    material = {
        "inventory": inventory,
        "host": {f: host.get(f) for f in KEY_FIELDS},
        "ssh_key": _file_digest(host.get("ssh_key")),
        "known_hosts": _file_digest(host.get("known_hosts")),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def error_to_wire(e: BaseException) -> dict[str, Any]:
    if isinstance(e, output_errors.LabctlError):
        cls = type(e)
        while cls.__name__ not in ERRORS or ERRORS[cls.__name__] is not cls:
            cls = cls.__mro__[1]
        return {
            "t": "error",
            "cls": cls.__name__,
            "message": e.message,
            "hint": e.hint,
            "offered": getattr(e, "offered", ""),
            "pinned": getattr(e, "pinned", ""),
        }
    return {"t": "error", "cls": "internal", "message": f"{type(e).__name__}: {e}", "hint": ""}


def error_from_wire(d: dict[str, Any], host: str) -> output_errors.LabctlError:
    cls = ERRORS.get(str(d.get("cls")))
    message, hint = str(d.get("message", "")), str(d.get("hint", ""))
    if cls is None:
        return base.TransportError(
            f"{host}: the connection keeper failed: {message}.",
            "Run the command again; `labctl connections close` ends the kept connections, and "
            "connections: {persist: 0} in the inventory's defaults turns keeping off.",
        )
    if cls is base.HostKeyError:
        return base.HostKeyError(
            message, hint, offered=str(d.get("offered", "")), pinned=str(d.get("pinned", ""))
        )
    return cls(message, hint)
