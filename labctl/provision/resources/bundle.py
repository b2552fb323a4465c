"""labctl as this controller runs it, packed for another host: the `labctl` package and the
files of every distribution it depends on (read from this interpreter's importlib.metadata),
so the orchestrator runs the same code at the same versions with no venv and no index.

Copied files only work on a host whose Python has the same major.minor and platform as this
one (compiled extensions: pydantic-core, cryptography); elsewhere the host installs the
same pinned versions itself with `pip install --target`.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import re
import sys
import sysconfig
import tarfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import labctl

ROOT_DIST = "labctl"
NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def required_names(requires: list[str] | None) -> list[str]:
    """The distributions a `Requires-Dist` list names, leaving out extras (`; extra == "x"`)."""
    out: list[str] = []
    for req in requires or []:
        m = NAME_RE.match(req)
        _, _, marker = req.partition(";")
        if m and "extra" not in marker:
            out.append(m.group(1))
    return out


def dependencies(root: str = ROOT_DIST) -> list[metadata.Distribution]:
    """Every installed distribution `root` needs, transitively, sorted by name; `root` itself
    is left out (its package is copied from where this process imports it). A requirement
    whose marker does not hold here (colorama on Windows) is not installed, so not followed."""
    seen: dict[str, metadata.Distribution] = {}
    todo = required_names(metadata.distribution(root).requires)
    while todo:
        name = canonical(todo.pop())
        if name in seen or name == canonical(root):
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[name] = dist
        todo += required_names(dist.requires)
    return [seen[k] for k in sorted(seen)]


def _skip(rel: str) -> bool:
    parts = rel.split("/")
    return (
        rel.startswith("..")  # scripts installed in bin/: the launcher replaces them
        or "__pycache__" in parts
        or rel.endswith((".pyc", ".pth"))
        or parts[0].startswith("__editable__")
    )


def dist_files(dist: metadata.Distribution) -> list[tuple[str, Path]]:
    """(path relative to site-packages, file on this machine) for each file `dist` installed."""
    out = []
    for f in dist.files or []:
        rel = f.as_posix()
        src = Path(str(dist.locate_file(f)))
        if not _skip(rel) and src.is_file():
            out.append((rel, src))
    return out


def package_files() -> list[tuple[str, Path]]:
    """The `labctl` package this process runs, wherever it is imported from (a checkout too)."""
    pkg = Path(labctl.__file__).parent
    return [
        ("labctl/" + p.relative_to(pkg).as_posix(), p)
        for p in sorted(pkg.rglob("*"))
        if p.is_file() and not _skip(p.relative_to(pkg).as_posix())
    ]


def runtime() -> dict[str, str]:
    """What copied compiled files need the host's Python to match."""
    return {"python": f"{sys.version_info[0]}.{sys.version_info[1]}", "platform": sysconfig.get_platform()}


def oldest_python() -> tuple[int, int]:
    """The oldest Python labctl runs on, from its Requires-Python (>=3.11)."""
    m = re.search(r">=\s*(\d+)\.(\d+)", metadata.metadata(ROOT_DIST)["Requires-Python"] or "")
    return (int(m.group(1)), int(m.group(2))) if m else (3, 8)


RUNTIME_PROBE = "import sys, sysconfig; print('%d.%d %s' % (sys.version_info[0], sys.version_info[1], sysconfig.get_platform()))"


@dataclass(frozen=True)
class Bundle:
    files: tuple[tuple[str, Path], ...]  # (path in the release, file here)
    pip: tuple[str, ...]  # name==version the host installs itself (empty when copied)
    record: dict[str, str]  # what install.json on the host says: version, digest, runtime

    @property
    def tag(self) -> str:
        return f"{self.record['labctl']}-{self.record['digest'][:12]}"

    def tar_gz(self) -> bytes:
        """The release as a reproducible tar.gz: same files, same bytes."""
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for arc, src in self.files:
                data = src.read_bytes()
                info = tarfile.TarInfo(arc)
                info.size = len(data)
                info.mode = 0o755 if src.stat().st_mode & 0o111 else 0o644
                tar.addfile(info, io.BytesIO(data))
        return gzip.compress(raw.getvalue(), compresslevel=6, mtime=0)


def make_bundle(copy: bool) -> Bundle:
    """labctl for a host; `copy`: the host's Python matches this one, so its dependencies'
    files are copied too, else named for `pip install --target`."""
    return _bundle(copy)


@functools.cache
def _bundle(copy: bool) -> Bundle:
    deps = dependencies()
    files = [("lib/" + rel, src) for rel, src in package_files()]
    pip: list[str] = []
    if copy:
        files += [("lib/" + rel, src) for d in deps for rel, src in dist_files(d)]
    else:
        pip = [f"{d.metadata['Name']}=={d.version}" for d in deps]
    files.sort()
    h = hashlib.sha256()
    for arc, src in files:
        h.update(arc.encode() + b"\0" + hashlib.sha256(src.read_bytes()).digest())
    for req in pip:
        h.update(b"pip\0" + req.encode())
    record = {
        "labctl": labctl.__version__,
        "digest": h.hexdigest(),
        "mode": "copy" if copy else "pip",
        **runtime(),
    }
    return Bundle(tuple(files), tuple(pip), record)
