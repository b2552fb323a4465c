"""Controller side of `labctl cache`: the RAM model cache, filled host to host.

- `targets`: who holds a cache, its storage host and model folder (the one resolver that
  `labctl cache` and `labctl bench` share), and model-name checks;
- `plan`: pure decisions before a byte moves (what each model needs, what to evict);
- `ops`: single agent calls on a cache host (state, evict, pin);
- `sync`: the copy itself (a server on the storage host, a pull on the cache host) and verify.

The host side is labctl/agent/cache/. Nothing is re-exported here: importing the package
stays free, and each caller names the module it uses.
"""
