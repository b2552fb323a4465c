"""One progress channel (issue 40): features name events, the command decides how they show."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

from rich.console import Console

from labctl.netbench.render import NETWORK_PROGRESS
from labctl.output.progress import QUIET, Recorded, Shown, shown


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=200, color_system=None), buf


def test_an_event_goes_to_its_own_function_with_its_fields_and_others_are_not_shown() -> None:
    seen: list[tuple[Any, dict[str, Any]]] = []
    console, _ = _console()
    progress = Shown(console, {"measured": lambda con, **fields: seen.append((con, fields))})
    progress.event("measured", seconds=2.5)
    progress.event("unheard-of", x=1)
    assert seen == [(console, {"seconds": 2.5})]


def test_json_mode_shows_no_progress_and_a_person_sees_it() -> None:
    console, buf = _console()
    assert shown(SimpleNamespace(json_mode=True, console=console), NETWORK_PROGRESS) is QUIET
    QUIET.event("measured", seconds=1.0)
    person = shown(SimpleNamespace(json_mode=False, console=console), NETWORK_PROGRESS)
    person.event("measured", seconds=1.04)
    assert buf.getvalue() == "measured in 1.0 s\n"


def test_bench_network_shows_its_events_as_the_lines_it_always_printed() -> None:
    console, buf = _console()
    progress = Shown(console, NETWORK_PROGRESS)
    progress.event("listening", receiver="m5", address="10.0.0.2", port=5201, sender="irina")
    progress.event("rate", streams=2, bits_per_s=1.5e9)
    progress.event("measured", seconds=5.26)
    assert buf.getvalue().splitlines() == [
        "m5 listening on 10.0.0.2:5201; irina sends",
        "2 stream(s): 1500 Mbit/s",
        "measured in 5.3 s",
    ]


def test_recorded_keeps_every_event_in_order() -> None:
    rec = Recorded()
    rec.event("rate", streams=1, bits_per_s=1.0)
    rec.event("measured", seconds=2.0)
    assert rec.events == [("rate", {"streams": 1, "bits_per_s": 1.0}), ("measured", {"seconds": 2.0})]


def test_ckpt_pull_shows_its_events_as_the_lines_it_always_printed() -> None:
    from labctl.ckpt.render import PULL_PROGRESS

    console, buf = _console()
    progress = Shown(console, PULL_PROGRESS)
    progress.event("in library", run_id="r1", step=100, host="irina")
    progress.event("would send", run_id="r1", step=200, damaged=False, bytes=10, path="/lib/r1/200")
    progress.event("would send", run_id="r1", step=300, damaged=True, bytes=10, path="/lib/r1/300")
    progress.event(
        "committed",
        run_id="r1",
        step=200,
        action="committed",
        path="/lib/r1/200",
        host="irina",
        replaced=None,
    )
    progress.event(
        "committed", run_id="r1", step=300, action="replaced", path="/p", host="irina", replaced="bad [hash]"
    )
    progress.event("exported", model="tiny", step=300)
    progress.event("model present", name="tiny", host="irina")
    progress.event("model published", name="tiny", host="irina", path="/models/tiny")
    assert buf.getvalue().splitlines() == [
        "r1 step 100: already in irina's library",
        "r1 step 200: would commit (10 bytes to send) at /lib/r1/200",
        "r1 step 300: would replace the damaged copy (10 bytes to send) at /lib/r1/300",
        "r1 step 200: committed to /lib/r1/200 on irina",
        "r1 step 300: replaced at /p on irina (the copy there was damaged: bad [hash])",
        "tiny: the weights of step 300 exported as safetensors",
        "tiny: already in irina's model library",
        "tiny: in irina's model library at /models/tiny (labctl cache sync tiny fills a cache)",
    ]


def test_an_event_field_may_be_called_name() -> None:
    rec = Recorded()
    rec.event("model present", name="tiny", host="irina")
    assert rec.events == [("model present", {"name": "tiny", "host": "irina"})]


def _lock_waiting(progress: Any, kind: Any = None) -> None:
    """HostLock hearing the agent say another command holds the host."""
    from labctl.hosts.hostlock import PROVISION, HostLock

    run = SimpleNamespace(host=SimpleNamespace(name="m5"), ctx=None)
    lock = HostLock(run, 30, progress, kind or PROVISION)  # type: ignore[arg-type]
    holder = '{"command": "labctl provision", "pid": 7, "controller": "ctl", "user": "ana"}'
    lock._line("stderr", '{"event": "waiting", "holder": ' + holder + "}")


def test_a_host_lock_reports_its_wait_as_an_event() -> None:
    rec = Recorded()
    _lock_waiting(rec)
    assert rec.events == [
        (
            "waiting",
            {
                "host": "m5",
                "command": "labctl provision",
                "doing": "is changing this host",
                "holder": "labctl provision pid 7 on ctl (ana), holding it since ?",
                "wait": 30,
            },
        )
    ]


def test_provision_shows_its_events_as_the_lines_it_always_printed() -> None:
    from labctl.provision.engine import ResourceResult
    from labctl.provision.render import provision_progress

    console, buf = _console()
    progress = Shown(console, provision_progress(check=True, diff=False))
    changed = ResourceResult(
        "m5",
        "cache /dev/shm",
        "model_cache",
        "changed",
        changed=True,
        summary=["mount tmpfs [64G]"],
        seconds=1.234,
    )
    progress.event("resource", result=changed)
    failed = ResourceResult(
        "m5", "cron x", "cron", "failed", error="no [cron]", hint="install it", seconds=0.5
    )
    progress.event("resource", result=failed)
    _lock_waiting(progress)
    # What HEAD printed through on_event / on_wait for the same results and the same wait.
    assert buf.getvalue() == (
        "would change m5 cache /dev/shm 1.23s\n"
        "              - mount tmpfs [64G]\n"
        "      failed m5 cron x 0.50s\n"
        "              no [cron] install it\n"
        "m5: another labctl provision is changing this host (labctl provision pid 7 on ctl (ana), "
        "holding it since ?); waiting for it, up to 30 s\n"
    )


def test_provision_under_json_still_says_it_waits_and_nothing_else() -> None:
    from labctl.provision.engine import ResourceResult
    from labctl.provision.render import provision_progress

    console, buf = _console()
    c = SimpleNamespace(json_mode=True, console=console)
    progress = shown(c, provision_progress(check=False, diff=False), under_json=("waiting",))
    progress.event("resource", result=ResourceResult("m5", "x", "file", "ok"))
    _lock_waiting(progress)
    assert buf.getvalue().startswith("m5: another labctl provision") and buf.getvalue().count("\n") == 1
    assert shown(c, provision_progress(check=False, diff=False)) is QUIET


def test_cron_install_passes_on_only_the_resources_that_are_news() -> None:
    from labctl.cron.install import _Only
    from labctl.provision.engine import ResourceResult

    rec = Recorded()
    key = ResourceResult("orch", "key", "ssh_keypair", "ok")
    cron = ResourceResult("orch", "cron", "cron", "changed")
    only = _Only(rec, lambda r: r.type != "ssh_keypair")
    only.event("resource", result=key)
    only.event("resource", result=cron)
    only.event("waiting", host="orch")
    assert rec.events == [("resource", {"result": cron}), ("waiting", {"host": "orch"})]


def test_the_rotation_shows_its_events_as_the_lines_it_always_printed() -> None:
    from labctl.orchestra.render import ROTATION_PROGRESS
    from labctl.orchestra.steps.lock import ROTATION

    console, buf = _console()
    progress = Shown(console, ROTATION_PROGRESS)
    progress.event("warming first")
    progress.event("syncing", host="gpu1", models=["a", "b"], source="irina")
    progress.event("starting", host="gpu1", model="a", gpu=0)
    progress.event("starting", host="gpu1", model="b", gpu=None)
    progress.event("health", host="gpu1", model="a", state="ready")
    progress.event("stopping", host="gpu1", models=["c", "d"])
    progress.event("repaired", note="gpu1: [x] gone")
    progress.event("not published", host="trainer", error="unreachable")
    _lock_waiting(progress, ROTATION)
    assert buf.getvalue().splitlines() == [
        "nothing is warm yet: starting the warm set first (not counted in the rotation)",
        "gpu1: syncing a, b into the RAM cache from irina",
        "gpu1: starting a on GPU 0",
        "gpu1: starting b on GPU -",
        "gpu1: a ready",
        "gpu1: stopping c, d",
        "repaired gpu1: [x] gone",
        "trainer: the trainers' endpoints could not be rewritten: unreachable",
        f"m5: another {ROTATION.command} {ROTATION.doing} (labctl provision pid 7 on ctl (ana), "
        "holding it since ?); waiting for it, up to 30 s",
    ]


def _pull(monkeypatch: Any, progress: Any, what: str | None = None) -> None:
    """pull_from against an agent that reports two progress lines (and a line that is no event)."""
    import labctl.hosts.agent_ship as ship
    from labctl.cache.sync import pull_from

    def call_agent(run: Any, command: str, args: Any, timeout: Any, on_line: Any) -> dict[str, Any]:
        on_line("stderr", '{"event": "progress", "done": 10, "total": 100}')
        on_line("stdout", "not an event")
        on_line("stderr", '{"event": "progress", "done": 100, "total": 100}')
        return {}

    monkeypatch.setattr(ship, "call_agent", call_agent)
    monkeypatch.setattr(ship, "agent_dir", lambda host: "/agent")
    run = SimpleNamespace(
        host=SimpleNamespace(name="m5"), conn=SimpleNamespace(put_bytes=lambda *a, **k: None)
    )
    server = SimpleNamespace(source=SimpleNamespace(address="10.0.0.2"))
    pull_from(run, server, {"token": "t", "port": 1}, {}, {}, progress, what)  # type: ignore[arg-type]


def test_a_cache_pull_reports_each_progress_line_as_copied_in_order(monkeypatch: Any) -> None:
    rec = Recorded()
    _pull(monkeypatch, rec)
    assert rec.events == [
        ("copied", {"what": "m5", "done": 10, "total": 100}),
        ("copied", {"what": "m5", "done": 100, "total": 100}),
    ]
    rec = Recorded()
    _pull(monkeypatch, rec, what="r1 step 200")  # ckpt backup and restore name the checkpoint
    assert [f["what"] for _, f in rec.events] == ["r1 step 200", "r1 step 200"]


def test_bars_render_copied_events_as_the_bar_the_old_update_drew() -> None:
    from labctl.output.bars import Bars

    console, _ = _console()
    with Bars(console, enabled=True) as bars:
        progress = shown(SimpleNamespace(json_mode=False, console=console), bars.shows())
        progress.event("copied", what="m5", done=512 << 20, total=1 << 30)
        progress.event("copied", what="r1 step 200", done=0, total=0)
        tasks = {t.description: t for t in bars.progress.tasks}
    assert list(tasks) == ["m5", "r1 step 200"]
    m5, ckpt = tasks["m5"], tasks["r1 step 200"]
    assert (m5.completed, m5.total, m5.fields["sizes"]) == (512 << 20, 1 << 30, "512.0 MiB/1.0 GiB")
    assert (ckpt.completed, ckpt.total) == (0, 1.0)  # an unknown total draws as 1 byte, as before
    assert Bars(console, enabled=False).shows()["copied"](console, what="x", done=1, total=2) is None


def test_a_network_transaction_reports_each_step_it_saw_in_order_and_keeps_it() -> None:
    import time

    from labctl.network.txn import TxnReport, _Transaction

    rec = Recorded()
    txn = _Transaction.__new__(_Transaction)
    txn.report, txn.t0, txn.progress = TxnReport("m5", "bond bond0", "id", 90.0), time.monotonic(), rec
    txn.saw("applied on the host")
    txn.saw("verified and committed")
    assert rec.events == [
        ("seen", {"what": "applied on the host"}),
        ("seen", {"what": "verified and committed"}),
    ]
    assert [s.split(" ", 1)[1] for s in txn.report.seen] == ["applied on the host", "verified and committed"]


def test_the_bond_resource_shows_a_transaction_step_as_the_line_it_always_printed() -> None:
    from labctl.provision.resources.network import BondResource

    console, buf = _console()
    bond = SimpleNamespace(label=lambda: "bond bond0")
    Shown(console, {"seen": BondResource._seen(bond, "m5")}).event("seen", what="applied on the host")  # type: ignore[arg-type]
    assert buf.getvalue() == "m5: bond bond0: applied on the host\n"


def test_bench_phase3_shows_its_events_as_the_lines_it_always_printed() -> None:
    from labctl.phase3.render import PHASE3_PROGRESS

    console, buf = _console()
    progress = Shown(console, PHASE3_PROGRESS)
    for part in ("cycle", "sandbox", "training", "learning"):
        progress.event("measuring", part=part)
    progress.event("rotating", step=5)
    progress.event("learning", tasks=["t1", "t2"], coders=["c"], others=[])
    progress.event("learning", tasks=["t1"], coders=["c", "d"], others=["e"])
    progress.event("left behind", folder="/x/bench", hosts=[("m5", "exit 1"), ("m6", "gone")])
    assert buf.getvalue().splitlines() == [
        "the orchestra cycle, k = 1 .. warm models",
        "sandbox executions through the service, then docker run --rm and the pool",
        "a phase-3 run with a rotation in its middle",
        "learning: a phase-3 run against a warm coder model whose hint matters",
        "step 5 logged: rotating now",
        "learning: 2 tasks t1, t2 against c",
        "learning: 1 tasks t1 against c, d (also warm, whatever the hint: e)",
        "/x/bench is left on m5 (exit 1), m6 (gone): remove it there by hand",
    ]


def test_bench_phase3_says_it_rotates_before_the_rotation_reports(monkeypatch: Any) -> None:
    import labctl.orchestra.rotate as rotate_mod
    import labctl.phase3.bench as pb

    rec = Recorded()

    def run_phase3(ctx: Any, args: Any, label: str, poll: Any, progress: Any) -> list[dict[str, Any]]:
        poll([{"event": "step", "step": 1}])
        poll([{"event": "step", "step": 2}])
        poll([{"event": "step", "step": 3}])  # one rotation only
        return [{"event": "step", "step": 1, "time": 1.0}, {"event": "step", "step": 3, "time": 2.0}]

    def rotate(ctx: Any, orch: Any, opts: Any) -> Any:
        rec.event("rotated")
        doc = {"joined": [], "left": [], "seconds": 1.0}
        return SimpleNamespace(to_json=lambda: doc)

    monkeypatch.setattr(pb, "run_phase3", run_phase3)
    monkeypatch.setattr(rotate_mod, "rotate", rotate)
    pb.training_figure(None, None, [], None, 2, rec)  # type: ignore[arg-type]
    assert rec.events == [("rotating", {"step": 2}), ("rotated", {})]


def test_an_attached_train_run_shows_its_events_as_the_lines_it_always_printed(capsys: Any) -> None:
    from pathlib import Path

    from labctl.train.render import LiveView

    console, buf = _console()
    spec = SimpleNamespace(
        run_id="p2-x",
        phase=2,
        world_size=2,
        nodes=[SimpleNamespace(host="m5", nproc=2, device="cuda")],
        head_address="10.0.0.2",
        port=29500,
    )
    progress = shown(SimpleNamespace(json_mode=False, console=console), LiveView(console).shows())  # type: ignore[arg-type]
    progress.event("started", spec=spec, log_dir=Path("/runs/p2-x"))
    progress.event("line", label="m5/0", text="step 1/10 loss 2.0", stream="stdout")
    progress.event("line", label="m5/torchrun", text="ERROR x", stream="stderr")
    # What HEAD's RunView printed for the same start and lines: stderr's on the console, a
    # rank's stdout on stdout.
    assert buf.getvalue() == (
        "train p2-x: phase 2, 2 processes on m5 (2 cuda); rendezvous 10.0.0.2:29500; logs /runs/p2-x\n"
        "m5/torchrun │ ERROR x\n"
    )
    assert capsys.readouterr().out == "m5/0  │ step 1/10 loss 2.0\n"


def test_the_train_stream_reports_the_lines_it_shows_in_order(tmp_path: Any) -> None:
    from labctl.train.launch import Stream

    rec = Recorded()
    stream = Stream(tmp_path, {0}, rec)
    stream.open(["m5"])
    try:
        stream.line("m5", "stdout", "[rank0]:hello")
        stream.line("m5", "stdout", "[rank1]:not a shown rank")
        stream.line("m5", "stderr", "[rank1]:" + '{"event": "fatal", "reason": "no token"}')
        stream.line("m5", "stderr", "torchrun ERROR: it broke")
    finally:
        stream.close()
    assert [(f["label"], f["stream"]) for _, f in rec.events] == [
        ("m5/0", "stdout"),
        ("m5/1", "stderr"),
        ("m5/torchrun", "stderr"),
    ]
    assert {name for name, _ in rec.events} == {"line"} and rec.events[0][1]["text"] == "hello"
