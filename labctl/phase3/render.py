"""What `labctl bench phase3` shows (rich, on stderr), from the document `--json` prints."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def render_phase3(console: Any, doc: dict[str, Any]) -> None:
    from rich.table import Table

    if "cycle" in doc:
        t = Table(title="orchestra cycle (s, median)", title_justify="left")
        for col in ("k models", "one after another", "at once", "slowest alone", "speed-up"):
            t.add_column(col, justify="right")
        for r in doc["cycle"]:
            t.add_row(
                str(r["k"]),
                f"{r['one_after_another_s']:.3f}",
                f"{r['at_once_s']:.3f}",
                f"{r['slowest_alone_s']:.3f}",
                f"{r['one_after_another_s'] / r['at_once_s']:.2f}x",
            )
        console.print(t)
    if "sandbox" in doc:
        sb = doc["sandbox"]
        t = Table(
            title=f"sandbox executions on {sb['host']} ({sb['tests_per_program']} tests per program)",
            title_justify="left",
        )
        for col in ("method", "exec/s", "against docker run --rm"):
            t.add_column(col, justify="right" if col != "method" else "left")
        base = sb["docker_run"]["exec_per_s"] or 0.0
        for name, rate in (
            ("sandbox service", sb["service"]["exec_per_s"]),
            ("warm pool, a container per execution", sb["pool"]["exec_per_s"]),
            ("docker run --rm", base),
        ):
            t.add_row(name, f"{rate:.1f}", f"{rate / base:.1f}x" if base else "-")
        console.print(t)
        if sb["service"]["failed"]:
            console.print(f"[red]{sb['service']['failed']} reference tests failed in the service[/]")
    if "training" in doc:
        tr = doc["training"]
        ratio = tr["inside_over_outside"]
        console.print(
            f"training: {tr['steps']} steps, {tr['steps_inside']} inside the rotation's {tr['window_s']:.1f} s window; "
            f"steps/s inside {tr['steps_per_s_inside']} vs outside {tr['steps_per_s_outside']}"
            + (f" ({ratio:.0%})" if ratio is not None else "")
            + f"; failed steps {tr['failed_steps']}, answers retried {tr['answers_retried']}, "
            f"rotation wait {tr['rotation_wait_s']:.2f} s"
            + (f"; mean reward {tr['reward']:.3f}" if tr.get("reward") is not None else "")
        )
    if "learning" in doc:
        _render_learning(console, doc["learning"])


def _render_learning(console: Any, lr: dict[str, Any]) -> None:
    from rich.table import Table

    t = Table(
        title=f"reward per step: {', '.join(lr['tasks'])} against {', '.join(lr['models'])}",
        title_justify="left",
    )
    t.add_column("steps", justify="right")
    t.add_column("rewards", justify="left")
    rewards = lr["rewards"]
    for i in range(0, len(rewards), 10):
        row = rewards[i : i + 10]
        t.add_row(f"{i + 1}-{i + len(row)}", "  ".join("-" if r is None else f"{r:.2f}" for r in row))
    console.print(t)
    first, last, w = lr["first_mean"], lr["last_mean"], lr["window"]
    console.print(
        f"mean reward of the first {w} steps {'-' if first is None else f'{first:.3f}'}, "
        f"of the last {w} {'-' if last is None else f'{last:.3f}'}"
        + (f" ({lr['ratio']:.2f}x)" if lr["ratio"] is not None else "")
        + (
            f"; twice the start by step {lr['doubled_at_step']}"
            if lr["doubled_at_step"]
            else "; never twice the start"
        )
        + f"; a policy loss on {lr['policy_loss_steps']} of {lr['steps']} steps"
    )
    if lr["other_models"]:
        console.print(
            f"[yellow]also warm, passing whatever the CET writes: {', '.join(lr['other_models'])} "
            "(the reward's floor)[/]"
        )


def _said(console: Any, text: str) -> None:
    # Not escaped and not soft-wrapped: as `bench phase3` has always printed these.
    console.print(f"[dim]{text}[/]")


_PARTS = {
    "cycle": "the orchestra cycle, k = 1 .. warm models",
    "sandbox": "sandbox executions through the service, then docker run --rm and the pool",
    "training": "a phase-3 run with a rotation in its middle",
    "learning": "learning: a phase-3 run against a warm coder model whose hint matters",
}


def _measuring(console: Any, part: str) -> None:
    _said(console, _PARTS[part])


def _rotating(console: Any, step: int) -> None:
    _said(console, f"step {step} logged: rotating now")


def _learning(console: Any, tasks: list[str], coders: list[str], others: list[str]) -> None:
    _said(
        console,
        f"learning: {len(tasks)} tasks {', '.join(tasks)} against {', '.join(coders)}"
        + (f" (also warm, whatever the hint: {', '.join(others)})" if others else ""),
    )


def _left_behind(console: Any, folder: str, hosts: list[tuple[str, Any]]) -> None:
    _said(
        console,
        f"{folder} is left on "
        + ", ".join(f"{h} ({error})" for h, error in hosts)
        + ": remove it there by hand",
    )


# How `bench phase3` shows its events: each one dim line.
PHASE3_PROGRESS: dict[str, Callable[..., None]] = {
    "measuring": _measuring,
    "rotating": _rotating,
    "learning": _learning,
    "left behind": _left_behind,
}
