"""`labctl facts`: what each host really has, in one round trip per host."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from labctl.cli.common import InventoryOpt, JsonOpt, LimitOpt, VerboseOpt
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context


def facts(
    ctx: typer.Context,
    limit: LimitOpt = None,
    torch: Annotated[
        bool, typer.Option("--torch/--no-torch", help="Import torch on hosts to report its versions.")
    ] = True,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """CPU, RAM, GPUs, NICs and bonds, mounts, Python, torch/CUDA/NCCL and Docker per host.

    labctl's agent runs on each host with the host's own Python (shipped there once and
    cached by hash; nothing to install by hand). Where the inventory declares GPUs or RAM
    that the host does not have, the difference is flagged.

    Examples:

        labctl facts

        labctl facts --limit role:train --json | jq '.results[].facts.gpus'
    """
    from labctl.facts.collect import gather_facts
    from labctl.hosts.fanout import exit_code
    from labctl.hosts.recap import print_recap
    from labctl.inventory.select import select_hosts

    def work(c: Context) -> Outcome:
        results = gather_facts(c, select_hosts(c.inventory, limit), torch=torch)
        out = []
        for r in results:
            d = r.to_json()
            d["facts"] = d.pop("data")
            for k in ("stdout", "stderr", "rc"):
                d.pop(k, None)
            out.append(d)

        def render() -> None:
            _render(c.console, [r for r in results if r.ok and r.data])
            print_recap(c.console, results, title="facts")

        return Outcome({"results": out}, render, exit_code(results))

    run_command(ctx, work, inventory, json_out, verbose)


def _gib(n: Any) -> str:
    # Memory in GiB, as the OS and nvidia-smi count it and as the inventory's memory_gb/ram_gb
    # mean it: a 32 GB V100 shows 32.0, not 34.4.
    return f"{n / (1 << 30):.1f}" if isinstance(n, (int, float)) else "?"


def _render(console: Any, results: list[Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="facts", title_justify="left")
    for col in ("host", "os", "cpus", "RAM GiB (free)", "GPUs", "NICs", "python / torch", "docker"):
        table.add_column(col, overflow="fold")
    for r in results:
        f = r.data
        osf, cpu, mem = f.get("os", {}), f.get("cpu", {}), f.get("memory", {})
        gpus = f.get("gpus")
        if isinstance(gpus, list):
            gpu_txt = "\n".join(
                f"{g.get('name')} {_gib(g.get('memory_total_bytes'))} GiB cc{g.get('compute_capability')}"
                for g in gpus
            )
        else:
            gpu_txt = "[red]error[/]"
        nics = f.get("nics")
        nic_txt = "\n".join(
            f"{n.get('name')} {n.get('speed_mbps') or '?'}M {n.get('operstate')}"
            + (f" {(n.get('bond') or {}).get('mode')}" if n.get("is_bond") else "")
            + (f" >{n.get('master')}" if n.get("master") else "")
            for n in (nics if isinstance(nics, list) else [])
        )
        dist = osf.get("distro") or {}
        distro = (
            f"{dist.get('id')} {dist.get('version_id') or ''}".strip()
            if dist.get("id")
            else osf.get("system", "?")
        )
        t = f.get("torch", {})
        torch_txt = (
            f"torch {t.get('version')}" + (f" cuda {t['cuda']}" if t.get("cuda") else "")
            if t.get("version")
            else "no torch"
        )
        d = f.get("docker", {})
        docker_txt = d.get("server_version") or ("cli" if d.get("cli") else "no")
        table.add_row(
            r.host,
            escape(str(distro)),
            str(cpu.get("logical_cpus", "?")),
            f"{_gib(mem.get('total_bytes'))} ({_gib(mem.get('available_bytes'))})",
            gpu_txt or "none",
            nic_txt or "-",
            f"{f.get('python', {}).get('version', '?')}\n{torch_txt}",
            str(docker_txt),
        )
    console.print(table)
    for r in results:
        for m in r.extra.get("mismatches") or []:
            console.print(f"[yellow]! {r.host}:[/] {escape(m)}", soft_wrap=True)
