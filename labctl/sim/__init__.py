"""A simulated lab on this machine: each host a network namespace with its own sshd.

`labctl sim up` and the test fixtures use the same small API:

    from labctl import sim

    lab = sim.up(tmp_dir, count=4)                 # m5, irina, pharaoh, workstation
    lab.inventory_path                             # tmp_dir/inventory.yaml (the inventory contract, docs/inventory.md)
    lab.hosts                                      # {"m5": "10.250.0.10", ...}
    lab.key_path, lab.known_hosts_path             # client key and pinned host keys
    lab.namespace("m5")                            # "lc-m5", for `ip netns exec`
    lab.stop_host("irina"); lab.start_host("irina")  # a dead host, and back
    lab.set_sftp("irina", False)                   # its sshd without SFTP, as a minimal install
    sim.status(tmp_dir)                            # [HostStatus(name, address, alive, reachable, ...)]
    sim.down(tmp_dir)                              # removes exactly what up recorded

Two labs can run side by side when each has its own `bridge`, `prefix` and `subnet`.
Everything needs root; only the namespaces' addresses and loopback are ever targets.
"""

from labctl.sim.lab import DEFAULT_DIR, HostStatus, SimLab, down, open_lab, start_host, status, stop_host, up
from labctl.sim.plan import (
    DEFAULT_BRIDGE,
    DEFAULT_HOSTS,
    DEFAULT_PREFIX,
    DEFAULT_RATE,
    DEFAULT_SUBNET,
    MANAGED_PATHS,
    ManagedPath,
)

__all__ = [
    "DEFAULT_BRIDGE",
    "DEFAULT_DIR",
    "DEFAULT_HOSTS",
    "DEFAULT_PREFIX",
    "DEFAULT_RATE",
    "DEFAULT_SUBNET",
    "MANAGED_PATHS",
    "HostStatus",
    "ManagedPath",
    "SimLab",
    "down",
    "open_lab",
    "start_host",
    "status",
    "stop_host",
    "up",
]
