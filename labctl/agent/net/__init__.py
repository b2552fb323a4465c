"""Host side of network changes (standard library only, Python 3.8): netplan checks (`netplan`),
the bonding driver and bond state (`bondcheck`)."""
