"""What `labctl bench model-load` and `bench make-model` show (rich, on stderr)."""

from __future__ import annotations

from typing import Any

from labctl.modelload.stages import Stage


def render_load(console: Any, result: dict[str, Any], plot: Any) -> None:
    """`bench model-load`: the stages' table, then where the chart went (--plot)."""
    render_table(console, result)
    if plot:
        console.print(f"chart: {plot}")


def render_table(console: Any, result: dict[str, Any]) -> None:
    """The model-load stages, each against its ceiling and the seed's figure."""
    from rich.table import Table

    t = Table(
        title=f"model load: {result['model']} ({result['bytes'] / 1e9:.2f} GB) on {result['host']} {result['device']}",
        title_justify="left",
    )
    for col in ("stage", "seconds", "GB/s", "ceiling GB/s", "% of ceiling", "seed, scaled", "note"):
        t.add_column(col, justify="left" if col in ("stage", "note") else "right")
    for s in result["stages"]:
        st = Stage(**s)
        if st.skipped:
            t.add_row(st.name, "-", "-", "-", "-", _f(st.seed_seconds, "s"), f"[dim]skipped: {st.skipped}[/]")
            continue
        t.add_row(
            st.name,
            _f(st.seconds, ""),
            _f(st.gbps, ""),
            _f(st.ceiling_gbps, ""),
            f"{st.pct_of_ceiling:.0f}%" if st.pct_of_ceiling is not None else "-",
            _f(st.seed_seconds, "s"),
            st.ceiling or "",
        )
    console.print(t)
    sp = result.get("speedup_ram_vs_network")
    if sp:
        console.print(
            f"RAM cache path vs network transfer: [bold]{sp:.1f}x[/] faster "
            "(seed: 384 s over 1 Gb against ~6 s from RAM to GPU; 14x for the whole load with init)"
        )


def _f(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}{unit}" if v < 10 else f"{v:.1f}{unit}"


def render_made(console: Any, results: list[Any], host: str, kind: str) -> None:
    """`bench make-model`: where the model was written; for a coder, what it was trained on."""
    r = results[0]
    if r.ok:
        d = r.data
        console.print(
            f"[green]wrote[/] {host}:{d['path']} ({d['bytes'] / 1e9:.2f} GB in {d['seconds']:.1f} s)"
        )
        if kind == "coder":
            console.print(
                f"trained on {', '.join(d['trained'])} ({d['steps']} steps, final loss {d['final_loss']:g}"
                + (", hint must hold the task's tag" if d["hint_matters"] else "")
                + f"); held out: {', '.join(d['held_out']) or 'none'}"
            )
    else:
        from labctl.hosts.recap import print_recap

        print_recap(console, results, title="make-model")
