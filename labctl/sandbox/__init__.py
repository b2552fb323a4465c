"""Docker sandboxes for untrusted code, controller side: limits, `run`/`run_many`, the self-test
and its attacks (the language recipes live with the host side, `labctl.agent.sandbox.languages`).

Kept light on purpose: `labctl --help` and the agent's blob must not pay for what a module
beside this one imports. `labctl.sandbox.run` / `run_many` load `api` on first use.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("run", "run_many"):
        from labctl.sandbox import api

        return getattr(api, name)
    raise AttributeError(name)
