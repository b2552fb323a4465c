"""The `labctl provision` command that applies one resource type to one host, for hints.

A hint that says "run `labctl provision --limit irina`" must name a command that really does it:
`provision` with a --limit outside every play of its playbook, or a playbook that has no such
resource, succeeds having done nothing. So the command is read off the playbook it would run
(the default one, or a shipped one such as playbooks/sandbox.yaml found the way defaults are),
with -p written so that it resolves from where the user is, or None when no play of it does it.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labctl.documents.defaults import default_places, shown_path
from labctl.output.errors import InputError
from labctl.provision.playbook import DEFAULT_PLAYBOOK, load_playbook, play_members

if TYPE_CHECKING:
    from labctl.inventory.model import Inventory


def find_playbook(rel: Path, inventory_path: Path) -> Path | None:
    """Where the shipped playbook `rel` (playbooks/NAME.yaml) of this lab is, found as defaults are."""
    return next((p for p in default_places(rel, inventory_path) if p.is_file()), None)


def provision_command(
    inventory: Inventory,
    host: str,
    type_name: str,
    playbook: Path = DEFAULT_PLAYBOOK,
    wants: Callable[[dict[str, Any]], bool] | None = None,
) -> str | None:
    """`labctl provision [-p PLAYBOOK] --tags TYPE --limit HOST`, when one of the playbook's
    plays selects `host` and has a `type_name` resource (whose parameters `wants`, if given);
    None when there is no such playbook or no play of it would touch the host."""
    path = find_playbook(playbook, inventory.path)
    if path is None:
        return None
    try:
        book = load_playbook(path)
        members = play_members(book, inventory)
    except InputError:
        return None
    applies = any(
        e.type_name == type_name and (wants is None or wants(e.params))
        for play, names in zip(book.plays, members, strict=True)
        if host in names
        for e in play.entries
    )
    if not applies:
        return None
    words = ["labctl", "provision"]
    # Without -p, provision reads the first default it finds: this one only if it is that.
    if playbook != DEFAULT_PLAYBOOK or path != find_playbook(DEFAULT_PLAYBOOK, inventory.path):
        words += ["-p", shown_path(path)]
    return shlex.join([*words, "--tags", type_name, "--limit", host])


def provision_fix(
    inventory: Inventory,
    host: str,
    type_name: str,
    playbook: Path = DEFAULT_PLAYBOOK,
    wants: Callable[[dict[str, Any]], bool] | None = None,
) -> str:
    """The provision command of `provision_command` in backticks; where there is none, what to
    change first and the command to run after."""
    cmd = provision_command(inventory, host, type_name, playbook, wants)
    if cmd is not None:
        return f"`{cmd}`"
    path = find_playbook(playbook, inventory.path)
    if path is None:
        return (
            f"{playbook} is neither beside {inventory.path} nor here: get it with `labctl init DIR`, "
            f"then run `labctl provision -p DIR/{playbook} --tags {type_name} --limit {host}`"
        )
    shown = shlex.quote(shown_path(path))
    return (
        f"no play of {shown} applies {type_name} to {host}: add {host} to a play's hosts: there (give it "
        f"the play's role), then run `labctl provision -p {shown} --tags {type_name} --limit {host}`"
    )
