"""What `labctl ckpt` shows (rich, on stderr), each from the same document `--json` prints."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.markup import escape
from rich.table import Table

from labctl.output.fmt import fmt_bytes


def render_list(console: Any, data: dict[str, Any]) -> None:
    listed, only_on_hosts = data["copies"], data["only_on_hosts"]
    t = Table(title=f"checkpoint library {data['storage']}:{data['library']}", title_justify="left")
    for col in ("run", "step", "size", "when", "origin"):
        t.add_column(col)
    for e in listed:
        origin = f"{e.get('origin') or '?'} from {e.get('source_host') or '?'}"
        t.add_row(
            e["run_id"],
            str(e["step"]),
            fmt_bytes(e.get("bytes") or 0),
            e.get("backed_up_at") or "?",
            origin,
        )
    for o in only_on_hosts:
        t.add_row(
            o["run_id"],
            str(o["step"]),
            fmt_bytes(o.get("bytes") or 0),
            "-",
            f"[yellow]only on {o['host']}[/]",
        )
    console.print(t)
    for d in data["damaged_on_hosts"]:
        console.print(
            f"[yellow]warning:[/] step {d['step']} of {escape(d['run_id'])} on {d['host']} is damaged "
            f"({escape(str(d['reason']))}); backup takes that host's newest valid one instead.",
            soft_wrap=True,
        )
    if not listed and not only_on_hosts:
        console.print("Nothing yet: `labctl ckpt backup` copies each run's newest checkpoint here.")


def render_backup(console: Any, data: dict[str, Any], check: bool) -> None:
    for r in data["runs"]:
        what = r["action"]
        step = f" step {r['step']}" if "step" in r else ""
        line = f"{escape(r['run_id'])}{step}: {what}"
        if what in ("copied", "replaced"):
            line += f" from {r['source_host']} ({fmt_bytes(r.get('fetched_bytes') or 0)} moved"
            line += f", {fmt_bytes(r['resumed_bytes'])} resumed)" if r.get("resumed_bytes") else ")"
            if r.get("damaged"):
                line += f"; the damaged copy ({escape(r['damaged'])}) is gone"
        elif what == "would replace":
            line += f" from {r['source_host']} (the library's copy is damaged: {escape(r['damaged'])})"
        elif what == "damaged":
            line = f"[red]{line}[/] ({escape(r['path'])}): {escape(r['damaged'])}. {escape(r['hint'])}"
        elif what == "failed":
            line = f"[red]{line}[/]: {escape(r.get('error') or '')}"
            if r.get("damaged"):
                line += f" (the library's copy is damaged: {escape(r['damaged'])})"
            if r.get("hint"):
                line += f" {escape(r['hint'])}"
        elif what == "nothing":
            line += " (no valid checkpoint on its hosts)"
        elif what == "superseded":
            line += f" (its checkpoint folder is {escape(r['by'])}'s now; that run is backed up)"
        console.print(line, soft_wrap=True)
    for p in data["pruned"]:
        verb = "would prune" if check else "pruned"
        console.print(f"{verb} {escape(p['run_id'])} step {p['step']}")
    # A run that failed for want of a valid checkpoint said so in its error already.
    for w in data["warnings"]:
        if w["instead"] is not None:
            console.print(f"[yellow]warning:[/] {escape(w['text'])}", soft_wrap=True)


def render_verify(console: Any, data: dict[str, Any]) -> None:
    entries, damaged, removed = data["entries"], data["damaged"], data["removed"]
    for e in entries:
        where = f"{escape(e['run_id'])} step {e['step']}"
        if e["status"] == "ok":
            console.print(f"ok       {where}")
        elif e["status"] == "removed":
            console.print(f"removed  {where} ({escape(e['path'])}): {escape(e['reason'] or '')}")
        else:
            console.print(
                f"[red]damaged[/]  {where} ({escape(e['path'])}): {escape(e['reason'] or '')}. "
                f"{escape(e['hint'])}",
                soft_wrap=True,
            )
    tail = f", {len(removed)} damaged removed" if removed else ""
    console.print(f"{len(entries)} copies checked on {data['storage']}, {len(damaged)} damaged{tail}.")


def render_restore(console: Any, data: dict[str, Any]) -> None:
    console.print(
        f"restored {data['run_id']} step {data['step']} to {data['host']}:{data['dir']} "
        f"({fmt_bytes(data['fetched_bytes'])} moved from {data['from']}); a run with that checkpoint "
        "folder resumes from it.",
        soft_wrap=True,
    )


def render_pull(console: Any, out: dict[str, Any], check: bool) -> None:
    new = sum(1 for p in out["checkpoints"] if p["action"] != "present")
    console.print(
        f"[green]{escape(out['run_id'])}[/]: {new} checkpoint(s) {'would be ' if check else ''}pulled into "
        f"{escape(out['storage'])}:{escape(out['library'])}, {len(out['checkpoints']) - new} already there.",
        soft_wrap=True,
    )


def _note(console: Any, text: str) -> None:
    console.print(escape(text), soft_wrap=True)


def _in_library(console: Any, run_id: str, step: int, host: str) -> None:
    _note(console, f"{run_id} step {step}: already in {host}'s library")


def _would_send(console: Any, run_id: str, step: int, damaged: bool, bytes: int, path: str) -> None:
    verb = "would replace the damaged copy" if damaged else "would commit"
    _note(console, f"{run_id} step {step}: {verb} ({bytes} bytes to send) at {path}")


def _committed(
    console: Any, run_id: str, step: int, action: str, path: str, host: str, replaced: str | None
) -> None:
    was = f" (the copy there was damaged: {replaced})" if replaced else ""
    _note(console, f"{run_id} step {step}: {action} {'at' if was else 'to'} {path} on {host}{was}")


def _exported(console: Any, model: str, step: int) -> None:
    _note(console, f"{model}: the weights of step {step} exported as safetensors")


def _model_present(console: Any, name: str, host: str) -> None:
    _note(console, f"{name}: already in {host}'s model library")


def _model_published(console: Any, name: str, host: str, path: str) -> None:
    _note(console, f"{name}: in {host}'s model library at {path} (labctl cache sync {name} fills a cache)")


# How `ckpt pull` shows labctl.ckpt.pull's progress events: each one line.
PULL_PROGRESS: dict[str, Callable[..., None]] = {
    "in library": _in_library,
    "would send": _would_send,
    "committed": _committed,
    "exported": _exported,
    "model present": _model_present,
    "model published": _model_published,
}
