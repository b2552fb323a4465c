"""This machine's files a connection needs (ssh_key, known_hosts): a bad one is the user's input
(exit 2), named once with what is wrong, before any host is contacted.

The hosts here are 127.0.0.1 ports where nothing listens: a run that reaches the network says
"unreachable" (exit 1), which is exactly what a bad local file must not turn into.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from labctl.inventory.load import load_inventory
from labctl.output.errors import InputError
from labctl.transport.hostkeys import known_hosts_name, load_known_hosts, pin_host_key
from labctl.transport.localfiles import _bad_line, check_local_files, inspect_key, known_hosts_problem
from tests.conftest import REPO

GOOD_KH_LINE = (
    "[127.0.0.1]:9 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
)


def keygen(path: Path, *args: str) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-N", "", "-f", str(path), *args], check=True, capture_output=True)
    return path


def inventory(
    tmp_path: Path, ssh_key: str = "keys/id_ed25519", known_hosts: str = "keys/known_hosts"
) -> Path:
    keys = tmp_path / "keys"
    keys.mkdir(exist_ok=True)
    if not (keys / "id_ed25519").exists():
        keygen(keys / "id_ed25519", "-t", "ed25519")
    inv = tmp_path / "lab.yaml"
    inv.write_text(
        "lab: t\n"
        f"defaults: {{user: root, ssh_key: {json.dumps(ssh_key)}, known_hosts: {json.dumps(known_hosts)}}}\n"
        "hosts:\n"
        "  alpha: {address: 127.0.0.1, port: 9}\n"
        "  beta: {address: 127.0.0.1, port: 19}\n"
    )
    return inv


def no_agent() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}


def run(inv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", "-i", str(inv), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=no_agent(),
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def _pub(t: Path) -> str:
    keygen(t / "keys" / "id_ed25519", "-t", "ed25519")
    return "keys/id_ed25519.pub"


def _directory(t: Path) -> str:
    (t / "keys" / "somedir").mkdir()
    return "keys/somedir"


def _encrypted(t: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret-pass", "-f", str(t / "keys" / "enc")], check=True
    )
    return "keys/enc"


def _not_a_key(t: Path) -> str:
    (t / "keys" / "notes.txt").write_text("just some notes\n")
    return "keys/notes.txt"


def _empty(t: Path) -> str:
    (t / "keys" / "empty").write_text("")
    return "keys/empty"


def _putty(t: Path) -> str:
    (t / "keys" / "id.ppk").write_text("PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\n")
    return "keys/id.ppk"


def _fifo(t: Path) -> str:
    os.mkfifo(t / "keys" / "pipe")  # opening it would block for ever
    return "keys/pipe"


KEY_CASES: dict[str, tuple[Callable[[Path], str], list[str]]] = {
    "public half": (_pub, ["is a public key", "keys/id_ed25519 beside it"]),
    "directory": (_directory, ["is a directory"]),
    "encrypted, no agent": (_encrypted, ["passphrase", "no ssh-agent is running", "ssh-add"]),
    "not a key": (_not_a_key, ["is not a private key labctl can read"]),
    "empty": (_empty, ["is empty"]),
    "putty": (_putty, ["PuTTY", "puttygen"]),
    "fifo": (_fifo, ["is not a regular file"]),
}


def local_file_error(inv: Path) -> str:
    """What the check before any connection says about the inventory's hosts' files."""
    hosts = load_inventory(inv).hosts.values()
    with pytest.raises(InputError) as e:
        check_local_files(hosts)
    return " ".join(e.value.paragraph().split())


@pytest.mark.parametrize("case", list(KEY_CASES))
def test_bad_ssh_key_is_named_once_for_all_its_hosts(
    tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    (tmp_path / "keys").mkdir()
    make, words = KEY_CASES[case]
    err = local_file_error(inventory(tmp_path, ssh_key=make(tmp_path)))
    assert err.count("(for alpha, beta)") == 1 and err.startswith("ssh_key "), err
    for w in words:
        assert w in err, err


@pytest.mark.parametrize("case", ["public half", "encrypted, no agent"])
def test_bad_ssh_key_exits_2_before_any_connection(tmp_path: Path, case: str) -> None:
    (tmp_path / "keys").mkdir()
    make, words = KEY_CASES[case]
    proc = run(inventory(tmp_path, ssh_key=make(tmp_path)), "exec", "--", "true")
    assert proc.returncode == 2, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "unreachable" not in err and "Cannot reach" not in err and "refused to log in" not in err
    assert err.count("(for alpha, beta)") == 1 and words[0] in err, err


def test_bad_ssh_key_in_json_mode_is_one_error_document(tmp_path: Path) -> None:
    inv = inventory(tmp_path, ssh_key="keys/id_ed25519.pub")
    proc = run(inv, "--json", "exec", "--", "true")
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    assert "is a public key" in json.dumps(doc), doc


def _kh_directory(t: Path) -> str:
    (t / "keys" / "kh").mkdir(parents=True)
    return "keys/kh"


def _kh_bad_base64(t: Path) -> str:
    (t / "keys" / "known_hosts").write_text(
        f"# pinned\n{GOOD_KH_LINE}\n[127.0.0.1]:19 ssh-ed25519 AAAA!!notbase64\n"
    )
    return "keys/known_hosts"


def _kh_two_fields(t: Path) -> str:
    (t / "keys" / "known_hosts").write_text(f"{GOOD_KH_LINE}\n[127.0.0.1]:19 ssh-ed25519\n")
    return "keys/known_hosts"


def _kh_binary(t: Path) -> str:
    (t / "keys" / "known_hosts").write_bytes(b"\x00\xff\xfe garbage\n")
    return "keys/known_hosts"


def _kh_under_a_file(t: Path) -> str:
    (t / "keys" / "plainfile").write_text("x")
    return "keys/plainfile/known_hosts"


def _kh_bad_key_blob(t: Path) -> str:
    blob = base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x03abc").decode()
    (t / "keys" / "known_hosts").write_text(f"[127.0.0.1]:19 ssh-ed25519 {blob}\n")
    return "keys/known_hosts"


KH_CASES: dict[str, tuple[Callable[[Path], str], list[str]]] = {
    "directory": (_kh_directory, ["keys/kh", "is a directory"]),
    "bad base64": (_kh_bad_base64, ["line 3", "not base64", "sed -i '3d'"]),
    "two fields": (_kh_two_fields, ["line 2", "2 fields"]),
    "binary": (_kh_binary, ["not a text file"]),
    "under a file": (_kh_under_a_file, ["keys/plainfile is a file"]),
    "key does not parse": (_kh_bad_key_blob, ["line 1", "does not parse"]),
}


@pytest.mark.parametrize("case", list(KH_CASES))
def test_bad_known_hosts_is_named_once_for_all_its_hosts(tmp_path: Path, case: str) -> None:
    (tmp_path / "keys").mkdir()
    make, words = KH_CASES[case]
    err = local_file_error(inventory(tmp_path, known_hosts=make(tmp_path)))
    assert err.count("(for alpha, beta)") == 1 and err.startswith("known_hosts "), err
    for w in words:
        assert w in err, err


@pytest.mark.parametrize("case", ["directory", "bad base64"])
def test_bad_known_hosts_exits_2_not_key_not_pinned(tmp_path: Path, case: str) -> None:
    (tmp_path / "keys").mkdir()
    make, words = KH_CASES[case]
    proc = run(inventory(tmp_path, known_hosts=make(tmp_path)), "exec", "--", "true")
    assert proc.returncode == 2, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "not pinned" not in err and "unreachable" not in err and "lost" not in err
    assert err.count("(for alpha, beta)") == 1 and words[-1] in err, err


@pytest.mark.parametrize("case", ["directory", "under a file", "bad base64"])
def test_trust_refuses_a_known_hosts_it_could_not_write_before_fetching_keys(
    tmp_path: Path, case: str
) -> None:
    (tmp_path / "keys").mkdir()
    make, words = KH_CASES[case]
    inv = inventory(tmp_path, known_hosts=make(tmp_path))
    proc = run(inv, "trust", "--yes")
    assert proc.returncode == 2, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "Cannot connect" not in err and "unreachable" not in err
    for w in words:
        assert w in err, err


def test_missing_known_hosts_is_not_an_error_nothing_is_pinned_yet(tmp_path: Path) -> None:
    check_local_files([])  # nothing to check
    assert known_hosts_problem(tmp_path / "keys" / "known_hosts") is None
    assert known_hosts_problem(tmp_path / "keys" / "known_hosts", writing=True) is None
    assert len(load_known_hosts(tmp_path / "nope")) == 0


def test_pin_host_key_writes_a_file_that_checks_clean(tmp_path: Path) -> None:
    import paramiko

    kh = tmp_path / "keys" / "known_hosts"
    key = paramiko.Ed25519Key.from_private_key_file(str(keygen(tmp_path / "hostkey", "-t", "ed25519")))
    pin_host_key(kh, "10.0.0.1", 2222, key)
    pin_host_key(kh, "10.0.0.2", 22, key)
    assert known_hosts_problem(kh) is None
    keys = load_known_hosts(kh, "x")
    assert keys.lookup(known_hosts_name("10.0.0.1", 2222)) is not None


def test_pin_host_key_into_a_directory_is_input_error(tmp_path: Path) -> None:
    import paramiko

    (tmp_path / "kh").mkdir()
    key = paramiko.Ed25519Key.from_private_key_file(str(keygen(tmp_path / "hostkey", "-t", "ed25519")))
    with pytest.raises(InputError, match="is a directory"):
        pin_host_key(tmp_path / "kh", "10.0.0.1", 22, key)


def test_usable_keys_pass(tmp_path: Path) -> None:
    for kind in ("ed25519", "ecdsa", "rsa"):
        found = inspect_key(keygen(tmp_path / kind, "-t", kind))
        assert not isinstance(found, tuple) and not found.via_agent, (kind, found)
    pem = inspect_key(keygen(tmp_path / "rsa-pem", "-t", "rsa", "-m", "PEM"))
    assert not isinstance(pem, tuple)


def test_dsa_key_is_named_as_unsupported(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["ssh-keygen", "-q", "-t", "dsa", "-N", "", "-f", str(tmp_path / "dsa")], capture_output=True
    )
    if proc.returncode != 0:
        pytest.skip("this ssh-keygen makes no DSA keys")
    found = inspect_key(tmp_path / "dsa")
    assert isinstance(found, tuple) and "ssh-dss" in found[0], found


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder that another user can enter (pytest's own tmp folders are root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="labctl-localfiles-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d)


def as_nobody(code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a python run as user nobody: real permission checks (root reads everything)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run as another user")
    return subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**no_agent(), "PYTHONPATH": str(REPO)},
    )


def test_unreadable_key_and_known_hosts_name_the_user_and_mode(shared_dir: Path) -> None:
    key = keygen(shared_dir / "id_ed25519", "-t", "ed25519")
    key.chmod(0o600)  # root's; nobody cannot read it
    kh = shared_dir / "known_hosts"
    kh.write_text(GOOD_KH_LINE + "\n")
    kh.chmod(0o600)
    proc = as_nobody(
        "from pathlib import Path\n"
        "from labctl.inventory.model import Host\n"
        "from labctl.transport.localfiles import check_local_files\n"
        f"h = Host(name='alpha', address='127.0.0.1', port=9, ssh_key=Path({str(key)!r}), "
        f"known_hosts=Path({str(kh)!r}))\n"
        "try:\n"
        "    check_local_files([h])\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e.message, e.hint)\n"
    )
    out = " ".join(proc.stdout.split())
    assert out.startswith("InputError"), proc.stdout + proc.stderr
    assert (
        "ssh_key" in out
        and "known_hosts" in out
        and out.count("cannot be read by user nobody (mode 0600") == 2
    )


def test_trust_into_a_folder_it_cannot_write_is_refused(shared_dir: Path) -> None:
    folder = shared_dir / "keys"
    folder.mkdir(mode=0o755)  # root's: nobody may read it but not add a file
    proc = as_nobody(
        "from pathlib import Path\n"
        "from labctl.transport.localfiles import known_hosts_problem\n"
        f"print(known_hosts_problem(Path({str(folder / 'known_hosts')!r}), writing=True))\n"
        f"print(known_hosts_problem(Path({str(folder / 'known_hosts')!r})))\n"
    )
    first, second = proc.stdout.splitlines()
    assert "cannot be written by user nobody" in first, proc.stdout + proc.stderr
    assert second == "None"  # reading a file that is not there yet is fine: nothing pinned


@given(st.text(max_size=200))
def test_any_known_hosts_line_is_judged_without_raising(line: str) -> None:
    assert isinstance(_bad_line(line), str)


@given(
    st.lists(st.sampled_from(["10.0.0.1", "[10.0.0.2]:2222", "m5.lab", "|1|c2FsdA==|aGFzaA=="]), min_size=1),
    st.sampled_from(["", "# a comment", "@cert-authority"]),
)
def test_well_formed_known_hosts_lines_are_never_flagged(names: list[str], prefix: str) -> None:
    line = f"{','.join(names)} {GOOD_KH_LINE.split(' ', 1)[1]}"
    if prefix:  # a commented-out line, or an OpenSSH marker paramiko skips
        line = f"{prefix} {line}"
    assert _bad_line(line) == ""


def test_known_hosts_aligned_with_several_spaces_or_hashed_still_pins(tmp_path: Path) -> None:
    name, key_type, key = GOOD_KH_LINE.split()
    kh = tmp_path / "known_hosts"
    kh.write_text(f"# aligned by hand\n{name}   {key_type}\t {key}  a comment\n")
    assert known_hosts_problem(kh) is None
    assert load_known_hosts(kh).lookup(name) is not None  # paramiko's own load skips such a line
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(kh)], check=True, capture_output=True)
    assert "|1|" in kh.read_text() and name not in kh.read_text()
    assert load_known_hosts(kh).lookup(name) is not None


# --- OpenSSH keys read with the stdlib: the same answers as paramiko's, without importing it ---


def _paramiko_answer(path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    """inspect_key's answer when the stdlib reading declines, so paramiko decides (as before)."""
    from labctl.transport import localfiles

    with monkeypatch.context() as m:
        m.setattr(localfiles, "read_openssh_key", lambda data: None)
        return inspect_key(path)


