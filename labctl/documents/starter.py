"""`labctl init`: a starter lab folder (the seed lab's inventory, the default playbooks and the
examples a newcomer runs: the simulated lab's orchestras, this machine as a sandbox host).

The files are labctl's own package data (labctl/data/), so an installed labctl writes the same
files the repository holds, in the repository's layout: DIR/inventory/lab.yaml beside
DIR/playbooks/, the examples in DIR/inventory/examples/ (the paths `make demo`, `bench phase3
--help` and the examples' own comments name). From DIR, the default inventory
(inventory/lab.yaml) is then the new one, and the playbooks are found beside it
(labctl/documents/defaults.py looks in the inventory's parent).
Nothing is overwritten unless asked: with a file already there, nothing at all is written.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from labctl.output.errors import InputError

INVENTORY = "inventory/lab.yaml"
# (name in labctl/data, where it goes in the lab folder)
FILES = [
    ("lab.yaml", INVENTORY),
    ("playbooks/provision.yaml", "playbooks/provision.yaml"),
    ("playbooks/train.yaml", "playbooks/train.yaml"),
    ("playbooks/orchestra.yaml", "playbooks/orchestra.yaml"),
    ("playbooks/sandbox.yaml", "playbooks/sandbox.yaml"),
    ("playbooks/engines.yaml", "playbooks/engines.yaml"),
    ("playbooks/network.yaml", "playbooks/network.yaml"),
    ("playbooks/alerts.yaml", "playbooks/alerts.yaml"),
    ("playbooks/plan.yaml", "playbooks/plan.yaml"),
    *(
        (f"examples/{name}", f"inventory/examples/{name}")
        for name in (
            "orchestra-sim.yaml",
            "orchestra-learn.yaml",
            "local-sandbox.yaml",
            "sandbox-python.yaml",
        )
    ),
]
HEADER = (
    "# Written by `labctl init`: the seed lab's inventory as a starting point. Make the hosts yours\n"
    "# (names, addresses, roles, GPUs, model_cache, storage), then check it with\n"
    "#   labctl -i {path} inventory validate\n"
)


def starter_files() -> dict[str, str]:
    """Each starter file's path inside the lab folder, and its text."""
    data = resources.files("labctl") / "data"
    out = {}
    for src, dest in FILES:
        text = (data / src).read_text(encoding="utf-8")
        out[dest] = text
    return out


def write_starter(folder: Path, force: bool = False) -> list[Path]:
    """Write the starter inventory, the default playbooks and the examples into `folder`; the paths written.

    An existing file is an InputError naming every one (nothing written) unless `force`.
    """
    files = starter_files()
    targets = {folder / rel: text for rel, text in files.items()}
    if folder.exists() and not folder.is_dir():
        raise InputError(
            f"{folder} is a file, not a folder.", "Name a new or existing folder: labctl init mylab."
        )
    there = [p for p in targets if p.exists() or p.is_symlink()]
    if there and not force:
        raise InputError(
            f"Not overwriting {', '.join(str(p) for p in there)}: nothing was written.",
            "Pass --force to replace them with the starter files, or pick another folder.",
        )
    from labctl.output.files import write_output

    written = []
    for path, text in targets.items():
        if path == folder / INVENTORY:
            text = HEADER.format(path=path) + text
        # A rename: with --force, a symlink there is replaced itself, never the file it points to.
        write_output(path, text, 0o644)
        written.append(path)
    return written
