"""What `labctl init` shows (rich, on stderr)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def render_starter(console: Any, folder: Path, written: list[Path], inv: Path) -> None:
    """`labctl init`: the files written, then the next steps with this folder's paths."""
    for p in written:
        console.print(f"[green]wrote[/] {p}", soft_wrap=True, markup=True, highlight=False)
    console.print(
        "\nNext:\n"
        f"  1. edit {inv}: your hosts' names, addresses, roles, GPUs, model_cache and storage\n"
        f"  2. labctl -i {inv} inventory validate\n"
        f"  3. labctl -i {inv} trust --yes            # pin each host's SSH key\n"
        f"  4. labctl -i {inv} provision --check --diff   # {folder / 'playbooks/provision.yaml'}\n"
        f"In {folder} it is the default inventory; elsewhere set LABCTL_INVENTORY={inv.absolute()} "
        "to leave out -i.",
        soft_wrap=True,
        markup=False,
    )
