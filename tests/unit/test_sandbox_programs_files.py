"""The C attack programs are files shipped as package data (labctl/sandbox/programs/c_sources/),
and moving them out of Python strings changed no byte of what the sandbox compiles."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path, PurePosixPath

import labctl
from labctl.sandbox.programs import MARKER
from labctl.sandbox.programs import c as programs

PKG = Path(labctl.__file__).parent
SOURCES = PKG / "sandbox" / "programs" / "c_sources"

# sha256 of each program as the Python strings of labctl/sandbox/programs/c.py held it before the move.
EXPECTED = {
    "C_CPU": "d78000127cfb3353b12e3cda7a11037837a5455eeb02b3cdd4f6dc877a20b30e",
    "C_DISK": "915f89be0a96375ab3e6b033954e1594191e606a7c7d6f46094c5fa6586f16a5",
    "C_DOUBLE_FORK": "7b7b0bc438f1125070bb5efa460ccf7430042f92b58a8de98782131a2f841d73",
    "C_FIND": "e3f11063c576aa4824b4c94289d7f3bd52852ef0d221811a91d31a295bbf985c",
    "C_FLOOD": "bcad3a39845bf35faffe43a56bcb8b17f607935693307b28e3ed253c16190111",
    "C_FORK": "b50af3d4ffffa20cb6de231a5818caf5c699f04ed656f88d9f96c0f807652885",
    "C_IGNORE_TERM": "a8320c535af808f03cf0cc3a3eed4cddaa6e6de2918badbc9e3a4b603b614902",
    "C_INCLUDE_HOST": "f1cbe1f02352b4778b29274f36bc9537909a48683bfc7f434419e608cddf76bd",
    "C_INCLUDE_SHADOW": "6b721004ff436fd7b1a1b4684989e59de225ff4875d84d73a7d0324773e521c9",
    "C_INCLUDE_ZERO": "d312211cb70af50dc780452abd39707e88f90a5a82d994b79efe08136d1e519f",
    "C_KEYCTL": "079f400d28c71e396b04d6f77d342b0164d2fe23d2039390f9161a11f747b63a",
    "C_LINE": "c774a3cf5e40d9fb4bed809d3c0b4894e969ed828db427aa7b2848a1cf325914",
    "C_MEMORY": "298bd2fb406fd95526d7dae24207f4fef26c1331ff2ae93bebf7579fdf1d4cb7",
    "C_MEMORY_THREADS": "5a896c1fb790ea9bf8f205580b1aab0443abcfe80b90e3099c0954d581d73fbe",
    "C_MOUNT": "94758e344094d5619ea3d1837589d35eb7b43fc346ef009867c12e539369cd7b",
    "C_NEIGHBOUR": "9ef9b6ed31d8f64c3ba75cf49297343eabb528182a4094ce587bbae2114bb234",
    "C_NET_DNS": "1c97af04d360211162268e860734ab3a88b07a7f23c7947bef5e7fc213b2de1a",
    "C_NET_GATEWAY": "d802541340072c8ad192aa133aed993eb624a03f66b597a720f333c2da52715d",
    "C_NET_HEAD": "db52cffd3eaa46becee7a14579e7793363f5ef1114288ac1b7f5830d0a81241d",
    "C_NET_OUTSIDE": "32e9d24511b731e3c8078ef0ea0fd893dacda41a633dbfd662b39213e4a100da",
    "C_NET_SOCKETS": "fd77c9ae7ce4b56a630314363f4befce2015fa204615730e4f9e1815ad797ae3",
    "C_NET_UDP": "df52edf4f0e0fa70af7e3ee204e56e8ee3412d085cdfc396f8eb05edfd248aa5",
    "C_PEERS": "787de2b0a2cebf086955445e428e47cb2b788c64b8325a1d11cb2c504173c7db",
    "C_PLANT": "a8ad19de896882b892956780b3ee0684189220c3dc7b26a929c1595437a12f1a",
    "C_PROC": "e496c5bd673150c8ad8e36bd24f40c8c2014866936c71ab0c2d85245efb3b01f",
    "C_READONLY_ROOT": "cbb3ce0ec7ad67013461577f5e853766afdb2f0bbc97db831863abc859de4562",
    "C_UNSHARE": "37e26e0b13bd351fd23a65824537cbbeb9d5a945306f9970ff06aa2a75ed66e4",
}


def _named() -> dict[str, str]:
    return {n: v for n, v in vars(programs).items() if n.startswith("C_") and isinstance(v, str)}


def _file(name: str) -> Path:
    return SOURCES / f"{name[2:].lower()}.c"


def test_every_program_the_module_names_is_a_file_and_every_file_is_named() -> None:
    named = _named()
    assert sorted(named) == sorted(EXPECTED)
    assert [n for n in named if not _file(n).is_file()] == []
    assert sorted(p.name for p in SOURCES.glob("*.c")) == sorted(_file(n).name for n in named)


def test_the_text_is_byte_identical_to_the_old_strings() -> None:
    got = {n: hashlib.sha256(v.encode()).hexdigest() for n, v in _named().items()}
    assert got == EXPECTED


def test_a_network_program_is_the_shared_head_followed_by_its_own_file() -> None:
    head = _file("C_NET_HEAD").read_bytes().decode()
    for name in [n for n in EXPECTED if n.startswith("C_NET_") and n != "C_NET_HEAD"]:
        assert _named()[name] == head + _file(name).read_bytes().decode(), name
        assert _file(name).read_text().count("static void tcp(") == 0, name  # the head is not repeated


def test_the_other_programs_are_their_files_verbatim() -> None:
    for name, text in _named().items():
        if not name.startswith("C_NET_") or name == "C_NET_HEAD":
            assert text.encode() == _file(name).read_bytes(), name


def test_the_planted_and_sought_marker_is_the_one_the_self_test_names() -> None:
    for name in ("C_PLANT", "C_FIND"):
        assert f"/{MARKER}" in _named()[name], name


def test_the_package_data_globs_ship_every_program_file() -> None:
    doc = tomllib.loads((PKG.parent / "pyproject.toml").read_text())
    globs = doc["tool"]["setuptools"]["package-data"]["labctl"]
    files = [PurePosixPath(p.relative_to(PKG).as_posix()) for p in SOURCES.glob("*.c")]
    assert files
    # setuptools matches each glob against the path below the package, one directory level per *.
    uncovered = [
        str(f)
        for f in files
        if not any(f.match(g) and len(f.parts) == len(PurePosixPath(g).parts) for g in globs)
    ]
    assert uncovered == []
