"""The agent's shared core (ansible's module_utils): what every feature's host code stands on.

Errors, the spec language of commands, labctl's paths on a host, atomic file writes, process
tags, the JSON-over-HTTP handler and the lazy registry live here. A module goes here only when
more than one feature needs it; a feature's own code stays in its package.

Standard library only (Python 3.8): it runs on every host.
"""
