"""fan_out: one result per host in order, failures classified, the others unaffected."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from labctl.hosts.context import Context
from labctl.hosts.fanout import HostResult, HostRun, Skipped, exit_code, fan_out, on_host
from labctl.hosts.recap import recap_table
from labctl.inventory.model import Host
from labctl.output.errors import HostError
from labctl.transport.base import AuthFailed, CommandTimeout, HostKeyError, Unreachable


def ctx() -> Context:
    return Context.create(
        inventory_path=Path("unused.yaml"), console=Console(stderr=True, force_terminal=False)
    )


def hosts(*names: str) -> list[Host]:
    return [Host(name=n, address=f"10.0.0.{i + 1}") for i, n in enumerate(names)]


def test_results_keep_host_order_and_classify_failures() -> None:
    errors = {
        "b": Unreachable("b is down", "power it on"),
        "c": HostKeyError("c key changed", "labctl trust c --replace"),
        "d": AuthFailed("d refused", "add the key"),
        "e": CommandTimeout("e slow", "raise timeout"),
        "f": HostError("f broke", "fix f"),
        "g": Skipped("windows"),
        "h": RuntimeError("a bug"),
    }

    def step(run: HostRun) -> HostResult:
        # Finish in reverse order: the results must still come back in host order.
        time.sleep(0.01 * (10 - len(run.host.name)))
        if run.host.name in errors:
            raise errors[run.host.name]
        return HostResult(run.host.name, "ok", data=run.host.address)

    names = ["a", "b", "c", "d", "e", "f", "g", "h"]
    results = fan_out(ctx(), hosts(*names), step)
    assert [r.host for r in results] == names
    assert [r.status for r in results] == [
        "ok",
        "unreachable",
        "hostkey",
        "auth",
        "timeout",
        "failed",
        "skipped",
        "failed",
    ]
    by = {r.host: r for r in results}
    assert by["a"].data == "10.0.0.1"
    assert by["b"].hint == "power it on"
    assert by["g"].error == "windows" and by["g"].ok
    assert "internal error: RuntimeError: a bug" in (by["h"].error or "")
    assert exit_code(results) == 1
    assert exit_code([by["a"], by["g"]]) == 0


def test_hosts_run_in_parallel_up_to_max_workers() -> None:
    running = 0
    peak = 0
    lock = threading.Lock()

    def step(run: HostRun) -> HostResult:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        return HostResult(run.host.name, "ok")

    fan_out(ctx(), hosts(*"abcdefgh"), step)
    assert peak == 8
    peak = 0
    fan_out(ctx(), hosts(*"abcdefgh"), step, max_workers=3)
    assert peak == 3


def test_no_hosts_is_no_results() -> None:
    assert fan_out(ctx(), [], lambda run: HostResult(run.host.name, "ok")) == []


def test_recap_lists_every_host_with_status_and_hint() -> None:
    results = [
        HostResult("m5", "ok", seconds=0.2, rc=0),
        HostResult("irina", "unreachable", seconds=10.0, error="no route", hint="check the cable"),
    ]
    console = Console(record=True, width=200)
    console.print(recap_table(results))
    text = console.export_text()
    assert "m5" in text and "ok" in text and "0.20s" in text
    assert "unreachable" in text and "no route" in text and "check the cable" in text


@pytest.mark.parametrize(("statuses", "code"), [(["ok", "changed", "skipped"], 0), (["ok", "cancelled"], 1)])
def test_exit_code(statuses: list[str], code: int) -> None:
    assert exit_code([HostResult(str(i), s) for i, s in enumerate(statuses)]) == code


def test_on_host_returns_the_value_on_the_pooled_connection() -> None:
    c = ctx()
    here = Host(name="here", address="127.0.0.1", connection="local")
    seen: list[object] = []

    def step(run: HostRun) -> str:
        seen.append(run.conn)
        assert not run.cancel.is_set()
        return run.host.name

    assert on_host(c, here, step) == "here"
    assert on_host(c, here, step) == "here"
    assert seen[0] is seen[1]  # one connection per host, as in fan_out
    cancel = threading.Event()
    assert on_host(c, here, lambda run: run.cancel, cancel) is cancel  # e.g. the calling step's own


def test_on_host_raises_the_error_and_drops_a_broken_connection() -> None:
    c = ctx()
    here = Host(name="here", address="127.0.0.1", connection="local")
    first = on_host(c, here, lambda run: run.conn)

    def fails(error: Exception) -> object:
        def step(run: HostRun) -> object:
            run.conn  # noqa: B018 (opens it)
            raise error

        return step

    with pytest.raises(HostError) as e:
        on_host(c, here, fails(HostError("here broke", "fix it")))
    assert (e.value.message, e.value.hint) == ("here broke", "fix it")
    assert on_host(c, here, lambda run: run.conn) is first  # a failed command keeps the connection
    with pytest.raises(Unreachable):
        on_host(c, here, fails(Unreachable("here is gone", "power it on")))
    assert on_host(c, here, lambda run: run.conn) is not first  # a failed transport connects again


def test_errors_that_can_be_named_are_not_internal_errors() -> None:
    import errno

    errors = {
        "a": OSError(errno.ENOSPC, "No space left on device", "/var/tmp/x"),
        "b": ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
        "c": EOFError(),
        "d": OSError("Socket is closed"),  # paramiko's, with no errno
        "e": RuntimeError("a bug"),
    }

    def step(run: HostRun) -> HostResult:
        raise errors[run.host.name]

    by = {r.host: r for r in fan_out(ctx(), hosts(*errors), step)}
    assert by["a"].status == "failed" and "disk full on this machine" in str(by["a"].error)
    assert "/var/tmp/x" in str(by["a"].error)
    for name in "bcd":
        assert by[name].status == "unreachable" and f"connection to {name}" in str(by[name].error)
        assert "lost" in str(by[name].error)
    assert str(by["e"].error).startswith("internal error")
    with pytest.raises(Unreachable, match=r"connection to c .* lost"):
        on_host(ctx(), hosts("c")[0], lambda run: step(run))


def test_a_step_ending_in_system_exit_is_a_failed_host_not_a_wait_for_ever() -> None:
    # rich raised SystemExit from a host's thread on a broken pipe: the thread ended silently.
    def step(run: HostRun) -> HostResult:
        if run.host.name == "b":
            raise SystemExit(1)
        return HostResult(run.host.name, "ok")

    got: list[HostResult] = []
    t = threading.Thread(target=lambda: got.extend(fan_out(ctx(), hosts("a", "b"), step)), daemon=True)
    t.start()
    t.join(60)  # a bound on a hang, not on speed
    assert not t.is_alive(), "fan_out waited for ever for the host whose thread had ended"
    assert [r.status for r in got] == ["ok", "failed"]
    assert "SystemExit" in (got[1].error or "")
