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
