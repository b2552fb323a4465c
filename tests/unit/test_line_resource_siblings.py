"""Other places that edit or read a user's file line by line: they cut at "\\n" only, as the
programs that read those files do, and an edit keeps every byte it does not own."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from labctl.agent.core.parsers import parse_mounts, parse_os_release
from labctl.agent.network.bondcheck import ifupdown_conflicts
from labctl.agent.provision.commands import apply_command, probe_command
from labctl.inventory.model import Host, ModelCache
from labctl.provision.resources.controller import AuthorizedKey, AuthorizedKeyParams
from labctl.provision.resources.model_cache import GIB, MARK, edit_fstab, fstab_entry
from labctl.provision.resources.model_cache import ModelCache as ModelCacheRes

PATH = "/mnt/model-cache"
ENTRY = fstab_entry(PATH, 4, 0o755)
PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGc3Bvq0mV3cBXHXqkqEM0l6fIxU4oXBe7kq4X0fJq4D"

fstab_line = st.one_of(
    st.text(
        alphabet=st.one_of(
            st.sampled_from(["\u2028", "\u2029", "\x0c", "\x0b", "\x1c", "\x85", "\r", "\xa0", " ", "#"]),
            st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"),
        ),
        max_size=40,
    ).map(str.encode),
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
).filter(lambda b: b"model-cache" not in b and b"labctl" not in b)


@st.composite
def fstabs(draw: Any) -> bytes:
    pieces = [
        draw(fstab_line) + draw(st.sampled_from([b"\n", b"\r\n"])) for _ in range(draw(st.integers(0, 6)))
    ]
    if draw(st.booleans()):
        pieces.append(draw(fstab_line))
    return b"".join(pieces)


@given(fstabs())
def test_fstab_gains_our_entry_and_keeps_every_other_byte(before: bytes) -> None:
    after = edit_fstab(before, PATH, ENTRY)
    crlf = before.count(b"\r\n")
    nl = b"\r\n" if crlf > before.count(b"\n") - crlf else b"\n"
    closed = before + nl if before and not before.endswith(b"\n") else before
    assert after == closed + f"{MARK} {PATH}".encode() + nl + ENTRY.encode() + nl
    assert edit_fstab(after, PATH, ENTRY) == after


@given(fstabs(), fstabs(), st.sampled_from([b"\n", b"\r\n"]))
def test_a_resized_fstab_entry_is_the_only_line_that_changes(head: bytes, tail: bytes, nl: bytes) -> None:
    head = head + nl if head and not head.endswith(b"\n") else head
    old = f"{MARK} {PATH}".encode() + nl + fstab_entry(PATH, 2, 0o755).encode() + nl
    new = f"{MARK} {PATH}".encode() + nl + ENTRY.encode() + nl
    assert edit_fstab(head + old + tail, PATH, ENTRY) == head + new + tail


def probe(path: Path, whole: bool = True) -> dict[str, Any]:
    found: dict[str, Any] = probe_command(
        {"probes": {"f": {"kind": "file", "path": str(path), "whole": whole}}}
    )
    return dict(found["results"]["f"])


def test_a_pasted_fstab_comment_holding_u2028_stays_a_comment(tmp_path: Path) -> None:
    fstab = tmp_path / "fstab"
    before = (
        b"UUID=abc / ext4 defaults 0 1\n"
        b"# old disk, pasted from a wiki:\xe2\x80\xa8/dev/sdb1 /data ext4 defaults 0 2\n"
        b"# caf\xe9 (latin-1)"
    )
    fstab.write_bytes(before)
    res = ModelCacheRes.from_playbook(
        Host(name="m5", address="10.0.0.1", model_cache=ModelCache(path=PATH, size_gb=4)), {}
    )
    state = {
        "mount": {"mounted": True, "fstype": "tmpfs", "size_bytes": 4 * GIB, "used_bytes": 0},
        "mem": {"total_bytes": 64 * GIB, "available_bytes": 60 * GIB},
        "fstab": probe(fstab),
        "manifest": {"exists": True, "is_dir": True},
    }
    (write,) = [op for op in res.plan(state).ops if op["op"] == "write_file"]
    apply_command({"ops": [{**write, "path": str(fstab), "backup": str(tmp_path / "fstab.bak")}]})
    assert fstab.read_bytes() == before + f"\n{MARK} {PATH}\n{ENTRY}\n".encode()
    assert (tmp_path / "fstab.bak").read_bytes() == before
    assert not res.plan({**state, "fstab": probe(fstab)}).changed


def test_authorized_keys_that_are_not_utf8_keep_every_other_key(tmp_path: Path) -> None:
    ssh = tmp_path / ".ssh"
    ssh.mkdir(mode=0o700)
    keys = ssh / "authorized_keys"
    before = b"ssh-rsa AAAAB3Nza jos\xe9@laptop\r\nssh-ed25519 AAAAC3Nz ann@desk # moved\xe2\x80\xa8x\r\n"
    keys.write_bytes(before)
    os.chmod(keys, 0o600)
    mark = "labctl-orchestrator@pharaoh"
    res = AuthorizedKey(Host(name="m5", address="10.0.0.1"), AuthorizedKeyParams(mark=mark, key=PUB))

    def state() -> dict[str, Any]:
        ids = {"uid": os.getuid(), "user_gid": os.getgid(), "home": str(tmp_path)}
        return {"keys": {**ids, "ssh_dir": probe(ssh), "path": str(keys), "file": probe(keys)}}

    apply_command({"ops": res.plan(state()).ops})
    assert keys.read_bytes() == before + f"{PUB} {mark}\r\n".encode()
    assert not res.plan(state()).changed
    gone = AuthorizedKey(Host(name="m5", address="10.0.0.1"), AuthorizedKeyParams(mark=mark, state="absent"))
    apply_command({"ops": gone.plan(state()).ops})
    assert keys.read_bytes() == before


def test_os_release_value_holding_u2028_is_one_field() -> None:
    text = 'NAME="Lab\u2028ID=evil"\nID=debian\r\nVERSION_ID="12"\n'
    assert parse_os_release(text) == {"NAME": "Lab\u2028ID=evil", "ID": "debian", "VERSION_ID": "12"}


def test_a_mount_point_holding_u2028_or_nbsp_is_read_whole() -> None:
    text = "tmpfs /mnt/a\u2028b tmpfs rw 0 0\ntmpfs /mnt/c\xa0d tmpfs rw 0 0\n/dev/sda1 / ext4 rw 0 0\n"
    assert [m["mountpoint"] for m in parse_mounts(text)] == ["/mnt/a\u2028b", "/mnt/c\xa0d", "/"]


def test_an_ifupdown_comment_holding_u2028_is_no_stanza(tmp_path: Path) -> None:
    interfaces = tmp_path / "interfaces"
    interfaces.write_text("auto lo\n# was:\u2028iface eno1 inet dhcp\n\x0ciface lo inet loopback\n")
    ifup = tmp_path / "ifup"  # ifupdown is not installed here: only the file's presence is read
    ifup.write_text("")
    assert ifupdown_conflicts(["eno1"], str(interfaces), str(ifup)) == []
