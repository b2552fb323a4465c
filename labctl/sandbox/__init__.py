"""Docker sandboxes for untrusted code: recipes, limits, the pool's controller side, attacks.

Kept empty on purpose: `labctl --help` and the agent's blob must not pay for what a module
beside this one imports.
"""
