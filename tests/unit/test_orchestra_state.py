"""The orchestra's host state, pure: what a killed rotation left (repair), the status summary and
the rotation bench's arithmetic, from agent answers as data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from labctl.orchestra.bench import report_from
from labctl.orchestra.hoststate import HostView, find_repair
from labctl.orchestra.status import summarize


def model(name: str, pid: int, port: int, since: float = 1.0) -> dict[str, Any]:
    return {"name": name, "gpu": 1, "port": port, "pid": pid, "state": "loaded", "since": since}


def server(name: str, pid: int, port: int, healthy: bool = True) -> dict[str, Any]:
    return {"model": name, "pid": pid, "pgid": pid, "port": port, "healthy": healthy}


def view(models: list[dict[str, Any]], servers: list[dict[str, Any]], **kw: Any) -> HostView:
    return HostView(
        "m5", {"models": models, "warm_size": 2}, kw.get("warm_error"), servers, kw.get("history", [])
    )


def test_what_warm_json_records_and_answers_is_current_and_nothing_needs_repair() -> None:
    rep = find_repair(
        view([model("a", 10, 9001), model("b", 11, 9002)], [server("a", 10, 9001), server("b", 11, 9002)])
    )
    assert [m["name"] for m in rep.current] == ["a", "b"] and not rep.needed and rep.notes() == []


def test_a_server_started_by_a_killed_rotation_is_an_orphan() -> None:
    rep = find_repair(view([model("a", 10, 9001)], [server("a", 10, 9001), server("c", 12, 9003)]))
    assert [s["model"] for s in rep.orphans] == ["c"] and rep.lost == []
    assert "not in warm.json" in rep.notes()[0]


def test_a_second_server_of_a_recorded_model_is_an_orphan_even_while_the_first_answers() -> None:
    rep = find_repair(view([model("a", 10, 9001)], [server("a", 10, 9001), server("a", 13, 9004)]))
    assert [m["name"] for m in rep.current] == ["a"] and [s["pid"] for s in rep.orphans] == [13]


def test_a_recorded_model_whose_server_died_or_hangs_is_lost_and_the_hung_one_stopped() -> None:
    rep = find_repair(
        view([model("a", 10, 9001), model("b", 11, 9002)], [server("b", 11, 9002, healthy=False)])
    )
    assert rep.current == [] and [m["name"] for m in rep.lost] == ["a", "b"]
    assert [s["pid"] for s in rep.orphans] == [11]  # alive but not answering: stopped, not trusted
    assert any("not answering" in n for n in rep.notes())


def test_an_unreadable_warm_json_is_rebuilt_from_what_answers() -> None:
    v = HostView("m5", None, "Expecting value: line 1 column 1", [server("a", 10, 9001)], [])
    rep = find_repair(v)
    assert rep.damaged and rep.needed and [s["model"] for s in rep.orphans] == ["a"]


def test_status_counts_health_last_and_next_rotation_and_cache_hits() -> None:
    history = [
        {"kind": "start", "at": 100.0, "ok": True, "cache_hits": [], "cache_misses": ["a", "b"]},
        {"kind": "repair", "at": 150.0, "ok": True},
        {"kind": "rotate", "at": 200.0, "ok": True, "cache_hits": ["c"], "cache_misses": []},
    ]
    v = view([model("a", 10, 9001), model("c", 12, 9003)], [server("a", 10, 9001)], history=history)
    st = summarize({"m5": v}, every_s=3600.0, warm_size=2)
    assert st.healthy == 1 and [r["healthy"] for r in st.rows] == [True, False]
    # No schedule installed: nothing starts a rotation, whatever the file's every says.
    assert st.last is not None and st.last["at"] == 200.0 and st.next_at is None
    assert (st.cache_hits, st.cache_misses) == (1, 2)
    assert st.notes  # c is recorded but nothing answers: the next rotation repairs it


def test_bench_splits_the_rotation_into_bare_loading_and_labctls_overhead() -> None:
    result = {
        "joined": [
            {
                "model": "c",
                "cache": 0.0,
                "cache_hit": True,
                "start": 0.1,
                "load": 1.0,
                "warmup": 2.0,
                "health": 0.5,
            },
            {
                "model": "d",
                "cache": 4.0,
                "cache_hit": False,
                "start": 0.1,
                "load": 1.0,
                "warmup": 2.0,
                "health": 0.5,
            },
        ],
        "left": [{"model": "a", "stop": 0.4}, {"model": "b", "stop": 0.6}],
        "stages": {"cache": 4.0, "start": 0.2, "load": 2.0, "warmup": 4.0, "health": 1.0, "stop": 1.0},
        "seconds": 13.0,
    }
    r = report_from(result, every_s=4 * 3600)
    assert r["per_model"]["load"] == 1.0 and r["per_model"]["warmup"] == 2.0 and r["per_model"]["stop"] == 0.5
    assert r["bare_load_warmup_s"] == 6.0 and r["orchestration_overhead_s"] == 3.0  # 13 - 6 - 4 (cache)
    assert r["share_of_cadence"] == round(13.0 / 14400, 6)
    assert (r["cache_hits"], r["cache_misses"]) == (1, 1)
    assert r["seed"]["rotation_s"] == 120.0


# ---------------------------------------------------------------------------------------------
# decide: the seed lab's orchestra file and inventory, hosts' answers as data


def seed() -> tuple[Any, Any, list[Any]]:
    from labctl.inventory.load import load_inventory
    from labctl.orchestra.spec import load_orchestra

    repo = Path(__file__).resolve().parents[2]
    inv = load_inventory(repo / "inventory" / "lab.yaml")
    orch = load_orchestra(repo / "playbooks" / "orchestra.yaml")
    return inv, orch, [inv.hosts["m5"]]


def test_a_first_start_places_the_warm_set_on_the_p40s_pinned_first() -> None:
    from labctl.orchestra.decide import decide
    from labctl.orchestra.hoststate import Repair

    inv, orch, hosts = seed()
    views = {"m5": HostView("m5", None, None, [], [])}
    plan = decide(inv, orch, hosts, views, {"m5": Repair("m5")}, "start")
    assert len(plan.joining) == orch.warm and plan.leaving == []
    assert plan.joining[0] == orch.pinned[0]
    assert {s.gpu_model for s in plan.steps} == {"Tesla P40"} and all(s.gpu != 0 for s in plan.steps)
    assert plan.cursor is not None


def test_stop_takes_every_answering_model_out_and_start_on_a_full_set_does_nothing() -> None:
    from labctl.orchestra.decide import decide
    from labctl.orchestra.hoststate import Repair

    inv, orch, hosts = seed()
    first = decide(
        inv, orch, hosts, {"m5": HostView("m5", None, None, [], [])}, {"m5": Repair("m5")}, "start"
    )
    names = first.joining
    gpu = {s.model: s.gpu for s in first.steps}
    models = [{**model(n, 100 + i, 9000 + i, since=float(i)), "gpu": gpu[n]} for i, n in enumerate(names)]
    servers = [server(n, 100 + i, 9000 + i) for i, n in enumerate(names)]
    v = HostView("m5", {"models": models, "warm_size": 5, "cursor": names[-1]}, None, servers, [])
    reps = {"m5": find_repair(v)}
    stop = decide(inv, orch, hosts, {"m5": v}, reps, "stop")
    assert sorted(stop.leaving) == sorted(names) and stop.joining == []
    start = decide(inv, orch, hosts, {"m5": v}, reps, "start")
    assert start.steps == [] and "already answer" in start.reason
    rot = decide(inv, orch, hosts, {"m5": v}, reps, "rotate")
    assert len(rot.joining) == orch.rotate and len(rot.leaving) == orch.rotate
    assert orch.pinned[0] not in rot.leaving and rot.lowest >= orch.warm - orch.rotate


def test_another_labs_servers_on_the_machine_are_said_but_need_no_repair() -> None:
    v = view([model("a", 10, 9001)], [server("a", 10, 9001)])
    v.others = [{"lab": "theirs", "host": "m5", "model": "x", "pid": 77, "port": 9100}]
    rep = find_repair(v)
    assert not rep.needed and rep.orphans == []  # never stopped as an orphan
    st = summarize({"m5": v}, every_s=3600.0, warm_size=1)
    assert st.notes == [] and st.healthy == 1
    assert st.others == [
        "m5: 1 server(s) started by another lab or host name (theirs/m5: x) run on this machine; left alone"
    ]
    assert st.to_json()["other_labs"] == st.others and st.to_json()["problems"] == []
