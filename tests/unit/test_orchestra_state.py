"""The orchestra's host state, pure: what a killed rotation left (repair), the status summary and
the rotation bench's arithmetic, from agent answers as data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

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


# ---------------------------------------------------------------------------------------------
# the inventory changed under a warm set: GPUs or hosts removed, the warm count lowered, a model
# gone from the orchestra file. The plan starts from what runs and brings it back to the file.


def tiny_orchestra(warm: int = 2, names: tuple[str, ...] = ("a", "b", "c", "d")) -> Any:
    from labctl.orchestra.spec import ModelEntry, Orchestra

    return Orchestra(hosts="m5", warm=warm, rotate=1, models=[ModelEntry(name=n, size_gb=1.0) for n in names])


def with_p40s(inv: Any, count: int) -> Any:
    """The seed inventory with m5's P40s cut to `count` (GPUs 1..count; GPU 0 is training's V100)."""
    m5 = inv.hosts["m5"]
    gpus = [g.model_copy(update={"count": count}) if g.model == "Tesla P40" else g for g in m5.gpus]
    return inv.model_copy(update={"hosts": {**inv.hosts, "m5": m5.model_copy(update={"gpus": gpus})}})


def running(placed: dict[str, int], warm: int = 2) -> HostView:
    """m5 running `placed` (model -> GPU), each recorded in warm.json and answering."""
    models = [
        {**model(n, 100 + i, 9000 + i, since=float(i)), "gpu": g, "memory_gb": 1.7}
        for i, (n, g) in enumerate(placed.items())
    ]
    servers = [{**server(n, 100 + i, 9000 + i), "gpu": g} for i, (n, g) in enumerate(placed.items())]
    return HostView("m5", {"models": models, "warm_size": warm, "hosts": ["m5"]}, None, servers, [])


def plan_for(inv: Any, orch: Any, v: HostView, kind: str) -> Any:
    from labctl.orchestra.decide import decide

    return decide(inv, orch, [inv.hosts["m5"]], {"m5": v}, {"m5": find_repair(v)}, kind)


def test_a_model_on_a_gpu_removed_from_the_inventory_is_stopped_and_the_warm_set_kept_on_the_rest() -> None:
    inv, _, _ = seed()
    inv = with_p40s(inv, 3)  # GPU 4 is gone
    orch = tiny_orchestra(warm=2)
    v = running({"a": 3, "b": 4})
    gpus = {("m5", 1), ("m5", 2), ("m5", 3)}
    for kind in ("rotate", "start"):
        plan = plan_for(inv, orch, v, kind)
        # b's server stops first, whether it then starts on a GPU the orchestra has or leaves.
        assert (plan.steps[0].action, plan.steps[0].model) == ("stop", "b"), (kind, plan.steps)
        assert set(plan.after.assignment().values()) <= gpus and len(plan.after.where) == 2, kind
        assert "GPU 4 is gone from the inventory" in plan.to_json()["why"]["b"], kind
    start = plan_for(inv, orch, v, "start")
    assert [(s.action, s.model) for s in start.steps] == [("stop", "b"), ("start", "b")]
    assert start.steps[1].gpu in (1, 2) and start.after.where["a"].index == 3  # a stays put
    stop = plan_for(inv, orch, v, "stop")
    assert sorted(stop.leaving) == ["a", "b"] and stop.after.where == {}


def test_start_brings_the_warm_set_down_to_a_lowered_warm_count_and_drops_models_gone_from_the_file() -> None:
    inv, _, _ = seed()
    v = running({"a": 1, "b": 2, "c": 3}, warm=3)
    plan = plan_for(inv, tiny_orchestra(warm=2), v, "start")
    assert len(plan.after.where) == 2 and len(plan.leaving) == 1 and plan.joining == []
    plan = plan_for(inv, tiny_orchestra(warm=3, names=("a", "b", "d")), v, "start")
    assert plan.leaving == ["c"] and plan.joining == ["d"] and set(plan.after.where) == {"a", "b", "d"}


@given(
    st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 4), min_size=0, max_size=6),
    st.integers(1, 4),
    st.integers(1, 4),
    st.sampled_from(["rotate", "start", "stop"]),
)
def test_any_plan_ends_on_the_gpus_the_inventory_still_has_and_stops_whatever_leaves(
    placed: dict[str, int], p40s: int, warm: int, kind: str
) -> None:
    inv, _, _ = seed()
    inv = with_p40s(inv, p40s)
    orch = tiny_orchestra(warm=warm, names=tuple("abcdef"))
    v = running(placed, warm=warm)
    plan = plan_for(inv, orch, v, kind)
    assert all(key[0] == "m5" and 1 <= key[1] <= p40s for key in plan.after.assignment().values())
    assert len(plan.after.where) == (0 if kind == "stop" else warm)
    # Every running model that does not stay exactly where it is gets a stop step, and each one
    # that starts was stopped first (or was not running).
    stopped = [s.model for s in plan.steps if s.action == "stop"]
    for name, gpu in placed.items():
        stays = name in plan.after.where and plan.after.where[name].index == gpu
        assert (name in stopped) != stays, (name, gpu, plan.steps)
    for i, s in enumerate(plan.steps):
        if s.action == "start" and s.model in placed:
            assert s.model in [x.model for x in plan.steps[:i] if x.action == "stop"]


def test_leftovers_name_what_runs_against_the_plan_with_its_pid() -> None:
    from labctl.orchestra.hoststate import leftovers

    v = running({"a": 1, "b": 4})
    v.servers.append({**server("x", 300, 9300), "gpu": 2})  # started by hand, same lab
    left = leftovers({"m5": v}, {"a": ("m5", 1), "c": ("m5", 2)})
    text = " | ".join(item.text for item in left)
    assert "x (pid 300, port 9300) runs, not in warm.json" in text
    assert "b (pid 101, port 9001) still runs on GPU 4" in text
    assert "c does not answer on GPU 2" in text
    assert sorted(item.pid for item in left if item.pid) == [101, 300]
    assert leftovers({"m5": running({"a": 1})}, {"a": ("m5", 1)}) == []


def test_hosts_that_served_at_the_last_commit_and_serve_no_more_are_found_with_their_record() -> None:
    from labctl.orchestra.hoststate import gone_hosts

    v = running({"a": 1})
    assert v.warm is not None
    v.warm["hosts"] = ["m5", "old", "legacy"]
    v.warm["peers"] = {
        "m5": {"address": "10.0.0.1", "models": []},
        "old": {"address": "10.0.0.9", "user": "root", "port": 22, "models": [{"name": "b", "pid": 7}]},
    }
    assert gone_hosts({"m5": v}, ["m5"], "sim") == {
        "old": {"address": "10.0.0.9", "user": "root", "port": 22, "models": [{"name": "b", "pid": 7}]},
        "legacy": {},
    }
    v.warm["lab"] = "another-lab"  # its warm.json on a machine both labs use names none of ours
    assert gone_hosts({"m5": v}, ["m5"], "sim") == {}


def test_a_removed_hosts_servers_are_named_with_the_ssh_command_that_stops_them() -> None:
    from labctl.orchestra.rotate import left_behind

    removed = {
        "old": {
            "address": "10.0.0.9",
            "user": "ops",
            "port": 2222,
            "models": [{"name": "b", "pid": 7, "port": 9}],
        },
        "idle": {"address": "10.0.0.8", "models": []},
        "legacy": {},
    }
    out = {lb["host"]: lb for lb in left_behind(removed, "sim")}
    assert out["old"]["command"] == "ssh -p 2222 ops@10.0.0.9 'kill -TERM -7'"
    assert "b (pid 7, port 9)" in out["old"]["note"] and out["old"]["command"] in out["old"]["note"]
    assert "idle" not in out  # it ran nothing at the last commit
    assert out["legacy"]["command"] is None and "no longer in the inventory" in out["legacy"]["note"]
    # Still in the inventory but not answering: named too (a rotation never waits on it), with
    # the labctl command, since labctl reaches it by inventory once it is back.
    (down,) = left_behind({"old": removed["old"]}, "sim", {"old": "old: connection refused"})
    assert down["command"] == "labctl exec -l old -- kill -TERM -7"
    assert "labctl cannot reach it (old: connection refused)" in down["note"]


def test_rotations_from_a_scheduled_copy_on_a_host_gone_from_the_inventory_are_a_problem() -> None:
    from labctl.cron.plan import INVENTORY

    entry = {"kind": "rotate", "at": 100.0, "ok": True, "by": {"inventory": INVENTORY}, "client": "10.0.0.30"}
    v = view([model("a", 10, 9001)], [server("a", 10, 9001)], history=[entry])
    gone = summarize({"m5": v}, every_s=3600.0, warm_size=1, addresses=["10.0.0.10", "10.0.0.20"])
    (problem,) = gone.notes
    assert "10.0.0.30, which is no host of the inventory" in problem
    assert "ssh root@10.0.0.30 'rm -f /etc/cron.d/labctl-rotate" in problem
    # From the orchestrator still in the inventory, from a laptop's own inventory, or with
    # addresses that did not resolve: nothing to say.
    assert summarize({"m5": v}, 3600.0, 1, addresses=["10.0.0.10", "10.0.0.30"]).notes == []
    entry["by"] = {"inventory": "/home/me/lab/inventory/lab.yaml"}
    assert summarize({"m5": v}, 3600.0, 1, addresses=["10.0.0.10"]).notes == []
    assert summarize({"m5": v}, 3600.0, 1, addresses=None).notes == []
