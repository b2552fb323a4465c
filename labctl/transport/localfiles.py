"""This machine's files that SSH connections need (a host's `ssh_key` and `known_hosts`),
checked before any host is contacted.

A mistake in one of them is the user's input (exit 2): it is named once, with the file and what
is wrong with it, instead of surfacing per host as "cannot reach", "refused to log in" or "key not
pinned".
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from labctl.agent.core.textedit import text_lines
from labctl.documents.defaults import shown_path
from labctl.output.errors import InputError

if TYPE_CHECKING:
    from labctl.inventory.model import Host


def line_fields(line: str) -> list[str]:
    """A known_hosts line's fields as OpenSSH reads them: cut at spaces and tabs only (str.split()
    also cuts at U+00A0, U+2028 ..., which would make one odd field several good ones)."""
    return [f for f in re.split(r"[ \t]+", line) if f]


# What a problem says about a file (after its name), and the fix.
Problem = tuple[str, str]

# Key types paramiko can sign with; others (ssh-dss, FIDO sk-*) are refused by name.
USABLE_KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
)
PUBLIC_KEY_RE = re.compile(rb"\A\s*(ssh-|ecdsa-|sk-)[\w@.-]+ [A-Za-z0-9+/]+=*( [^\n]*)?\s*\Z")
OPENSSH_BEGIN = b"-----BEGIN OPENSSH PRIVATE KEY-----"
OPENSSH_MAGIC = b"openssh-key-v1\x00"


@dataclass
class ClientKey:
    """How to log in with `path`: the file itself, or through the ssh-agent that holds it when
    the file is protected by a passphrase (labctl never asks for one)."""

    path: Path
    via_agent: bool = False


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return str(os.geteuid())


def _read(path: Path, field: str, example: str, limit: int) -> bytes | Problem:
    """The bytes of a regular file of at most `limit` bytes, or what stops us reading them.
    `field` names the inventory key that points at it, `example` a good value for it."""
    shown = shown_path(path)
    fix = f"Fix {field} in the inventory (a relative path starts at the inventory's folder), e.g. {field}: {example}."
    try:
        st = path.stat()
    except FileNotFoundError:
        return "does not exist.", fix
    except NotADirectoryError:
        return "does not exist (a folder on its path is a file).", fix
    except OSError as e:
        return (
            f"cannot be reached by user {_user()}: {e.strerror}.",
            f"Give {_user()} access to the folders above it, or point {field} at a file it can read.",
        )
    if stat.S_ISDIR(st.st_mode):
        return (
            "is a directory, not a file.",
            f"Point {field} at a file inside it, e.g. {shown}/{Path(example).name}.",
        )
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a pipe, socket or device).", fix
    if st.st_size > limit:
        return f"is {st.st_size} bytes, far too big to be one.", fix
    try:
        return path.read_bytes()
    except OSError as e:
        return (
            f"cannot be read by user {_user()} (mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}): "
            f"{e.strerror}.",
            f"Let {_user()} read it (as its owner: `chmod 600 {shown}`, or `chown {_user()} {shown}`), "
            f"or point {field} at a file {_user()} can read.",
        )


def _openssh_public_blob(data: bytes) -> bytes | None:
    """The public key stored in clear in an OpenSSH-format private key, even an encrypted one."""
    import paramiko

    text = data.decode("ascii", "replace")
    if OPENSSH_BEGIN.decode() not in text:
        return None
    body = text.split(OPENSSH_BEGIN.decode(), 1)[1].split("-----END", 1)[0]
    try:
        raw = base64.b64decode("".join(body.split()))
    except (binascii.Error, ValueError):
        return None
    if not raw.startswith(OPENSSH_MAGIC):
        return None
    try:
        m = paramiko.Message(raw[len(OPENSSH_MAGIC) :])
        for _ in range(3):  # cipher, kdf, kdf options
            m.get_binary()
        if m.get_int() < 1:
            return None
        return m.get_binary()
    except Exception:
        return None


def _blob_type(blob: bytes) -> str:
    import paramiko

    try:
        return paramiko.Message(blob).get_text()
    except Exception:
        return ""


def _public_file_blob(path: Path) -> bytes | None:
    """The key in `path`.pub beside a private key, when there is one that parses."""
    try:
        fields = path.with_name(path.name + ".pub").read_text().split()
        return base64.b64decode(fields[1]) if len(fields) >= 2 else None
    except (OSError, UnicodeDecodeError, binascii.Error, ValueError):
        return None


def _agent_lacks(blob: bytes | None) -> str:
    """Why no ssh-agent can sign with the key whose public half is `blob` ('' when one can; with
    `blob` unknown, an agent holding any key is taken at its word)."""
    import paramiko

    sock = os.environ.get("SSH_AUTH_SOCK")
    if not sock:
        return "no ssh-agent is running (SSH_AUTH_SOCK is not set)"
    try:
        agent = paramiko.Agent()
        try:
            held = [k.asbytes() for k in agent.get_keys()]
        finally:
            agent.close()
    except Exception as e:
        return f"the ssh-agent at {sock} did not answer ({e or type(e).__name__})"
    if not held:
        return f"the ssh-agent at {sock} holds no key (or no longer runs)"
    if blob is None or blob in held:
        return ""
    return f"the ssh-agent at {sock} does not hold it"


def inspect_key(path: Path) -> ClientKey | Problem:
    """How to log in with the private key at `path`, or what is wrong with that file."""
    import paramiko

    shown = shown_path(path)
    data = _read(path, "ssh_key", "keys/id_ed25519", 1 << 20)
    if isinstance(data, tuple):
        return data
    if not data.strip():
        return (
            "is empty.",
            f"Point ssh_key at a private key, or make one: `ssh-keygen -t ed25519 -f {shown}`.",
        )
    if (
        PUBLIC_KEY_RE.match(data)
        or b"-----BEGIN SSH2 PUBLIC KEY-----" in data
        or b"-----BEGIN PUBLIC KEY-----" in data
    ):
        private = path.with_name(path.name[:-4]) if path.name.endswith(".pub") else None
        target = (
            f"the private key {shown_path(private)} beside it"
            if private is not None and private.is_file()
            else "the private key (the same name without .pub)"
        )
        return (
            "is a public key; logging in needs the private key of the pair.",
            f"Point ssh_key in the inventory at {target}.",
        )
    if data.startswith(b"PuTTY-User-Key-File"):
        return (
            "is a PuTTY key (.ppk), which labctl cannot read.",
            f"Convert it: `puttygen {shown} -O private-openssh -o {shown}.openssh`, and point ssh_key at the new file.",
        )
    blob = _openssh_public_blob(data)
    kind = "ssh-dss" if b"BEGIN DSA PRIVATE KEY" in data else _blob_type(blob) if blob else ""
    if kind and kind not in USABLE_KEY_TYPES:
        return (
            f"holds a key of type {kind}, which labctl cannot log in with (it uses ed25519, ECDSA or RSA keys).",
            f"Make an ed25519 key (`ssh-keygen -t ed25519 -f {shown}-ed25519`), add its .pub to the hosts' "
            "authorized_keys, and point ssh_key at it.",
        )
    reason = ""
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            cls.from_private_key_file(str(path))
            return ClientKey(path)
        except paramiko.PasswordRequiredException:
            why = _agent_lacks(blob or _public_file_blob(path))
            if not why:
                return ClientKey(path, via_agent=True)
            return (
                f"is protected by a passphrase and {why}; labctl never asks for a passphrase.",
                f'Load it into an agent and run labctl from that shell: `eval "$(ssh-agent)" && ssh-add {shown}` '
                "(or `ssh-add` alone where an agent runs); or point ssh_key at a key without a passphrase.",
            )
        except Exception as e:  # paramiko raises SSHException, ValueError or worse for a foreign format
            reason = reason or str(e) or type(e).__name__
    return (
        f"is not a private key labctl can read ({reason}); it reads OpenSSH and PEM ed25519, ECDSA and RSA keys.",
        f"Point ssh_key at your private key, or make one (`ssh-keygen -t ed25519 -f "
        f"{shown_path(path.parent / 'id_ed25519')}`) and add its .pub to the hosts' authorized_keys.",
    )


def known_hosts_problem(path: Path, *, writing: bool = False) -> Problem | None:
    """What is wrong with a known_hosts file for reading (a missing one pins nothing), and for
    `labctl trust` to write it when `writing`."""
    shown = shown_path(path)
    trouble = _folder_problem(path, writing)
    if trouble is not None or not os.path.lexists(path):
        return trouble
    data = _read(path, "known_hosts", "keys/known_hosts", 64 << 20)
    if isinstance(data, tuple):
        return data
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        return (
            f"is not a text file (line {line} is not UTF-8).",
            f"Point known_hosts at an OpenSSH known_hosts file, or move {shown} away and run `labctl trust`.",
        )
    # Lines as ssh reads them (cut at "\n" only), so line N is the one `sed -i 'Nd'` deletes.
    for n, raw in enumerate(text_lines(text), 1):
        bad = _bad_line(raw)
        if bad:
            return (
                f"line {n} is not 'HOSTS KEYTYPE BASE64' ({bad}): {raw.strip()[:60]!r}.",
                f"Fix or delete line {n} (`sed -i '{n}d' {shown}`), then pin that host again with "
                "`labctl trust HOST`.",
            )
    return None


def _bad_line(raw: str) -> str:
    """Why a known_hosts line is malformed, or '' for a good, blank, comment or foreign one."""
    import paramiko

    fields = line_fields(raw)
    if not fields or fields[0].startswith("#"):
        return ""
    if fields[0].startswith("@"):  # @cert-authority / @revoked: OpenSSH's, paramiko skips them
        fields = fields[1:]
    if len(fields) < 3:
        return f"{len(fields)} field{'s' if len(fields) != 1 else ''}"
    key_type, key = fields[1], fields[2]
    try:
        blob = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        return "the key is not base64"
    if key_type not in USABLE_KEY_TYPES:
        return ""  # a type this library does not know: OpenSSH may; it pins no host for us
    try:
        paramiko.PKey.from_type_string(key_type, blob)
    except Exception:
        return f"the {key_type} key does not parse"
    return ""


def _folder_problem(path: Path, writing: bool) -> Problem | None:
    """Why `path` can never exist (a file where a folder should be), or with `writing`, why
    `labctl trust` could not replace it (a new file beside it, renamed over it)."""
    folder = path.parent
    while not os.path.lexists(folder) and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return (
            f"cannot exist: {shown_path(folder)} is a file, not a folder.",
            "Point known_hosts at a path in a folder, e.g. known_hosts: keys/known_hosts.",
        )
    if writing and not os.access(folder, os.W_OK | os.X_OK):
        return (
            f"cannot be written by user {_user()}: its folder {shown_path(folder)} is not writable "
            "(its permissions, or a read-only file system).",
            f"Make {shown_path(folder)} writable for {_user()}, or point known_hosts at a writable place.",
        )
    return None


def local_file_error(field: str, path: Path, hosts: Iterable[str], problem: Problem) -> InputError:
    names = list(dict.fromkeys(hosts))
    who = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return InputError(f"{field} {shown_path(path)}{f' (for {who})' if who else ''} {problem[0]}", problem[1])


def check_local_files(hosts: Iterable[Host], *, writing_known_hosts: bool = False) -> None:
    """Every SSH host's ssh_key and known_hosts, each file once; one InputError naming them all."""
    users: dict[tuple[str, Path], list[str]] = {}
    for h in hosts:
        if h.connection != "ssh":
            continue
        for field, path in (("ssh_key", h.ssh_key), ("known_hosts", h.known_hosts)):
            if path is not None:
                users.setdefault((field, Path(path)), []).append(h.name)
    errors: list[InputError] = []
    for (field, path), names in users.items():
        if field == "ssh_key":
            found = inspect_key(path)
            problem = found if isinstance(found, tuple) else None
        else:
            problem = known_hosts_problem(path, writing=writing_known_hosts)
        if problem is not None:
            errors.append(local_file_error(field, path, names, problem))
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise InputError(" ".join(e.message for e in errors), " ".join(dict.fromkeys(e.hint for e in errors)))
