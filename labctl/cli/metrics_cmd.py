"""`labctl metrics`: the lab's status and alerts for Prometheus (node_exporter's textfile, or /metrics)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from labctl.cli.common import InventoryOpt, JsonOpt, LimitOpt, VerboseOpt, positive
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context


def metrics(
    ctx: typer.Context,
    textfile: Annotated[
        Optional[Path],
        typer.Option(
            "--textfile",
            help="Write DIR/labctl.prom once, atomically, for node_exporter's textfile collector.",
            metavar="DIR",
            show_default=False,
        ),
    ] = None,
    serve: Annotated[
        Optional[str],
        typer.Option(
            "--serve",
            help="Serve /metrics at ADDR:PORT until Ctrl-C (PORT alone: 127.0.0.1).",
            metavar="ADDR:PORT",
            show_default=False,
        ),
    ] = None,
    cache_seconds: Annotated[
        float,
        typer.Option(
            "--cache-seconds",
            callback=positive,
            help="With --serve: scrapes closer together than this share one collection.",
        ),
    ] = 5.0,
    alerts: Annotated[
        Optional[Path],
        typer.Option(
            "--alerts",
            help="Alert rules. Default: playbooks/alerts.yaml beside the inventory, else labctl's defaults.",
            show_default=False,
        ),
    ] = None,
    limit: LimitOpt = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Export every host's CPU, RAM, model cache, GPUs, warm models, training runs and firing
    alerts as Prometheus series named `labctl_*` (per-GPU series follow the DCGM exporter's names).

    `--textfile` suits the `cron` resource: node_exporter picks the file up on its next scrape.
    A host that does not answer is exported as `labctl_host_up 0` and the command exits 1.
    A Grafana dashboard for these series is in docs/grafana/labctl.json.

    Examples:

        labctl metrics --textfile /var/lib/prometheus/node-exporter

        labctl metrics --serve 9835

        labctl metrics --serve 10.0.0.2:9835 --limit role:train
    """
    from labctl.monitor import metrics as m
    from labctl.output.errors import InputError

    if (textfile is None) == (serve is None):
        raise InputError(
            "labctl metrics needs exactly one of --textfile DIR or --serve ADDR:PORT.",
            "--textfile writes the file node_exporter reads; --serve answers Prometheus's scrapes itself.",
        )
    # every input checked before a host is asked
    target = m.check_textfile_dir(textfile) if textfile is not None else None
    listen = m.parse_listen(serve) if serve is not None else None

    def work(c: Context) -> Optional[Outcome]:
        from labctl.inventory.select import select_hosts
        from labctl.monitor.alerts import rules_for
        from labctl.monitor.collect import collect

        hosts = select_hosts(c.inventory, limit)
        rules = rules_for(alerts, c.inventory_path)
        if target is not None:
            statuses = collect(c, hosts, rules)
            m.write_textfile(target, m.exposition(statuses))
            return _report_textfile(c, target, statuses)
        assert listen is not None
        _serve(c, listen, lambda: collect(c, hosts, rules), cache_seconds, len(hosts))
        return None

    run_command(ctx, work, inventory, json_out, verbose)


def _report_textfile(c: Context, target: Path, statuses: list[Any]) -> Outcome:
    down = [s for s in statuses if not s.reachable]
    firing = sum(len(s.alerts) for s in statuses)
    data = {
        "textfile": str(target),
        "hosts": [
            {
                "host": s.host,
                "status": s.status,
                "reachable": s.reachable,
                "exported": s.sample is not None,
                "error": s.error,
            }
            for s in statuses
        ],
        "alerts": firing,
    }

    from labctl.monitor.render import render_textfile

    return Outcome(data, lambda: render_textfile(c.console, target, statuses), 1 if down else 0)


def _serve(c: Context, listen: tuple[str, int], source: Any, cache_seconds: float, count: int) -> None:
    from labctl.monitor import metrics as m

    addr, port = listen
    server, thread = m.serve(addr, port, source, cache_seconds)
    shown = f"[{addr}]" if ":" in addr else addr
    url = f"http://{shown}:{server.server_address[1]}/metrics"
    if c.json_mode:
        c.emit({"serving": url, "hosts": count})
    else:
        c.console.print(f"serving {url} for {count} hosts (collected on each scrape); Ctrl-C stops")
    try:
        thread.join()
    except KeyboardInterrupt:  # the way a foreground server is stopped: not a failure
        pass
    finally:
        server.shutdown()
        server.server_close()
