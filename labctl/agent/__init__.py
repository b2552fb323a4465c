"""The labctl agent: the part of labctl that runs on a managed host.

It is shipped to the host as a zipapp and run by the host's own python3 (3.8 or newer), so
everything under this package uses only the standard library and its own modules, imports
nothing else from labctl, and keeps to Python 3.8 syntax. Each call answers with one JSON
object on stdout (see `__main__`).

A feature's host side is a package here named like its controller package (`cache`, `ckpt`,
`facts.collect`, `modelload`, `monitor`, `netbench`, `network`, `orchestra`, `provision`, `sandbox`,
`schedule`, `train`); its `__init__` declares the agent commands it serves (`COMMANDS`), which
`commands` merges, and each handler declares its arguments and answer (`core.spec.command`). The modules at
this package's root are what every feature uses: `paths` (every file labctl keeps on a host),
`fsutil`, `procs`, `parsers`, `textedit`, `hostlock`, `runlog`, `spec`, `errors`,
`registry`, `tinylm`, `gpus`, `nics`, `accepting`.
"""

from __future__ import annotations

AGENT_VERSION = "0.1.0"
