"""How big a served model is on its GPU, from what its files say: the context it serves and the
KV cache of that context. Pure; shared by the orchestra file (spec.py) and the engine checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def served_context(own: int | None, default: int, files: Mapping[str, Any] | None) -> int:
    """The context a model is served with: its own `context:`, else the file's default, capped at
    what the model was trained for where its files say."""
    wanted = own or default
    limit = (files or {}).get("context")
    return min(wanted, int(limit)) if isinstance(limit, int) and limit > 0 else wanted


def kv_cache_gb(files: Mapping[str, Any], context: int, bytes_per_elem: int = 2) -> float | None:
    """GB the KV cache of `context` tokens takes (K and V of every layer), or None where the
    files did not say the geometry."""
    try:
        layers, kv_heads, head_dim = (int(files[k]) for k in ("layers", "kv_heads", "head_dim"))
    except (KeyError, TypeError, ValueError):
        return None
    return 2 * layers * kv_heads * head_dim * context * bytes_per_elem / 1e9
