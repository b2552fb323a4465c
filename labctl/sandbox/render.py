"""What `labctl sandbox` shows: a run's output and summary line, the bench table, the
service's state and the self-test's table."""

from __future__ import annotations

import sys
from typing import Any


def render_run(res: dict[str, Any]) -> None:
    """A program's own output, as it wrote it (stdout to stdout), then labctl's summary line."""
    from labctl.output.console import write_stdout

    write_stdout(_printable(res["stdout"], sys.stdout))
    sys.stderr.write(_printable(res["stderr"], sys.stderr))
    sys.stderr.write(summary(res) + "\n")


def _printable(text: str, stream: Any) -> str:
    """`text` as `stream` can write it: what its encoding lacks (an é on an ASCII terminal, the
    U+FFFD standing for bytes that were not UTF-8) becomes '?' instead of an error."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    return text.encode(encoding, "replace").decode(encoding, "replace")


def summary(res: dict[str, Any]) -> str:
    code = res["exit_code"]
    parts = [
        f"sandbox: {res['lang']}",
        "no exit code" if code is None else f"exit {code}",
        f"{res['wall_ms']} ms",
    ]
    if res.get("stage") == "compile":
        parts.append("compile failed")
    for flag, text in (
        ("timed_out", "timed out (killed)"),
        ("oom_killed", "out of memory (killed)"),
        ("truncated", "output truncated"),
    ):
        if res.get(flag):
            parts.append(text)
    return ", ".join(parts)


def render_bench(console: Any, doc: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(
        title=f"sandbox bench on {doc['host']} ({doc['lang']}, {doc['runs']} runs each)", title_justify="left"
    )
    for col in ("concurrency", "method", "p50 ms", "p95 ms", "p99 ms", "exec/s", "errors", "p50 speed-up"):
        table.add_column(col, justify="right" if col != "method" else "left")
    for r in doc["rows"]:
        pool, cold = r["pool"], r["docker_run"]
        ratio = cold["p50_ms"] / pool["p50_ms"] if pool["p50_ms"] else 0.0
        for name, s, extra in (("warm pool", pool, f"{ratio:.1f}x"), ("docker run --rm", cold, "")):
            table.add_row(
                str(r["concurrency"]),
                name,
                f"{s['p50_ms']:.0f}",
                f"{s['p95_ms']:.0f}",
                f"{s['p99_ms']:.0f}",
                f"{s['exec_per_s']:.1f}",
                str(s["errors"]),
                extra,
            )
    console.print(table)


def render_served(console: Any, doc: dict[str, Any], state: str) -> None:
    where = f" at {doc['url']}" if doc.get("url") else ""
    console.print(f"sandbox service on {doc['host']}: {state}{where}")
    langs = doc.get("langs") or {}
    ready = [k for k, v in sorted(langs.items()) if v == "ready"]
    if langs:
        console.print("  serving: " + (", ".join(ready) or "no language"))
    missing = [k for k, v in sorted(langs.items()) if v.startswith("no image")]
    if missing:
        build = f" (build: {doc['build']})" if doc.get("build") else ""
        console.print(f"  [yellow]not served, no image built: {', '.join(missing)}[/]{build}")
    for k, v in sorted(langs.items()):
        if k not in ready and k not in missing:
            console.print(f"  [yellow]{k}: {v}[/]")
    served = doc.get("served") or {}
    if served:
        console.print(
            f"  served: {served.get('batches', 0)} batches, {served.get('programs', 0)} programs, "
            f"{served.get('tests', 0)} tests"
        )
    for name, how in sorted((doc.get("trainers") or {}).items()):
        console.print(
            f"  {name}: {'address and token written' if how == 'ok' and state != 'stopped' else how}"
        )


def render_selftest(console: Any, doc: dict[str, Any]) -> None:
    """The self-test's table: attack → contained, with the detail; then the counts."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"sandbox selftest on {', '.join(doc['hosts'])}", title_justify="left")
    for col in ("host", "lang", "attack", "contained", "detail"):
        table.add_column(col, overflow="fold")
    for r in doc["rows"]:
        mark = {True: "[green]yes[/]", False: "[red]NO[/]", None: "[yellow]error[/]"}[r["contained"]]
        detail = str(r["detail"])
        if r.get("host_problems"):
            detail += " | left on the host: " + "; ".join(str(p) for p in r["host_problems"])
        table.add_row(str(r.get("host", "")), r["lang"], r["attack"], mark, escape(detail))
    console.print(table)
    bad = [r for r in doc["rows"] if r["contained"] is not True]
    console.print(
        f"{len(doc['rows']) - len(bad)} contained, {doc['escaped']} escaped, {len(bad) - doc['escaped']} not run"
    )
