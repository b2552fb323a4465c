"""Carrying out a rotation (and `orchestra start`/`stop`): lock, repair, cache, start, wait, stop.

The decision is pure data (`labctl/orchestra/decide.py`: who leaves, who joins, where, in which
order); this module only carries it out on the serving hosts, in the plan's order:
- every serving host's rotation lock is taken first (sorted by name, so two rotations never
  deadlock), before its state is read: a second rotation waits for the first, then plans from
  what it left;
- what a killed rotation left is repaired (orphan servers stopped, lost models dropped) and
  warm.json rewritten to match what answers, before anything else happens;
- joining models missing from the host's RAM cache are synced, evicting only cold models;
- joiners start (make-before-break where memory allows), their health checks are awaited, and
  warm.json is written after each batch that succeeded and after each batch of stops, so at any
  moment it lists exactly the servers that answer;
- a joiner that fails is stopped (no half-started server is left) and the error names its log.
Every stage is timed; the result is JSON-ready (`to_json`) for `--json` and `bench rotation`.
Each stage is a module of labctl/orchestra/steps/; `run_plan` runs them in the plan's order.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from labctl.cache.targets import has_cache
from labctl.orchestra import spec
from labctl.orchestra.decide import decide
from labctl.orchestra.files import read_files
from labctl.orchestra.hoststate import find_repair, gone_hosts, read_views
from labctl.orchestra.steps.cache import sync_cache
from labctl.orchestra.steps.commit import commit, history_entry
from labctl.orchestra.steps.lock import ROTATION, Locks, reach_gone
from labctl.orchestra.steps.publish import publish
from labctl.orchestra.steps.repair import left_behind, repair, retire, retire_note
from labctl.orchestra.steps.start import failed_start_hint, lacks_torch, start_args, start_batch
from labctl.orchestra.steps.state import Options, Rotation, RotationResult, Timing
from labctl.orchestra.steps.stop import stop, stop_rest
from labctl.orchestra.steps.verify import verify
from labctl.output.errors import InputError
from labctl.provision.hint import provision_fix

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.inventory.model import Host
    from labctl.orchestra.spec import Orchestra

# Kept importable from here, where callers and tests have always found them.
__all__ = [
    "ROTATION",
    "Options",
    "RotationResult",
    "Timing",
    "failed_start_hint",
    "lacks_torch",
    "left_behind",
    "retire_note",
    "rotate",
    "serving_hosts",
    "start_args",
]


def serving_hosts(ctx: Context, orch: Orchestra) -> list[Host]:
    """The orchestra's hosts (its `hosts:` expression), each with a model cache to serve from."""
    hosts = [h for h in spec.serving_hosts(orch, ctx.inventory) if not h.is_windows]
    if not hosts:
        raise InputError(
            f"The orchestra's hosts ({orch.hosts}) are all Windows hosts; the orchestra serves from Linux hosts.",
            "Set `hosts:` in the orchestra file to the inference hosts (default role:inference).",
        )
    bare = [h.name for h in hosts if not has_cache(h)]
    if bare:
        raise InputError(
            f"The orchestra serves models from each host's RAM cache, but {', '.join(bare)} "
            f"{'has' if len(bare) == 1 else 'have'} no model_cache in the inventory.",
            "Give each serving host a model_cache (path, size_gb, source) and provision it "
            f"({provision_fix(ctx.inventory, bare[0], 'model_cache')}), or leave it out of the orchestra's `hosts:`.",
        )
    return hosts


def rotate(ctx: Context, orch: Orchestra, opts: Options) -> RotationResult:
    """Decide, then (unless dry-run) carry out one rotation, `orchestra start` or `stop`."""
    t0 = time.monotonic()
    hosts = serving_hosts(ctx, orch)
    by_name = {h.name: h for h in hosts}
    with ExitStack() as stack:
        locks = Locks(ctx, opts, stack)
        locks.take(hosts)
        waited = time.monotonic() - t0
        views = read_views(ctx, hosts, orch.server.health)
        # Hosts that served at the last commit and serve no more: those still in the inventory
        # are reached and emptied; the others (and one that does not answer) can only be named.
        gone = gone_hosts(views, list(by_name), ctx.inventory.lab)
        retired, retired_views, unreachable = reach_gone(ctx, orch, gone, locks)
        repairs = {name: find_repair(v) for name, v in views.items()}
        files: dict[str, dict[str, Any]] = {}
        if opts.kind != "stop":
            files, _ = read_files(ctx, orch, hosts)
        plan = decide(ctx.inventory, orch, hosts, views, repairs, opts.kind, opts.out, opts.in_, files)
        result = RotationResult(opts.kind, plan, opts.dry_run, waited_for_lock=waited)
        removed = {n: r for n, r in gone.items() if n not in retired}
        result.left_behind = left_behind(removed, ctx.inventory.lab, unreachable)
        if opts.dry_run:
            result.repairs = [n for r in repairs.values() for n in r.notes()]
            result.repairs += [retire_note(h, v, orch, dry_run=True) for h, v in retired_views.items()]
            result.repairs += [lb["note"] for lb in result.left_behind]
            result.warm = {h: [dict(m) for m in r.current] for h, r in repairs.items()}
            result.seconds = time.monotonic() - t0
            return result
        result.repairs += [lb["note"] for lb in result.left_behind if not lb["command"]]
        rot = Rotation(ctx, orch, opts, by_name, views, plan, result, retired, files)
        repair(rot, repairs)
        retire(rot, retired_views)
        run_plan(rot)
        if opts.kind == "stop":
            stop_rest(rot)
        verify(rot)
    result.seconds = time.monotonic() - t0
    return result


def run_plan(rot: Rotation) -> None:
    """The plan's steps in order: consecutive starts on one host form a batch whose health
    checks are awaited together; warm.json is written after each batch."""
    steps = list(rot.plan.steps)
    sync_cache(rot, [s for s in steps if s.action == "start"])
    i = 0
    while i < len(steps):
        s = steps[i]
        batch = [s]
        while (
            i + len(batch) < len(steps)
            and steps[i + len(batch)].action == s.action
            and steps[i + len(batch)].host == s.host
        ):
            batch.append(steps[i + len(batch)])
        i += len(batch)
        if s.action == "start":
            start_batch(rot, s.host, batch)
            publish(rot, "joined")
        else:
            leaving = [b.model for b in batch]
            if rot.consumers:
                # The drain: trainers stop sending new requests first; what is in flight
                # finishes within stop_grace, as the server stops gracefully.
                publish(rot, "draining", {s.host: leaving})
                time.sleep(rot.orch.server.drain_s)
            rot.result.left += stop(rot, s.host, leaving)
            commit(rot, s.host)
    entry = history_entry(rot)
    for host in sorted(rot.hosts):
        commit(rot, host, entry)
    rot.result.warm = {h: list(ms) for h, ms in rot.warm.items()}
    publish(rot, "committed")
