"""Network changes: bonds rendered for netplan, and the transaction that makes any change safe."""
