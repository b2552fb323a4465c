"""What a killed rotation left, repaired before anything else happens, and hosts that no longer
serve the orchestra emptied (`retire`); `left_behind` names what labctl cannot reach."""

from __future__ import annotations

import shlex
import time
from typing import TYPE_CHECKING, Any

from labctl.orchestra.steps.commit import commit
from labctl.orchestra.steps.state import Rotation
from labctl.orchestra.steps.stop import stop

if TYPE_CHECKING:
    from labctl.orchestra.hoststate import HostView, Repair
    from labctl.orchestra.spec import Orchestra


def repair(rot: Rotation, repairs: dict[str, Repair]) -> None:
    """Each host's warm list set to what answers; orphan servers stopped; warm.json rewritten
    (with a repair entry) where anything needed repair."""
    for host, rep in repairs.items():
        rot.warm[host] = [dict(m) for m in rep.current]
        if rep.orphans:
            stop(rot, host, [], pids=[int(s["pid"]) for s in rep.orphans])
        if rep.needed:
            notes = rep.notes()
            rot.result.repairs += notes
            for n in notes:
                rot.progress.event("repaired", note=n)
            commit(rot, host, {"at": time.time(), "kind": "repair", "notes": notes, "ok": True})


def retire(rot: Rotation, views: dict[str, HostView]) -> None:
    """Hosts that no longer serve the orchestra: every server of this lab there stopped, their
    warm.json emptied (phase 3 reads it), what was done noted."""
    for host, view in sorted(views.items()):
        if not view.servers and not view.warm_models:
            continue
        if view.servers:
            stop(rot, host, [], ())
        note = retire_note(host, view, rot.orch)
        rot.result.repairs.append(note)
        rot.progress.event("repaired", note=note)
        commit(rot, host, {"at": time.time(), "kind": "repair", "notes": [note], "ok": True})


def retire_note(host: str, view: HostView, orch: Orchestra, dry_run: bool = False) -> str:
    servers = ", ".join(f"{s['model']} (pid {s['pid']}, port {s.get('port')})" for s in view.servers)
    what = (
        f"{'would stop' if dry_run else 'stopped'} its servers: {servers}"
        if servers
        else "none of its servers run"
    )
    return (
        f"{host}: no longer one of the orchestra's hosts (hosts: {orch.hosts}), but its warm.json was "
        f"this orchestra's; {what}, warm.json emptied"
    )


def left_behind(
    removed: dict[str, dict[str, Any]], lab: str, unreachable: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Pure: for each host the last commit named that labctl cannot reach now (gone from the
    inventory, or in `unreachable`: {name: why}), what it ran by warm.json's record and the
    command that stops it there."""
    unreachable = unreachable or {}
    out: list[dict[str, Any]] = []
    for name, record in sorted(removed.items()):
        models = [
            m for m in record.get("models") or [] if isinstance(m, dict) and isinstance(m.get("pid"), int)
        ]
        if record and not models:
            continue  # it ran nothing of this orchestra at the last commit
        if name in unreachable:
            where = f"{name}: no longer one of the orchestra's hosts and labctl cannot reach it ({unreachable[name]})"
            kill = "kill -TERM " + " ".join(f"-{int(m['pid'])}" for m in models)
            command = f"labctl exec -l {name} -- {kill}"
        else:
            where = f"{name}: no longer in the inventory, so labctl cannot reach it"
            address, user, port = (
                record.get("address"),
                record.get("user") or "root",
                record.get("port") or 22,
            )
            target = f"{user}@{address}" if address else name
            kill = shlex.quote("kill -TERM " + " ".join(f"-{int(m['pid'])}" for m in models))
            command = f"ssh {'' if port == 22 else f'-p {int(port)} '}{target} {kill}"
        if models:
            listed = ", ".join(f"{m.get('name')} (pid {m['pid']}, port {m.get('port')})" for m in models)
            note = (
                f"{where}, but it ran servers of lab {lab} at the last rotation: {listed}; left behind. "
                f"Stop them there: `{command}`"
            )
            out.append({"host": name, "models": models, "command": command, "note": note})
        else:
            note = f"{where}; it served the orchestra before: if servers of lab {lab} still run there, stop them on the host"
            out.append({"host": name, "models": [], "command": None, "note": note})
    return out
