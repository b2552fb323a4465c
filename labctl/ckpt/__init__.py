"""`labctl ckpt`: checkpoints kept off the host that trained them (the library on the storage host)."""
