"""Lines of a user's file as the programs that read it see them: cut at b"\\n" only.

str.splitlines() also cuts at \\r, \\v, \\f, \\x1c-\\x1e, \\x85, U+2028 and U+2029, which
fstab, cron, sshd and the rest do not: a pasted comment holding U+2028 would come back as a
comment and an active line. Edits here work on bytes and change only the managed line; every
other byte (CRLF endings, a missing final newline, text that is not UTF-8) stays as it was.
Standard library only, Python 3.8.
"""

from __future__ import annotations

import re
from typing import List, Optional


def split_lines(data: bytes) -> List[bytes]:
    """`data` cut after each b"\\n", each piece keeping its own ending: b"".join() gives `data`."""
    pieces = data.split(b"\n")
    out = [p + b"\n" for p in pieces[:-1]]
    if pieces[-1]:
        out.append(pieces[-1])
    return out


def body(piece: bytes) -> bytes:
    """A line without its ending (b"\\n" or b"\\r\\n")."""
    if piece.endswith(b"\n"):
        piece = piece[:-1]
        if piece.endswith(b"\r"):
            piece = piece[:-1]
    return piece


def text_lines(text: str) -> List[str]:
    """`text`'s lines for a parser, cut at "\\n" only (a "\\r" before it dropped)."""
    pieces = text.split("\n")
    last = pieces.pop()
    out = [p[:-1] if p.endswith("\r") else p for p in pieces]
    return [*out, last] if last else out


def newline_of(data: bytes) -> bytes:
    """The ending a line added to `data` gets: CRLF when most of its lines end so, else LF."""
    crlf = data.count(b"\r\n")
    return b"\r\n" if crlf > data.count(b"\n") - crlf else b"\n"


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def edit_line(data: bytes, line: Optional[str], regexp: Optional[str], present: bool) -> bytes:
    """`data` with `line` present once (replacing the first line `regexp` finds, else added at
    the end) or absent (every line equal to `line` or found by `regexp` removed). A line already
    present changes nothing. Only that line's bytes change: a replaced line keeps its ending, an
    added one takes the file's (the last line gaining the ending it lacked)."""
    pieces = split_lines(data)
    pattern = re.compile(regexp) if regexp is not None else None
    want = line.encode("utf-8", "surrogateescape") if line is not None else None

    def matches(piece: bytes) -> bool:
        if pattern is not None and pattern.search(_decode(body(piece))):
            return True
        return want is not None and body(piece) == want

    if present:
        assert want is not None
        if any(body(p) == want for p in pieces):
            return data
        for i, piece in enumerate(pieces):
            if matches(piece):
                pieces[i] = want + piece[len(body(piece)) :]
                return b"".join(pieces)
        newline = newline_of(data)
        if data and not data.endswith(b"\n"):
            data += newline
        return data + want + newline
    return b"".join(p for p in pieces if not matches(p))
