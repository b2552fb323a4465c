"""The labctl agent: the part of labctl that runs on a managed host.

It is shipped to the host as a zipapp and run by the host's own python3 (3.8 or newer), so
everything under this package uses only the standard library and its own modules, imports
nothing else from labctl, and keeps to Python 3.8 syntax. Each call answers with one JSON
object on stdout (see `__main__`).
"""

from __future__ import annotations

AGENT_VERSION = "0.1.0"
