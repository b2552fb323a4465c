"""Network changes on a host: the live state, the transaction that reverts by itself, bonds."""

from ..core.ops import ProbeKind

COMMANDS = {
    "txn_begin": ".txn:begin_command",
    "txn_status": ".txn:status_command",
    "txn_commit": ".txn:commit_command",
    "txn_abort": ".txn:abort_command",
}

# What `provision.probe` reads for the network resources (core/ops.py).
PROBES = (
    ProbeKind("bond", ".bondcheck:bond_probe", "a bond's driver, members, and what netplan says of its file"),
    ProbeKind("net_txn", ".txn:open_probe", "the network transaction open on the host, if any"),
)
