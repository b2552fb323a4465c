"""Network changes on a host: the live state, the transaction that reverts by itself, bonds."""
