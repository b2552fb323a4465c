"""Running `bench network`: the receiver's sink in a thread, the sender's streams, both ends' facts.

Like `cache sync` (labctl/cache/sync.py): the receiving host's agent listens (`netbench.sink`, kept
running in a thread for as long as the sender needs it), the sending host's agent connects to
it (`netbench.send`); this process only starts both and passes the one-time token along.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from labctl.hosts.listening import Listener
from labctl.netbench.plan import HostLink, build_report, host_link
from labctl.output.errors import HostError, LabctlError
from labctl.output.progress import QUIET, Progress

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.hosts.fanout import HostRun
    from labctl.inventory.model import Host

READY_TIMEOUT = 60.0
SINK_IDLE = 60.0  # the sink ends by itself when nobody sends: a lost controller leaves nothing behind
REPORT_ALLOWANCE = 90.0  # per stream count, beyond its seconds: connects, drains, the sink's report


class Sink(Listener):
    """`netbench.sink` on the receiving host, in a thread, for as long as the sender needs it."""

    def __init__(self, ctx: Context, host: Host) -> None:
        super().__init__(
            ctx,
            host,
            "netbench.sink",
            {"bind": host.address, "idle_timeout": SINK_IDLE},
            what="the benchmark's receiver",
            timeout=24 * 3600.0,  # it ends on the sender's word, when idle, or when cancelled
            ready_timeout=READY_TIMEOUT,
            timeout_hint="Check the host's load and run the benchmark again.",
            thread_name=f"sink-{host.name}",
        )


def read_links(ctx: Context, hosts: Sequence[Host]) -> list[HostLink]:
    """Both ends' NIC facts at once; a host that cannot answer fails the benchmark (exit 1)."""
    from concurrent.futures import ThreadPoolExecutor

    from labctl.hosts.agent_ship import ask_agent

    def facts_of(h: Host) -> dict[str, Any] | LabctlError:
        try:
            return dict(ask_agent(ctx, h, "facts.collect", {"sections": ["nics"], "torch": False}))
        except LabctlError as e:
            return e

    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        answers = list(pool.map(facts_of, hosts))
    for a in answers:
        if isinstance(a, LabctlError):
            raise a
    return [host_link(h, a) for h, a in zip(hosts, answers, strict=True)]  # type: ignore[arg-type]


def measure_network(
    ctx: Context,
    sender: Host,
    receiver: Host,
    streams: Sequence[int],
    seconds: float,
    progress: Progress = QUIET,
) -> dict[str, Any]:
    """Throughput from `sender` to `receiver` for each stream count: the report `--json` prints.

    Progress events: "listening" (receiver, address, port, sender), "rate" after each stream
    count (streams, bits_per_s), "measured" (seconds)."""
    from labctl.hosts.fanout import on_host

    sink = Sink(ctx, receiver).begin()
    sent: dict[str, Any] | None = None
    try:
        links = read_links(ctx, [sender, receiver])
        info = sink.wait_ready()

        def send(run: HostRun) -> dict[str, Any]:
            from labctl.hosts.agent_ship import AgentFailed, agent_dir, agent_event, call_agent

            def on_line(stream: str, line: str) -> None:
                event = agent_event(stream, line, "measured")
                if event is not None:
                    progress.event("rate", streams=event["streams"], bits_per_s=event["bits_per_s"])

            # The token goes in a 0600 file, never on a command line other users can read.
            token_file = f"{agent_dir(run.host)}/netbench-token-{uuid.uuid4().hex}"
            run.conn.put_bytes(str(info["token"]).encode(), token_file, mode=0o600, dir_mode=0o700)
            args = {
                "address": receiver.address,
                "port": info["port"],
                "token_file": token_file,
                "streams": list(streams),
                "seconds": seconds,
            }
            try:
                return dict(
                    call_agent(
                        run,
                        "netbench.send",
                        args,
                        timeout=len(streams) * (seconds + REPORT_ALLOWANCE) + 60,
                        on_line=on_line,
                    )
                )
            except AgentFailed as e:
                if e.kind in ("connect_failed", "refused", "stream_failed", "no_data"):
                    raise HostError(
                        f"{sender.name} could not send to {receiver.name} ({receiver.address}): {e.message}",
                        f"Check the network between them: {receiver.name} listened on port {info['port']}; a "
                        f"firewall on {receiver.name} must let {sender.name} connect to it.",
                    ) from None
                raise

        progress.event(
            "listening",
            receiver=receiver.name,
            address=info.get("address"),
            port=info["port"],
            sender=sender.name,
        )
        start = time.monotonic()
        sent = on_host(ctx, sender, send)
        progress.event("measured", seconds=time.monotonic() - start)
    finally:
        # A sender that finished told the sink to stop; otherwise close its channel now.
        sink.stop(5.0 if sent is not None else 0.0)
    return build_report(sender, receiver, seconds, sent, links, sink.result)
