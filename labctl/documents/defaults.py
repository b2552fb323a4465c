"""The default files a command reads when none is given (the playbooks), found the same way
by every command: in the inventory's folder, then its parent (the repository's layout:
inventory/ beside playbooks/), then the current folder. A new lab gets them from `labctl init`."""

from __future__ import annotations

from pathlib import Path

from labctl.output.errors import InputError


def default_places(rel: Path, inventory_path: Path) -> list[Path]:
    """Where the default `rel` (e.g. playbooks/provision.yaml) is looked for, in order."""
    inv_dir = Path(inventory_path).absolute().parent
    out: list[Path] = []
    for base in (inv_dir, inv_dir.parent, Path.cwd()):
        p = base / rel
        if p not in out:
            out.append(p)
    return out


def shown_path(path: Path) -> str:
    """`path` as a command line in a hint gives it: relative to the current folder when below it
    (where the user runs the hint), else absolute."""
    path = path.absolute()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def find_default(rel: Path, inventory_path: Path, kind: str, option: str) -> Path:
    """The first `rel` among `default_places`, or an InputError that says where it looked."""
    places = default_places(rel, inventory_path)
    for p in places:
        if p.is_file():
            return p
    inv_dir = Path(inventory_path).parent
    raise InputError(
        f"No {kind} given and no default {rel}: looked in the folder of the inventory {inventory_path} "
        f"and its parent, then in the current folder ({', '.join(str(p) for p in places)}).",
        f"Pass one with {option}, or get the defaults with `labctl init DIR` and put its playbooks/ "
        f"folder in {inv_dir}.",
    )
