"""The engines that serve the orchestra's models, one declared contract each (`base.Engine`).

An engine is one small file holding one `ENGINE`: which model formats it serves, the lowest
compute capability it runs on, how it starts (every interface bound, the orchestra's name
served), what its health answers mean and how readiness is proven. A new engine is one new
file and one line in `ENGINES`; the orchestra file names engines by these keys (`engine:` per
model, `server.engine` for the default). The contracts are checked when the file is loaded
and planned (`check.py`), before any host is touched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from labctl.agent.core.registry import load

if TYPE_CHECKING:
    from labctl.orchestra.engines.base import Engine

ENGINES = {
    "labctl": "labctl.orchestra.engines.labctl_server:ENGINE",
    "llama.cpp": "labctl.orchestra.engines.llama_cpp:ENGINE",
    "vllm": "labctl.orchestra.engines.vllm:ENGINE",
    "command": "labctl.orchestra.engines.command:ENGINE",
}


def engine(name: str) -> Engine:
    """The engine `name` (a key of ENGINES); KeyError for another name."""
    return load(ENGINES[name])
