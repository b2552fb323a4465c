"""`labctl exec --network`: one shell command as a network transaction on a host."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from labctl.network.txn import FreshRun, NetChange, TxnReport, keep_connection, transact
from labctl.output.progress import Shown

if TYPE_CHECKING:
    from labctl.hosts.fanout import HostResult, HostRun

Line = Callable[[str, str], None]


def verify_command(command: str | None) -> Callable[[FreshRun, float], list[str]] | None:
    """The --verify check: `command` exits 0 on the host over the new connection."""
    if command is None:
        return None

    def check(fresh: FreshRun, budget: float) -> list[str]:
        res = fresh.conn.run(command, timeout=budget, cancel=fresh.cancel)
        if res.rc == 0:
            return []
        if res.timed_out:
            return [f"--verify `{command}` did not finish within {budget:.0f} s"]
        if res.cancelled:
            return ["interrupted"]
        tail = " / ".join((res.stdout + res.stderr).strip().splitlines()[-3:])
        return [f"--verify `{command}` exited {res.rc}" + (f" ({tail})" if tail else "")]

    return check


def _outputs(report: TxnReport) -> list[str]:
    lines: list[str] = []
    for step in (report.apply or {}).get("steps") or []:
        lines += (step.get("output") or "").splitlines()
    return lines


def run_network_command(
    run: HostRun,
    line: str,
    revert_after: float,
    verify: str | None,
    timeout: float | None,
    on_line: Line,
) -> HostResult:
    from labctl.hosts.fanout import HostResult

    change = NetChange(label=f"exec: {line}", commands=[["sh", "-c", line]], command_timeout=timeout)
    report = transact(
        run,
        change,
        revert_after=revert_after,
        verify=verify_command(verify),
        # An exec's lines go where its host's output goes, not to the console.
        progress=Shown(None, {"seen": lambda _console, what: on_line("stderr", f"net: {what}")}),
    )
    outputs = _outputs(report)
    for text in outputs:
        on_line("stdout", text)
    if report.ok:
        keep_connection(run, report)
        status, error, rc = "changed", None, 0
    else:
        status, error, rc = "failed", report.message(), None
    steps = (report.apply or {}).get("steps") or []
    failed_on_host = not (report.apply or {}).get("ok", True)
    if steps and (report.ok or failed_on_host):
        rc = steps[-1].get("rc")  # the command's own exit code, where it is what decided
    return HostResult(
        run.host.name,
        status,
        rc=rc,
        stdout="\n".join(outputs),
        error=error,
        hint=report.hint("run again"),
        extra={"transaction": report.to_json()},
    )
