"""The one object a command carries: console, options, inventory and connections.

`inventory_path` is the inventory file as named (-i, $LABCTL_INVENTORY or the default), known
without reading it: what needs only the file or its folder (run records, the default
playbooks beside it, a message naming it) uses that. `inventory` parses and validates it, once,
for what needs the hosts.

Tests build their own Context (another inventory, a pool with other timeouts) instead of
patching globals.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from rich.console import Console

from labctl.output.console import emit_json, make_console

if TYPE_CHECKING:
    from labctl.inventory.model import Inventory
    from labctl.keeper.client import KeeperClient
    from labctl.transport.pool import ConnectionPool

DEFAULT_INVENTORY = Path("inventory/lab.yaml")


def resolve_inventory_path(given: Optional[Path]) -> Path:
    if given is not None:
        return Path(given)
    env = os.environ.get("LABCTL_INVENTORY")
    if env:
        return Path(env)
    return DEFAULT_INVENTORY


@dataclass
class Context:
    console: Console
    inventory_path: Path  # the file, unread: `inventory` is what parses it
    json_mode: bool = False
    verbose: int = 0
    connect_timeout: Optional[float] = None  # None: each host's own connect_timeout
    _inventory: Optional[Inventory] = field(default=None, repr=False)
    _pool: Optional[ConnectionPool] = field(default=None, repr=False)

    @classmethod
    def create(
        cls,
        inventory_path: Optional[Path] = None,
        json_mode: bool = False,
        verbose: int = 0,
        console: Optional[Console] = None,
    ) -> Context:
        return cls(
            console=console or make_console(),
            inventory_path=resolve_inventory_path(inventory_path),
            json_mode=json_mode,
            verbose=verbose,
        )

    @property
    def inventory(self) -> Inventory:
        if self._inventory is None:
            from labctl.inventory.load import load_inventory

            self._inventory = load_inventory(self.inventory_path)
        return self._inventory

    def inventory_file(self) -> Path:
        """The inventory's path, checked to exist but not parsed: for what is kept beside it (the
        run records), which needs no host. A missing file is refused as `inventory` refuses it."""
        if not self.inventory_path.is_file():
            self.inventory  # noqa: B018 -- raises the one "No inventory at ..." error
        return self.inventory_path

    @property
    def pool(self) -> ConnectionPool:
        if self._pool is None:
            from labctl.transport.pool import ConnectionPool

            self._pool = ConnectionPool(connect_timeout=self.connect_timeout, keeper=self.keeper)
        return self._pool

    def keeper(self) -> Optional[KeeperClient]:
        """The inventory's connection keeper as this command asks it, or None when keeping is
        off (`connections: {persist: 0}`, or $LABCTL_KEEPER=0)."""
        from labctl.keeper.client import KeeperClient, keeping_disabled

        if keeping_disabled() or not self.inventory_path.is_file():
            return None
        persist = self.inventory.connections.persist
        if persist <= 0:
            return None
        return KeeperClient(self.inventory_path, persist)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close_all()
            self._pool = None

    def emit(self, obj: Any) -> None:
        emit_json(obj)
