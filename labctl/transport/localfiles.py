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


class _Undecided(Exception):
    """The stdlib reading of an OpenSSH key cannot tell what paramiko would answer."""


@dataclass(frozen=True)
class OpenSSHKey:
    """What labctl needs of an OpenSSH-format private key, read with the stdlib alone.

    `public` is the public key stored in clear (even in an encrypted file), `kind` its type.
    `encrypted`: the file needs a passphrase (kdf bcrypt), which paramiko answers with
    PasswordRequiredException. Unencrypted, the private part was checked as far as paramiko checks
    it when it loads the key (so a key read here is one paramiko loads)."""

    public: bytes
    kind: str
    encrypted: bool


class _Reader:
    """SSH wire-format fields (RFC 4251) of `data`, strictly: a field past the end raises _Undecided
    (paramiko's Message pads a short read with zeros instead)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise _Undecided
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def uint32(self) -> int:
        return int.from_bytes(self.take(4), "big")

    def string(self) -> bytes:
        return self.take(self.uint32())

    def text(self) -> str:
        try:
            return self.string().decode("ascii")
        except UnicodeDecodeError:
            raise _Undecided from None

    def mpint(self) -> int:
        raw = self.string()
        if not raw or raw[0] & 0x80 or (raw[0] == 0 and len(raw) > 1 and not raw[1] & 0x80):
            raise _Undecided  # zero, negative or not minimal: leave such a file to paramiko
        return int.from_bytes(raw, "big")

    def end(self) -> None:
        if self.pos != len(self.data):
            raise _Undecided


# Ed25519 (RFC 8032) in integers, only to derive a public key from its seed as paramiko checks.
_ED_P = 2**255 - 19
_ED_D = -121665 * pow(121666, _ED_P - 2, _ED_P) % _ED_P
_ED_GX = 15112221349535400772501151409588531511454012693041857206046113283949847762202
_ED_GY = 46316835694926478169428394003475163141307993866256225615783033603165251855960
# The order of the NIST curves' base points: a private scalar lies in [1, order).
_NIST_ORDER = {
    "nistp256": 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551,
    "nistp384": int(
        "FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFC7634D81F4372DDF581A0DB248B0A77AECEC196ACCC52973", 16
    ),
    "nistp521": int(
        "01FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFA51868783"
        "BF2F966B7FCC0148F709A5D03BB5C9B8899C47AEBB6FB71E91386409",
        16,
    ),
}
_NIST_POINT_BYTES = {"nistp256": 65, "nistp384": 97, "nistp521": 133}


def _ed_add(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    p = _ED_P
    aa = (a[1] - a[0]) * (b[1] - b[0]) % p
    bb = (a[1] + a[0]) * (b[1] + b[0]) % p
    cc = 2 * a[3] * b[3] * _ED_D % p
    dd = 2 * a[2] * b[2] % p
    e, f, g, h = bb - aa, dd - cc, dd + cc, bb + aa
    return e * f % p, g * h % p, f * g % p, e * h % p


def _ed25519_public(seed: bytes) -> bytes:
    import hashlib

    h = hashlib.sha512(seed).digest()
    s = (int.from_bytes(h[:32], "little") & ((1 << 254) - 8)) | (1 << 254)
    point, q = (0, 1, 1, 0), (_ED_GX, _ED_GY, 1, _ED_GX * _ED_GY % _ED_P)
    while s:
        if s & 1:
            point = _ed_add(point, q)
        q = _ed_add(q, q)
        s >>= 1
    zinv = pow(point[2], _ED_P - 2, _ED_P)
    x, y = point[0] * zinv % _ED_P, point[1] * zinv % _ED_P
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


def _check_private(kind: str, public: _Reader, private: _Reader) -> None:
    """Raise _Undecided unless the private fields of a `kind` key are ones paramiko loads, and
    their copy of the public key is `public`'s."""
    if kind == "ssh-ed25519":
        pk = public.string()
        public.end()
        if private.string() != pk or len(pk) != 32:
            raise _Undecided
        sk = private.string()
        if len(sk) != 64 or sk[32:] != pk or _ed25519_public(sk[:32]) != pk:
            raise _Undecided
    elif kind == "ssh-rsa":
        e, n = public.mpint(), public.mpint()
        public.end()
        n2, e2, d, iqmp, p, q = (private.mpint() for _ in range(6))
        if (n2, e2) != (n, e) or not (3 <= e < n and e % 2 and n % 2 and p * q == n):
            raise _Undecided
        # What cryptography checks when paramiko loads the numbers, less the primality of p and q
        # (a few ms of pow each; a file that passes the rest is not corrupt by chance).
        if not (d < n and iqmp < p and iqmp * q % p == 1 and e * d % (p - 1) == 1 and e * d % (q - 1) == 1):
            raise _Undecided
    elif kind.startswith("ecdsa-sha2-"):
        curve, point = public.text(), public.string()
        public.end()
        order = _NIST_ORDER.get(curve)
        if order is None or kind != f"ecdsa-sha2-{curve}" or len(point) != _NIST_POINT_BYTES[curve]:
            raise _Undecided
        if private.text() != curve or private.string() != point or not 1 <= private.mpint() < order:
            raise _Undecided
    else:
        raise _Undecided


