"""The human view of `bench network`: a table per stream count, the link, why, and the seed's figure."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


def _share(v: float | None) -> str:
    return f"{100 * v:.0f}%" if v is not None else "-"


def render_network(console: Console, report: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    link = report["link"]
    t = Table(
        title=f"network: {report['from']} → {report['to']} ({report['address']}), "
        f"{report['seconds']:g} s per stream count",
        title_justify="left",
    )
    for col in ("streams", "Mbit/s", "share of link", "per stream Mbit/s", "48 GB at this rate"):
        t.add_column(col, justify="right")
    for r in report["runs"]:
        t.add_row(
            str(r["streams"]),
            f"{r['mbps']:.0f}",
            _share(r["share"]),
            " / ".join(f"{x:.0f}" for x in r["per_stream_mbps"]),
            f"{r['seconds_48gb']:.0f} s" if r.get("seconds_48gb") else "-",
        )
    console.print(t)
    ends = "; ".join(escape(e["text"]) for e in link["ends"])
    if link["mbps"]:
        console.print(f"link: {link['mbps']} Mbit/s, the slower end ({ends})", soft_wrap=True)
    else:
        console.print(
            f"link: speed unknown, so no share ({ends}). Declare it in the inventory: "
            "nics: [{name: NIC, speed_mbps: 1000}]",
            soft_wrap=True,
        )
    console.print(f"why: {escape(report['explanation'])}", soft_wrap=True)
    seed, best = report["seed"], report["best"]
    if best and seed["seconds_at_best"]:
        console.print(
            f"the lab's 48 GB model at the best rate ({best['mbps']:.0f} Mbit/s, {best['streams']} "
            f"stream{'s' if best['streams'] != 1 else ''}): [bold]{seed['seconds_at_best']:.0f} s[/] "
            f"(the lab's plan: {seed['seed_seconds_1g']:.0f} s over 1 Gb, {seed['seed_seconds_bonded']:.0f} s bonded)",
            soft_wrap=True,
        )


def _listening(console: Console, receiver: str, address: str | None, port: int, sender: str) -> None:
    console.print(f"[dim]{receiver} listening on {address}:{port}; {sender} sends[/]", soft_wrap=True)


def _rate(console: Console, streams: int, bits_per_s: float) -> None:
    console.print(f"[dim]{streams} stream(s): {bits_per_s / 1e6:.0f} Mbit/s[/]", soft_wrap=True)


def _measured(console: Console, seconds: float) -> None:
    console.print(f"[dim]measured in {seconds:.1f} s[/]", soft_wrap=True)


# How `bench network` shows measure_network's progress events: each one dim line.
NETWORK_PROGRESS: dict[str, Callable[..., None]] = {
    "listening": _listening,
    "rate": _rate,
    "measured": _measured,
}
