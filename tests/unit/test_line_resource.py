"""The `line` resource changes one line of a file and no other byte: whatever the line endings
(LF, CRLF, mixed, none at the end), whatever characters str.splitlines() would also cut at
(U+2028, form feed, \\x1c-\\x1e, \\x85, \\v, U+2029, a lone \\r), whatever the encoding."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from labctl.agent.provision.commands import apply_command, probe_command
from labctl.inventory.model import Host
from labctl.provision.resources.files import Line, edit_lines

MANAGED = "labctl.managed = 1"
REGEXP = r"^labctl\.managed\s*="
# What str.splitlines() cuts at besides "\n", and bytes that are not UTF-8.
TRAPS = ["\u2028", "\u2029", "\x0c", "\x0b", "\x1c", "\x1d", "\x1e", "\x85", "\r", "\t", " "]

line_text = st.text(
    alphabet=st.one_of(
        st.sampled_from(TRAPS), st.characters(blacklist_categories=("Cs",), blacklist_characters="\n")
    ),
    max_size=30,
).filter(lambda t: not re.search(REGEXP, t.rstrip("\r")) and t.rstrip("\r") != MANAGED)
line_bytes = st.one_of(
    line_text.map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")).filter(lambda b: b"labctl" not in b),
)
ending = st.sampled_from([b"\n", b"\r\n"])


@st.composite
def files(draw: Any) -> list[bytes]:
    """A file as its pieces, each a line with its own ending; the last one may lack it."""
    pieces = [draw(line_bytes) + draw(ending) for _ in range(draw(st.integers(0, 8)))]
    if draw(st.booleans()):
        pieces.append(draw(line_bytes.filter(bool)))
    return pieces


def host() -> Host:
    return Host(name="m5", address="10.0.0.1")


@given(files(), st.data())
def test_a_file_already_holding_the_line_comes_back_byte_for_byte(pieces: list[bytes], data: Any) -> None:
    at = data.draw(st.integers(0, len(pieces)))
    end = data.draw(ending) if at < len(pieces) or data.draw(st.booleans()) else b""
    if at == len(pieces) and pieces and not pieces[-1].endswith(b"\n"):
        pieces[-1] += b"\n"
    pieces.insert(at, MANAGED.encode() + end)
    before = b"".join(pieces)
    assert edit_lines(before, MANAGED, None, True) == before
    assert edit_lines(before, MANAGED, REGEXP, True) == before


@given(files())
def test_an_added_line_changes_no_other_byte_and_takes_the_files_ending(pieces: list[bytes]) -> None:
    before = b"".join(pieces)
    after = edit_lines(before, MANAGED, REGEXP, True)
    crlf = before.count(b"\r\n")
    newline = b"\r\n" if crlf > before.count(b"\n") - crlf else b"\n"
    closed = before + newline if before and not before.endswith(b"\n") else before
    assert after == closed + MANAGED.encode() + newline


@given(files(), st.data())
def test_a_replaced_line_is_the_only_change_and_keeps_its_ending(pieces: list[bytes], data: Any) -> None:
    at = data.draw(st.integers(0, len(pieces)))
    end = b"" if at == len(pieces) and (not pieces or not pieces[-1].endswith(b"\n")) else data.draw(ending)
    if at == len(pieces) and pieces and not pieces[-1].endswith(b"\n"):
        pieces[-1] += b"\n"
    head, tail = b"".join(pieces[:at]), b"".join(pieces[at:])
    old = b"labctl.managed = 0" + end
    assert edit_lines(head + old + tail, MANAGED, REGEXP, True) == head + MANAGED.encode() + end + tail


@given(files(), st.data())
def test_a_removed_line_takes_only_its_own_bytes(pieces: list[bytes], data: Any) -> None:
    at = data.draw(st.integers(0, len(pieces)))
    if at == len(pieces) and pieces and not pieces[-1].endswith(b"\n"):
        pieces[-1] += b"\n"
    head, tail = b"".join(pieces[:at]), b"".join(pieces[at:])
    for end in (b"\n", b"\r\n"):
        assert edit_lines(head + MANAGED.encode() + end + tail, MANAGED, None, False) == head + tail
        assert edit_lines(head + b"labctl.managed=7" + end + tail, None, REGEXP, False) == head + tail


@given(
    st.lists(line_text.filter(lambda t: not t.endswith("\r")), min_size=1, max_size=8),
    st.sampled_from(["\n", "\r\n"]),
)
def test_text_holding_line_separators_keeps_them_as_text(lines: list[str], newline: str) -> None:
    # The str API too: a U+2028 inside a line is part of it, never a line of its own.
    text = "".join(line + newline for line in lines)
    assert edit_lines(text, MANAGED, None, True) == text + MANAGED + newline
    assert edit_lines(text + MANAGED + newline, MANAGED, None, False) == text


def test_a_pasted_comment_holding_u2028_stays_a_comment() -> None:
    text = "# moved\u2028vm.swappiness = 60\nkernel.panic = 10\n"
    assert edit_lines(text, "vm.swappiness = 10", r"^vm\.swappiness", True) == text + "vm.swappiness = 10\n"


# --- the resource's apply path, on real files: the agent's own probe and apply, run here ----


def converge(res: Line) -> int:
    """Plan from a real probe, apply through the agent, until nothing is planned; the applies."""
    for applied in range(3):
        found = probe_command({"probes": res.probes()})["results"]
        change = res.plan(found)
        if not change.changed:
            return applied
        apply_command({"ops": change.ops})
    raise AssertionError(f"{res.label()} still plans after 3 applies: {change.summary}")


def test_line_on_a_crlf_file_not_utf8_with_separators_changes_one_line(tmp_path: Path) -> None:
    path = tmp_path / "sysctl.conf"
    before = (
        b"# caf\xe9 (latin-1)\r\n"
        b"# pasted: a\xe2\x80\xa8vm.swappiness = 60\r\n"
        b"\x0cpage\x1cbreak\x85\r\n"
        b"vm.swappiness = 60\r\n"
        b"kernel.panic = 10"
    )
    path.write_bytes(before)
    res = Line.from_playbook(
        host(), {"path": str(path), "line": "vm.swappiness = 10", "regexp": r"^vm\.swappiness"}
    )
    assert converge(res) == 1
    assert path.read_bytes() == before.replace(b"\r\nvm.swappiness = 60\r\n", b"\r\nvm.swappiness = 10\r\n")

    added = Line.from_playbook(host(), {"path": str(path), "line": "net.core.somaxconn = 4096"})
    assert converge(added) == 1
    assert path.read_bytes().endswith(b"kernel.panic = 10\r\nnet.core.somaxconn = 4096\r\n")

    gone = Line.from_playbook(host(), {"path": str(path), "regexp": r"^net\.core", "state": "absent"})
    assert converge(gone) == 1
    assert path.read_bytes() == before.replace(b"= 60\r\nkernel", b"= 10\r\nkernel") + b"\r\n"


def test_line_in_a_file_over_1_mib_keeps_the_rest(tmp_path: Path) -> None:
    # The probe sends no content above 1 MiB unless asked: an edit planned on "no content"
    # would write the one line over the whole file.
    path = tmp_path / "big.conf"
    before = b"".join(b"# filler line %07d\n" % i for i in range(80_000))
    assert len(before) > 1 << 20
    path.write_bytes(before)
    res = Line.from_playbook(host(), {"path": str(path), "line": "key = 1"})
    assert converge(res) == 1
    assert path.read_bytes() == before + b"key = 1\n"