def read_openssh_key(data: bytes) -> OpenSSHKey | None:
    """The OpenSSH-format private key in `data` (see OpenSSH's PROTOCOL.key), read with the stdlib;
    None for another format, or a file this reading cannot decide on (truncated, corrupt, unusual):
    then paramiko is asked, and its answer stands. Only a whole, well-formed file is decided here."""
    end = b"-----END OPENSSH PRIVATE KEY-----"
    lines = data.split(b"\n")
    while lines and not lines[-1].strip():
        lines.pop()
    if len(lines) < 3 or lines[0].rstrip() != OPENSSH_BEGIN or lines[-1].rstrip() != end:
        return None
    try:
        raw = base64.b64decode(b"".join(line.strip() for line in lines[1:-1]), validate=True)
    except (binascii.Error, ValueError):
        return None
    if not raw.startswith(OPENSSH_MAGIC):
        return None
    try:
        r = _Reader(raw[len(OPENSSH_MAGIC) :])
        cipher, kdf, kdf_options = r.text(), r.text(), r.string()
        if r.uint32() != 1:
            raise _Undecided
        public = r.string()
        private = r.string()
        r.end()
        pub = _Reader(public)
        kind = pub.text()
        if not kind:
            raise _Undecided
        if kdf == "bcrypt":  # encrypted: paramiko asks for the passphrase before reading further
            return OpenSSHKey(public, kind, encrypted=True)
        if (cipher, kdf, kdf_options) != ("none", "none", b"") or kind not in USABLE_KEY_TYPES:
            if kind not in USABLE_KEY_TYPES:
                return OpenSSHKey(public, kind, encrypted=False)
            raise _Undecided
        # The private section: two equal check numbers, the key, its comment, then padding 1, 2, 3 ...
        # to a multiple of 8; none when the comment ends there in a printable character (as paramiko
        # reads it: it cuts padding by the last byte).
        if not private or len(private) % 8:
            raise _Undecided
        pad = 0 if 0x20 <= private[-1] < 0x7F else private[-1]
        if pad >= 8 or private[len(private) - pad :] != bytes(range(1, pad + 1)):
            raise _Undecided
        p = _Reader(private[: len(private) - pad])
        if p.uint32() != p.uint32() or p.text() != kind:
            raise _Undecided
        _check_private(kind, pub, p)
        p.string()  # comment
        p.end()
        return OpenSSHKey(public, kind, encrypted=False)
    except _Undecided:
        return None


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
    sock = os.environ.get("SSH_AUTH_SOCK")
    if not sock:
        return "no ssh-agent is running (SSH_AUTH_SOCK is not set)"
    import paramiko

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
    """How to log in with the private key at `path`, or what is wrong with that file.

    An OpenSSH-format key (what ssh-keygen writes) is read with the stdlib, sparing the import of
    paramiko (~90 ms) on every command; other formats, and files that reading cannot decide on, go
    to paramiko, with the same answers."""
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
    openssh = read_openssh_key(data)
    if openssh is not None:
        blob: bytes | None = openssh.public
        kind = openssh.kind
    else:
        blob = _openssh_public_blob(data)
        kind = "ssh-dss" if b"BEGIN DSA PRIVATE KEY" in data else _blob_type(blob) if blob else ""
    if kind and kind not in USABLE_KEY_TYPES:
        return (
            f"holds a key of type {kind}, which labctl cannot log in with (it uses ed25519, ECDSA or RSA keys).",
            f"Make an ed25519 key (`ssh-keygen -t ed25519 -f {shown}-ed25519`), add its .pub to the hosts' "
            "authorized_keys, and point ssh_key at it.",
        )
    if openssh is not None:
        return _needs_passphrase(path, blob) if openssh.encrypted else ClientKey(path)
    return _paramiko_load(path, blob)


def _needs_passphrase(path: Path, blob: bytes | None) -> ClientKey | Problem:
    """A key protected by a passphrase: usable through an ssh-agent that holds it."""
    why = _agent_lacks(blob or _public_file_blob(path))
    if not why:
        return ClientKey(path, via_agent=True)
    shown = shown_path(path)
    return (
        f"is protected by a passphrase and {why}; labctl never asks for a passphrase.",
        f'Load it into an agent and run labctl from that shell: `eval "$(ssh-agent)" && ssh-add {shown}` '
        "(or `ssh-add` alone where an agent runs); or point ssh_key at a key without a passphrase.",
    )


def _paramiko_load(path: Path, blob: bytes | None) -> ClientKey | Problem:
    """What paramiko makes of the key file at `path` (any format it reads)."""
    import paramiko

    reason = ""
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            cls.from_private_key_file(str(path))
            return ClientKey(path)
        except paramiko.PasswordRequiredException:
            return _needs_passphrase(path, blob)
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


def _ed25519_blob_ok(blob: bytes) -> bool:
    """Whether `blob` is exactly an ssh-ed25519 public key (type, then 32 bytes): one paramiko
    loads, decided without importing it (paramiko checks no more than the length)."""
    name = b"ssh-ed25519"
    head = len(name).to_bytes(4, "big") + name + (32).to_bytes(4, "big")
    return len(blob) == len(head) + 32 and blob.startswith(head)


def _bad_line(raw: str) -> str:
    """Why a known_hosts line is malformed, or '' for a good, blank, comment or foreign one."""
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
    if key_type == "ssh-ed25519" and _ed25519_blob_ok(blob):
        return ""
    import paramiko

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
