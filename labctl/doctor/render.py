"""Doctor's report for a person: one line per check, host by host, then the lab-wide lines."""

from __future__ import annotations

from typing import Any

from labctl.doctor.model import FAIL, PASS, WARN, Line

STYLE = {PASS: "green", WARN: "yellow", FAIL: "red"}


def summary(lines: list[Line]) -> dict[str, int]:
    return {s: sum(1 for x in lines if x.status == s) for s in (PASS, WARN, FAIL)}


def to_json(lines: list[Line], tier: str | None) -> dict[str, Any]:
    return {"tier": tier, "summary": summary(lines), "lines": [x.to_json() for x in lines]}


def render(console: Any, lines: list[Line]) -> None:
    from rich.markup import escape

    width = max((len(x.host or "lab") for x in lines), default=3)
    for x in lines:
        where = f"{x.host or 'lab':<{width}}"
        console.print(
            f"[{STYLE[x.status]}]{x.status:<4}[/] {escape(where)}  [bold]{escape(x.check)}[/]: {escape(x.found)}",
            soft_wrap=True,
        )
        if x.fix and x.status != PASS:
            console.print(f"     {' ' * width}  fix: {escape(x.fix)}", soft_wrap=True)
    n = summary(lines)
    console.print(f"doctor: {n[PASS]} pass, {n[WARN]} warn, {n[FAIL]} fail")
