"""Host side of `labctl cache`: the RAM model cache's manifest, and host-to-host model copies.

A copy runs between two hosts and never through the controller:

- the storage host runs `cache.serve`: it lists the requested models under its storage folder,
  listens on its own address, announces one JSON line (port and a random one-time token) on
  stderr, then serves byte ranges of exactly those files to clients that present the token,
  hashing each range as it sends it and appending the sha256. It stops when a client asks it
  to, when nothing has happened for `idle_timeout` seconds, or when its SSH channel closes
  (labctl's watchdog kills it);
- the cache host runs `cache.pull`: N parallel TCP streams (separate flows, so a bond hashing
  layer3+4 spreads them over its members) fetch fixed-size chunks into a partial copy inside
  the cache, check every chunk's sha256, and record each verified chunk so a stopped copy
  resumes. Only a model whose every chunk is verified is renamed into place and entered in the
  manifest: the manifest never lists a model that is incomplete.

Layout of a cache (model_cache.path):

    <cache>/<model>                       complete, verified models (a file or a folder)
    <cache>/.labctl/manifest.json         per model: files, sizes, chunk hashes, source, times, pinned
    <cache>/.labctl/partial/<model>       a model being copied, in its final shape
    <cache>/.labctl/state/<model>.json    the partial copy's verified chunks
    <cache>/.labctl/{sync,manifest}.lock  flock files

The storage side caches chunk hashes in <models>/.labctl/hashes/<model>.json, keyed by each
file's size, mtime and the chunk size, when it may write there.

Modules: `manifest` (the Cache: paths, manifest, locks, room; state, evict, pin, touch),
`serve` (the storage side: list, serve), `pull` (the cache side: the copy), `verify`.
Stdlib only; runs on the host's own Python 3.8+.
"""

COMMANDS = {
    "state": ".manifest:state_command",
    "list": ".serve:list_command",
    "serve": ".serve:serve_command",
    "pull": ".pull:pull_command",
    "evict": ".manifest:evict_command",
    "pin": ".manifest:pin_command",
    "touch": ".manifest:touch_command",
    "verify": ".verify:verify_command",
}
