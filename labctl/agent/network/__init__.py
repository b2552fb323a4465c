"""Network changes on a host: the live state, the transaction that reverts by itself, bonds."""

COMMANDS = {
    "txn_begin": ".txn:begin_command",
    "txn_status": ".txn:status_command",
    "txn_commit": ".txn:commit_command",
    "txn_abort": ".txn:abort_command",
}
