"""Who leaves the warm set, who joins it, and in which order servers start and stop.

Pure functions over names and placements: the rotation (labctl/orchestra/rotate.py) reads the
state from the serving hosts, asks these what to do, and does it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from labctl.documents.suggest import LEADING, did_you_mean
from labctl.orchestra.place import EPS, GpuKey, Placement
from labctl.output.errors import InputError

Mode = Literal["make-before-break", "break-before-make", "move"]


@dataclass
class Choice:
    leaving: list[str]  # stale ones (no longer in the library), named --out, then the oldest
    joining: list[str]  # missing pinned ones, named --in, then the library's order after the cursor
    warm_after: list[str]  # the warm set once done: those staying, then the joining ones
    cursor: str | None  # what warm.json's cursor becomes: the last model that joined by order
    why: dict[str, str] = field(default_factory=dict)  # model → why it leaves or joins

    def as_dict(self) -> dict[str, Any]:
        return {
            "leaving": list(self.leaving),
            "joining": list(self.joining),
            "warm_after": list(self.warm_after),
            "cursor": self.cursor,
            "why": dict(self.why),
        }


def _unknown(name: str, known: Sequence[str], what: str) -> InputError:
    hint = did_you_mean(name, known, form=LEADING)
    return InputError(
        f"{what} '{name}' is not a model of the orchestra's library.",
        f"{hint}Name one of: {', '.join(known)} (the models: list of the orchestra file).",
    )


def _dedupe(names: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(names))


def choose(
    library: Sequence[str],
    pinned: Sequence[str],
    warm: int,
    rotate: int,
    current: Sequence[Mapping[str, Any]],
    cursor: str | None = None,
    out: Sequence[str] = (),
    in_: Sequence[str] = (),
) -> Choice:
    """The next rotation of the warm set.

    `library`: the models in the orchestra file's order; `current`: the warm models as
    warm.json has them ({"name", "since": epoch when it joined}); `cursor`: the last model that
    joined by order. Without --in/--out, `rotate` models swap; with them, as many as named on
    the longer side, the other side chosen as usual. Leaving: models no longer in the library,
    then those named with `out`, then the least recently rotated in (oldest `since`), never a
    pinned one, plus enough to bring the set back down to `warm`. Joining: pinned models not
    warm, those named with `in_`, then the next in the library's order after the cursor
    (wrapping, skipping warm ones), enough to bring the set back to `warm`. An empty `current`
    is a first start: pinned models, then `in_`, then the library's first, up to `warm`.
    """
    lib_index = {n: i for i, n in enumerate(library)}
    pinned = _dedupe([p for p in pinned if p in lib_index])
    out = _dedupe(out)
    in_ = _dedupe(in_)
    cur = [dict(c) for c in current]
    warm_names = _dedupe([str(c["name"]) for c in cur])
    for name in out:
        if name not in lib_index and name not in warm_names:
            raise _unknown(name, library, "--out")
        if name in pinned:
            raise InputError(
                f"--out {name}: it is pinned, and pinned models never leave the warm set.",
                "Unpin it first (remove it from pinned: in the orchestra file), or name another model.",
            )
        if name not in warm_names:
            raise InputError(
                f"--out {name}: it is not warm, so it cannot leave.",
                f"Warm now: {', '.join(warm_names) or 'none'} (labctl orchestra status).",
            )
    for name in in_:
        if name not in lib_index:
            raise _unknown(name, library, "--in")
        if name in warm_names and name not in out:
            raise InputError(
                f"--in {name}: it is already warm.",
                "Name a model that is not warm (labctl orchestra status shows the warm set), "
                "or let the rotation choose.",
            )
    why: dict[str, str] = {}

    if not warm_names:
        picked: list[str] = []
        for name in pinned:
            picked.append(name)
            why[name] = "pinned"
        for name in in_:
            if name not in picked:
                picked.append(name)
                why[name] = "named with --in"
        if len(picked) > warm:
            raise InputError(
                f"{len(picked)} models must be warm ({', '.join(picked)}) but the warm set holds {warm}.",
                "Name fewer with --in, or raise warm: in the orchestra file.",
            )
        new_cursor = cursor
        for name in library:
            if len(picked) >= warm:
                break
            if name not in picked:
                picked.append(name)
                why[name] = "first start: the library's order"
                new_cursor = name
        return Choice([], picked, list(picked), new_cursor, why)

    stale = [n for n in warm_names if n not in lib_index]
    for n in stale:
        why[n] = "no longer in the library"
    for n in out:
        why[n] = "named with --out"
    staying = [n for n in warm_names if n in lib_index]
    since = {str(c["name"]): float(c.get("since") or 0) for c in cur}
    pool = sorted(
        (n for n in staying if n not in pinned and n not in out),
        key=lambda n: (since.get(n, 0.0), lib_index[n]),
    )
    missing_pinned = [p for p in pinned if p not in warm_names]
    size = max(len(out), len(in_)) if (out or in_) else rotate
    excess = max(0, len(staying) - warm)
    must_join = len(missing_pinned) + len([n for n in in_ if n not in missing_pinned])
    in_order = _after_cursor(library, cursor, set(warm_names) | set(in_) | set(missing_pinned))
    if must_join > warm:
        raise InputError(
            f"{must_join} models would have to join ({', '.join(_dedupe([*missing_pinned, *in_]))}) "
            f"but the warm set holds {warm}.",
            "Name fewer with --in (pinned models that are not warm join first), or raise warm: in the "
            "orchestra file.",
        )

    n_auto = max(0, size - len(out)) + excess
    swapped = n_auto
    kept = len([n for n in staying if n not in out])
    # Room for the models that must join (pinned ones first, then --in).
    n_auto = max(n_auto, must_join - (warm - kept))
    n_auto = min(n_auto, len(pool))
    needed = warm - (kept - n_auto)
    available = must_join + len(in_order)
    if needed > available:  # a small library: fewer leave, so the set stays at warm
        n_auto = max(min(excess, len(pool)), n_auto - (needed - available))
        needed = warm - (kept - n_auto)
    auto = pool[:n_auto]
    making_room = _dedupe([*missing_pinned, *in_])
    for i, n in enumerate(auto):
        if excess and n in pool[:excess]:
            why[n] = "over the warm size"
        elif i < swapped:
            why[n] = "least recently rotated in"
        else:  # `orchestra start` swaps none but must still make room for a pinned model
            why[n] = f"least recently rotated in, leaving room for {', '.join(making_room)}"
    leaving = _dedupe([*stale, *out, *auto])

    joining: list[str] = []
    for name in missing_pinned:
        joining.append(name)
        why[name] = "pinned, not warm"
    for name in in_:
        if name not in joining:
            joining.append(name)
            why[name] = "named with --in"
    new_cursor = cursor
    for name in in_order:
        if len(joining) >= needed:
            break
        joining.append(name)
        why[name] = "next in the library's order"
        new_cursor = name
    if out and len(joining) < needed:
        raise InputError(
            f"--out {' '.join(out)}: no model of the library is left to take "
            f"{'its' if len(out) == 1 else 'their'} place (every other one is warm), so the warm set "
            f"would drop below {warm}.",
            "Add models to the library (models: in the orchestra file), or lower warm:.",
        )
    warm_after = [n for n in warm_names if n not in leaving] + joining
    return Choice(leaving, joining, warm_after, new_cursor, why)


def _after_cursor(library: Sequence[str], cursor: str | None, skip: set[str]) -> list[str]:
    """The library from just after `cursor` round to it (from the start without one), minus `skip`."""
    start = library.index(cursor) + 1 if cursor in library else 0
    ring = [*library[start:], *library[:start]]
    return [n for n in ring if n not in skip]


@dataclass(frozen=True)
class Step:
    action: Literal["start", "stop"]
    model: str
    host: str
    gpu: int
    mode: Mode  # make-before-break: with the leavers still loaded; break-before-make: after them

    def as_tuple(self) -> tuple[Any, ...]:
        if self.action == "start":
            return ("start", self.model, self.host, self.gpu)
        return ("stop", self.model, self.host)

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "model": self.model,
            "host": self.host,
            "gpu": self.gpu,
            "mode": self.mode,
        }


def order_steps(before: Placement, after: Placement) -> list[Step]:
    """The starts and stops that turn `before` into `after`, in order.

    A joining model starts first, beside the leaving ones, where its GPU has room for both
    (make-before-break); where it has not, the leaving models of that GPU stop first, largest
    first and only as many as needed, then it starts (break-before-make). The make-before-break
    starts all come first, so the warm set is never smaller than the break-before-make pairs
    force. A model whose GPU changed stops, then starts on its new GPU ("move"). The leaving
    models not stopped by then stop last.
    """
    memory: dict[GpuKey, float] = {}
    for r in [*before.rows, *after.rows]:
        memory[r.gpu.key] = r.gpu.memory_gb
    used: dict[GpuKey, float] = {k: 0.0 for k in memory}
    loaded: dict[str, GpuKey] = {}
    for name, gpu in before.where.items():
        used[gpu.key] += before.needs[name]
        loaded[name] = gpu.key
    leavers = [n for n in before.where if n not in after.where]
    movers = [n for n in after.where if n in before.where and before.where[n].key != after.where[n].key]
    joiners = [n for n in after.where if n not in before.where]
    steps: list[Step] = []

    def start(name: str, mode: Mode) -> None:
        key = after.where[name].key
        used[key] += after.needs[name]
        loaded[name] = key
        steps.append(Step("start", name, key[0], key[1], mode))

    def stop(name: str, mode: Mode) -> None:
        key = loaded.pop(name)
        used[key] -= before.needs[name]
        steps.append(Step("stop", name, key[0], key[1], mode))

    pending: list[str] = []
    for name in joiners:
        key = after.where[name].key
        if used[key] + after.needs[name] <= memory[key] + EPS:
            start(name, "make-before-break")
        else:
            pending.append(name)
    for name in [*movers, *pending]:
        key = after.where[name].key
        if name in movers:
            stop(name, "move")
        while used[key] + after.needs[name] > memory[key] + EPS:
            here = sorted((n for n in leavers if loaded.get(n) == key), key=lambda n: (-before.needs[n], n))
            if not here:
                raise InputError(
                    f"Cannot start {name} on {after.where[name].label}: the models staying there leave it "
                    "too little memory.",
                    "Plan again (labctl orchestra plan): the placement and the warm state disagree.",
                )
            stop(here[0], "break-before-make")
        start(name, "move" if name in movers else "break-before-make")
    for name in leavers:
        if name in loaded:
            stop(name, "make-before-break")
    return steps


class _Action(Protocol):
    @property
    def action(self) -> str: ...


def lowest_warm(before_count: int, steps: Sequence[_Action]) -> int:
    """The fewest models loaded at any point while `steps` run from `before_count` loaded."""
    n = low = before_count
    for s in steps:
        n += 1 if s.action == "start" else -1
        low = min(low, n)
    return low
