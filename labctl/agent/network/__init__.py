"""Network changes on a host: the live state, the transaction that reverts by itself, bonds."""

COMMANDS = {
    "net_begin": ".txn:begin_command",
    "net_status": ".txn:status_command",
    "net_commit": ".txn:commit_command",
    "net_abort": ".txn:abort_command",
}
