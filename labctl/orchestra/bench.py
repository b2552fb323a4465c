"""`labctl bench rotation`: what one rotation costs, by stage and as a share of the cadence.

The peer is inside the same run: the server's own load and warm-up figures are what loading the
model by hand costs (the loader, then a first forward pass); everything else (process start,
health polling, the SSH round trips, stopping the leavers) is labctl's orchestration overhead,
shown beside it. Seed 000 §12.3's figures are per model 15 s load from RAM + 40 s warm-up, about
2 minutes for 2 models every 4-6 hours: under 1% of training time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from labctl.output.progress import QUIET, Progress

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.orchestra.spec import Orchestra

SEED_LOAD_S = 15.0  # per model, from M5's RAM cache
SEED_WARMUP_S = 40.0  # per model, the first inference
SEED_ROTATION_S = 120.0  # 2 models: "~2 minutes"


def report_from(
    result: dict[str, Any], every_s: float, startup: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Pure: the bench's figures from a rotation's JSON (RotationResult.to_json())."""
    joined = result.get("joined") or []
    left = result.get("left") or []
    n = max(1, len(joined))
    stages = dict(result.get("stages") or {})
    total = float(result.get("seconds") or 0.0)
    bare = sum(float(t.get("load") or 0) + float(t.get("warmup") or 0) for t in joined)
    per_model = {
        k: round(float(stages.get(k) or 0.0) / n, 3) for k in ("cache", "start", "load", "warmup", "health")
    }
    per_model["stop"] = round(float(stages.get("stop") or 0.0) / max(1, len(left)), 3)
    out: dict[str, Any] = {
        "joined": [t["model"] for t in joined],
        "left": [t["model"] for t in left],
        "stages": stages,
        "per_model": per_model,
        "rotation_s": round(total, 3),
        "every_s": every_s,
        "share_of_cadence": round(total / every_s, 6) if every_s else None,
        "bare_load_warmup_s": round(bare, 3),
        "orchestration_overhead_s": round(max(0.0, total - bare - float(stages.get("cache") or 0.0)), 3),
        "cache_hits": sum(1 for t in joined if t.get("cache_hit")),
        "cache_misses": sum(1 for t in joined if not t.get("cache_hit")),
        "seed": {
            "per_model_load_s": SEED_LOAD_S,
            "per_model_warmup_s": SEED_WARMUP_S,
            "rotation_s": SEED_ROTATION_S,
            "share_of_4h": round(SEED_ROTATION_S / (4 * 3600), 6),
        },
    }
    if startup is not None:
        out["startup_s"] = startup.get("seconds")
    return out


def rotation_bench(
    ctx: Context, orch: Orchestra, python: str | None, progress: Progress = QUIET
) -> dict[str, Any]:
    """`progress` hears the rotations' events, and "warming first" before a start it makes."""
    from labctl.orchestra.rotate import Options, rotate
    from labctl.orchestra.status import orchestra_status

    startup = None
    if not orchestra_status(ctx, orch).rows:
        progress.event("warming first")
        startup = rotate(ctx, orch, Options("start", python=python, progress=progress)).to_json()
    result = rotate(ctx, orch, Options("rotate", python=python, progress=progress)).to_json()
    return report_from(result, orch.every_s, startup)