OPENSSH_KINDS = [
    ("ed25519",),
    ("rsa",),
    ("ecdsa", "-b", "256"),
    ("ecdsa", "-b", "384"),
    ("ecdsa", "-b", "521"),
]


@pytest.mark.parametrize("passphrase", ["", "secret-pass"], ids=["plain", "passphrase"])
@pytest.mark.parametrize("kind", OPENSSH_KINDS, ids=lambda k: "-".join(k))
def test_openssh_key_read_with_the_stdlib_answers_as_paramiko(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: tuple[str, ...], passphrase: str
) -> None:
    from labctl.transport.localfiles import read_openssh_key

    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    key = tmp_path / "id"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", *kind, "-N", passphrase, "-f", str(key)], check=True, capture_output=True
    )
    read = read_openssh_key(key.read_bytes())
    assert read is not None and read.encrypted == bool(passphrase)  # decided without paramiko
    assert read.public == base64.b64decode(key.with_name("id.pub").read_text().split()[1])
    assert inspect_key(key) == _paramiko_answer(key, monkeypatch)


def _corruptions(text: str) -> dict[str, str]:
    lines = text.splitlines()
    body = "".join(lines[1:-1])
    raw = bytearray(base64.b64decode(body))

    def wrapped(data: bytes | bytearray) -> str:
        b64 = base64.b64encode(bytes(data)).decode()
        return "\n".join([lines[0], *(b64[i : i + 70] for i in range(0, len(b64), 70)), lines[-1]]) + "\n"

    flipped_end = bytearray(raw)
    flipped_end[-40] ^= 0x55  # inside the private key, past the check numbers
    flipped_check = bytearray(raw)
    flipped_check[len(raw) - (len(raw) % 8) - 100] ^= 0x01
    return {
        "truncated": "\n".join(lines[: len(lines) // 2]) + "\n",
        "truncated body": wrapped(raw[: len(raw) - 30]),
        "no END line": "\n".join(lines[:-1]) + "\n",
        "bad base64": text.replace(lines[2][:8], "!!!!!!!!", 1),
        "byte flipped near the end": wrapped(flipped_end),
        "byte flipped": wrapped(flipped_check),
        "bad magic": wrapped(b"openssh-key-v2\x00" + raw[15:]),
    }


@pytest.mark.parametrize("kind", ["ed25519", "rsa", "ecdsa"])
def test_corrupt_openssh_key_answers_as_paramiko(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    good = keygen(tmp_path / "good", "-t", kind).read_text()
    for name, text in _corruptions(good).items():
        key = tmp_path / name.replace(" ", "-")
        key.write_text(text)
        assert inspect_key(key) == _paramiko_answer(key, monkeypatch), name


def test_check_local_files_on_an_openssh_key_imports_no_paramiko(tmp_path: Path) -> None:
    plain = keygen(tmp_path / "id_ed25519", "-t", "ed25519")
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "rsa", "-N", "secret-pass", "-f", str(tmp_path / "enc")],
        check=True,
        capture_output=True,
    )
    kh = tmp_path / "known_hosts"
    kh.write_text(GOOD_KH_LINE + "\n")
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from labctl.inventory.model import Host\n"
        "from labctl.transport.localfiles import check_local_files\n"
        f"h = Host(name='alpha', address='127.0.0.1', port=9, ssh_key=Path({str(plain)!r}), "
        f"known_hosts=Path({str(kh)!r}))\n"
        "check_local_files([h])\n"
        f"h = Host(name='beta', address='127.0.0.1', port=9, ssh_key=Path({str(tmp_path / 'enc')!r}))\n"
        "try:\n"
        "    check_local_files([h])\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e.message)\n"
        "print('paramiko' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**no_agent(), "PYTHONPATH": str(REPO)},
    )
    lines = proc.stdout.splitlines()
    assert lines[-1] == "False", proc.stdout + proc.stderr
    assert "passphrase" in lines[0] and "no ssh-agent is running" in lines[0], proc.stdout
