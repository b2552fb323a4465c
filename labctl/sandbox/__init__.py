"""labctl sandbox: running untrusted programs in hardened Docker containers."""
