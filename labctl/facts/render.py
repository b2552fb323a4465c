"""What `labctl facts` shows (rich, on stderr)."""

from __future__ import annotations

from typing import Any


def _gib(n: Any) -> str:
    # Memory in GiB, as the OS and nvidia-smi count it and as the inventory's memory_gb/ram_gb
    # mean it: a 32 GB V100 shows 32.0, not 34.4.
    return f"{n / (1 << 30):.1f}" if isinstance(n, (int, float)) else "?"


def render_facts(console: Any, results: list[Any]) -> None:
    """The facts table, one row per host that answered, then each mismatch with the inventory."""
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
