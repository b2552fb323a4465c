"""The orchestra's planning, pure: the orchestra file, GPUs and placement, the capacity view,
who leaves and joins, and the order of starts and stops. On the seed lab's real files
(inventory/lab.yaml, playbooks/train.yaml, playbooks/orchestra.yaml) wherever they apply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from labctl.documents.validation import DocumentError
from labctl.inventory.load import load_inventory
from labctl.inventory.model import GPU, Host, Inventory
from labctl.inventory.select import select_hosts
from labctl.orchestra.choose import Choice, Step, choose, lowest_warm, order_steps
from labctl.orchestra.place import (
    Gpu,
    Placement,
    capacity,
    gpus_for,
    place,
    placement_of,
    split_gpus,
    training_claims,
)
from labctl.orchestra.spec import (
    DEFAULT_ORCHESTRA,
    Orchestra,
    default_path,
    load_orchestra,
    parse_every,
    serving_hosts,
)
from labctl.output.errors import InputError
from labctl.train.phases import load_phases
from labctl.train.plan import train_gpus

REPO = Path(__file__).resolve().parents[2]
GIB = 1024**3


def seed_inventory() -> Inventory:
    return load_inventory(REPO / "inventory/lab.yaml")


def seed_orchestra() -> Orchestra:
    return load_orchestra(REPO / "playbooks/orchestra.yaml")


def packed_orchestra() -> Orchestra:
    """fp16 models with typed sizes that nearly fill the P40s: the placement tests' data."""
    return load_orchestra(REPO / "tests/unit/orchestra_fp16.yaml")


def seed_claims() -> dict[str, list[str]]:
    return training_claims(load_phases(REPO / "playbooks/train.yaml"), seed_inventory())


def seed_gpus() -> list[Gpu]:
    inv, orch = seed_inventory(), seed_orchestra()
    return gpus_for(serving_hosts(orch, inv), {}, orch.gpus, seed_claims())


def p40s(n: int = 4) -> list[Gpu]:
    return [Gpu("m5", i + 1, "Tesla P40", 24.0, "declared") for i in range(n)]


# --- the orchestra file -------------------------------------------------------------------------


def test_the_seed_orchestra_file_is_the_seeds_warm_set_and_is_found_beside_the_inventory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    orch = seed_orchestra()
    assert (orch.warm, orch.rotate, orch.every_s, orch.hosts) == (5, 2, 4 * 3600, "role:inference")
    assert 20 <= len(orch.models) <= 30 and orch.server.command is None
    assert set(orch.pinned) <= set(orch.names)
    # Package data, with the repository's playbooks/ a link to it, like train.yaml.
    link = REPO / "playbooks/orchestra.yaml"
    assert link.is_symlink() and link.resolve() == REPO / "labctl/data/playbooks/orchestra.yaml"
    monkeypatch.chdir(tmp_path)
    assert default_path(REPO / "inventory/lab.yaml") == REPO / DEFAULT_ORCHESTRA
    with pytest.raises(InputError) as e:
        default_path(tmp_path / "lab.yaml")
    assert "orchestra file" in e.value.message and "labctl init" in e.value.hint


def test_init_writes_the_orchestra_file_and_it_is_found_beside_the_new_inventory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from labctl.documents.starter import write_starter

    lab = tmp_path / "mylab"
    written = write_starter(lab)
    assert lab / "playbooks/orchestra.yaml" in written
    assert (lab / "playbooks/orchestra.yaml").read_bytes() == (REPO / "playbooks/orchestra.yaml").read_bytes()
    monkeypatch.chdir(tmp_path)
    found = default_path(lab / "inventory/lab.yaml")
    assert found == lab / "playbooks/orchestra.yaml"
    assert load_orchestra(found).names == seed_orchestra().names


def test_gpu_need_is_explicit_else_weights_plus_overhead_and_context() -> None:
    orch = Orchestra.model_validate(
        {
            "warm": 2,
            "rotate": 1,
            "overhead": {"fraction": 0.25, "context_gb": 1.0},
            "models": [
                {"name": "a", "size_gb": 8},
                {"name": "b", "size_gb": 99, "params_b": 7, "bits": 4},
                {"name": "c", "size_gb": 8, "params_b": 7, "bits": 16, "gpu_gb": 5},
            ],
        }
    )
    assert orch.needs() == {"a": 8 * 1.25 + 1, "b": 3.5 * 1.25 + 1, "c": 5}
    assert orch.model("a").folder == "a"
    # The seed's defaults (§2.7): 20% of the weights, 0.5 GB of context.
    assert packed_orchestra().need_gb("Llama-3.1-8B-Instruct") == pytest.approx(16.0 * 1.2 + 0.5)


def test_cadences_parse_to_seconds_and_nonsense_says_what_to_write() -> None:
    assert [parse_every(t) for t in ("4h", "90m", "6h", "1h30m", "1d")] == [14400, 5400, 21600, 5400, 86400]
    for bad in ("", "4", "4x", "h", "30s", "0m", "4h junk"):
        with pytest.raises(ValueError, match=r"cadence|minute"):
            parse_every(bad)


GOOD = """\
warm: 2
rotate: 1
models:
  - {name: a, size_gb: 4}
  - {name: b, size_gb: 4}
  - {name: c, size_gb: 4}
"""


@pytest.mark.parametrize(
    ("text", "where", "words"),
    [
        (GOOD.replace("rotate: 1", "rotat: 1"), ":2: rotat:", "Did you mean 'rotate'?"),
        (GOOD.replace("name: c", "name: a"), ":6: models[2].name:", "already models[0]"),
        (GOOD.replace("rotate: 1", "rotate: 2"), ":2: rotate:", "must be below warm"),
        (GOOD.replace("warm: 2", "warm: 4").replace("rotate: 1", "rotate: 3"), ":1: warm:", "library has 3"),
        (GOOD + "pinned: [b, x]\n", ":7: pinned[1]:", "'x' is not in models"),
        (GOOD + "pinned: [apple]\n", ":7: pinned[0]:", "is not in models"),
        (GOOD.replace("warm: 2", "warm: 3") + "pinned: [a, b, c]\n", ":2: rotate:", "not pinned"),
        (GOOD + "every: 4x\n", ":7: every:", "not a cadence"),
        (GOOD + "server: {command: 'vllm serve {path}'}\n", ":7: server.command:", "must name {port}"),
        (GOOD + "server: {command: 'x --port {port} {model}'}\n", ":7: server.command:", "{model}"),
        (GOOD + "server: {health: health}\n", ":7: server.health:", "URL path"),
        (GOOD + "server: {python: venv/bin/python}\n", ":7: server.python:", "not an absolute path"),
        (
            GOOD.replace("{name: b, size_gb: 4}", "{name: b, size_gb: 4, bits: 4}"),
            ":5: models[1]:",
            "go together",
        ),
        (
            GOOD.replace("{name: b, size_gb: 4}", "{name: b, size_gb: 4, path: x/y}"),
            ":5: models[1].path:",
            "no '/'",
        ),
        (
            GOOD.replace("{name: b, size_gb: 4}", "{name: b, size_gb: 0}"),
            ":5: models[1].size_gb:",
            "greater than 0",
        ),
        (
            GOOD.replace("{name: b, size_gb: 4}", "{name: 'b c', size_gb: 4}"),
            ":5: models[1].name:",
            "not a model name",
        ),
        (
            GOOD.replace("{name: c, size_gb: 4}", "{name: c, engine: lama.cpp}"),
            ":6: models[2].engine:",
            "Did you mean 'llama.cpp'?",
        ),
        (
            GOOD.replace("{name: c, size_gb: 4}", "{name: c, format: safetensors}"),
            ":6: models[2].format:",
            "one of hf, gguf, tinylm",
        ),
        (GOOD + "server: {engine: vLLM}\n", ":7: server.engine:", "labctl knows labctl, llama.cpp, vllm"),
        ("warm: 2\nwarm: 3\nmodels: []\n", ":2: warm:", "keep one"),
    ],
)
def test_bad_orchestra_files_name_file_line_field_and_the_fix(
    tmp_path: Path, text: str, where: str, words: str
) -> None:
    path = tmp_path / "orchestra.yaml"
    path.write_text(text)
    with pytest.raises(DocumentError) as e:
        load_orchestra(path)
    assert e.value.exit_code == 2 and e.value.kind == "orchestra file"
    assert f"{path}{where}" in e.value.message, e.value.message
    assert words in e.value.message
    assert "labctl orchestra plan" in e.value.hint


def test_the_seed_library_fits_every_warm_set_its_rotation_reaches() -> None:
    orch, gpus = seed_orchestra(), seed_gpus()
    ring = [n for n in orch.names if n not in orch.pinned]
    for i in range(len(ring)):
        window = [*orch.pinned, *(ring[(i + k) % len(ring)] for k in range(orch.warm - len(orch.pinned)))]
        place(orch.needs(window), gpus)  # raises when a warm set does not fit


# --- GPUs ---------------------------------------------------------------------------------------


def test_the_orchestras_gpus_are_m5s_p40s_and_the_v100_stays_with_training() -> None:
    assert seed_claims() == {"m5": ["Tesla V100"]}
    inv, orch = seed_inventory(), seed_orchestra()
    used, left = split_gpus(select_hosts(inv, orch.hosts), {}, orch.gpus, seed_claims())
    assert used == p40s()  # declared order, count expanded: the V100 is GPU 0
    assert [(g.key, why) for g, why in left] == [
        (("m5", 0), "kept for training (train.yaml gpus: Tesla V100)")
    ]
    # Named in the orchestra file's gpus:, the V100 serves too.
    named = gpus_for(select_hosts(inv, orch.hosts), {}, ["Tesla V100", "Tesla P40"], seed_claims())
    assert [g.model for g in named] == ["Tesla V100", *["Tesla P40"] * 4]
    # A hosts: that names no host says which file it came from.
    with pytest.raises(InputError) as e:
        serving_hosts(orch.model_copy(update={"hosts": "role:inferense"}), inv, Path("o.yaml"))
    assert e.value.message.startswith("o.yaml hosts: 'role:inferense' matches no host")
    # Without training's claim every GPU serves.
    assert len(gpus_for([inv.host("m5")], {}, (), {})) == 5


def test_detected_gpus_win_over_declared_ones_with_their_own_indices_and_memory() -> None:
    m5 = seed_inventory().host("m5")
    facts: list[dict[str, Any]] = [
        {"index": 0, "name": "Tesla P40", "memory_total_bytes": 24 * GIB},
        {"index": 1, "name": "Tesla V100-PCIE-32GB", "memory_total_bytes": 32 * GIB},
        {"index": 2, "name": "Tesla P40", "memory_total_bytes": None},  # memory unknown: the declared size
    ]
    used, left = split_gpus([m5], {"m5": facts}, (), seed_claims())
    assert used == [Gpu("m5", 0, "Tesla P40", 24.0, "detected"), Gpu("m5", 2, "Tesla P40", 24.0, "detected")]
    assert [g.key for g, _ in left] == [("m5", 1)]
    # None (facts not gathered) and [] (none reported) fall back to the declared GPUs.
    assert (
        gpus_for([m5], {"m5": None}, (), seed_claims())
        == gpus_for([m5], {"m5": []}, (), seed_claims())
        == p40s()
    )


def test_a_gpu_list_naming_tesla_p4_takes_the_p4s_not_the_p40s() -> None:
    # Training and the orchestra share one reading of `gpus:`; "Tesla P4" is a word of "Tesla P40"
    # only as a substring, and the seed lab has both.
    host = Host(
        name="mix",
        address="10.0.0.1",
        gpus=[GPU(model="Tesla P40", memory_gb=24, count=2), GPU(model="Tesla P4", memory_gb=8, count=1)],
    )
    assert [g.name for g in train_gpus(host, {}, ["Tesla P4"])] == ["Tesla P4"]
    assert [g.model for g in gpus_for([host], {}, ["Tesla P4"])] == ["Tesla P4"]
    used, left = split_gpus([host], {}, (), {"mix": ["Tesla P4"]})
    assert [g.model for g in used] == ["Tesla P40", "Tesla P40"] and [g.model for g, _ in left] == [
        "Tesla P4"
    ]


def test_a_phase_without_gpus_keeps_every_gpu_of_its_hosts(tmp_path: Path) -> None:
    phases = tmp_path / "train.yaml"
    phases.write_text(
        "name: t\ndefaults: {hosts: m5}\nphases:\n  1: {gpus: [Tesla V100]}\n  2: {steps: 10}\n"
    )
    claims = training_claims(load_phases(phases), seed_inventory())
    assert claims == {"m5": []}
    with pytest.raises(InputError, match="no GPU"):
        place({"a": 1.0}, gpus_for([seed_inventory().host("m5")], {}, (), claims))


# --- placement ----------------------------------------------------------------------------------


def test_first_start_on_the_seed_lab_spreads_the_warm_set_largest_first() -> None:
    orch = packed_orchestra()
    c = choose(orch.names, orch.pinned, orch.warm, orch.rotate, [])
    placed = place(orch.needs(c.warm_after), seed_gpus())
    rows = [(r.gpu.index, r.models, round(r.free_gb, 1)) for r in placed.rows]
    assert rows == [
        (1, ["Llama-3.1-8B-Instruct"], 4.3),
        (2, ["Qwen2.5-Coder-7B-Instruct"], 5.3),
        (3, ["CodeLlama-7B-Instruct"], 7.4),
        (4, ["Phi-3-mini-4k-instruct", "Qwen2.5-Coder-14B-Instruct-Q4_K_M"], 3.1),
    ]
    assert place(orch.needs(c.warm_after), seed_gpus()).assignment() == placed.assignment()  # deterministic


def test_models_already_warm_stay_on_their_gpu_while_they_still_fit() -> None:
    gpus = p40s(2)
    placed = place({"a": 10, "b": 10, "new": 3}, gpus, keep={"a": ("m5", 2), "b": ("m5", 2)})
    assert placed.assignment() == {"a": ("m5", 2), "b": ("m5", 2), "new": ("m5", 1)}
    assert placed.kept == ["a", "b"]
    # A GPU that is gone, or one the kept models no longer fit (their need grew), is re-placed.
    placed = place({"a": 10, "b": 15}, gpus, keep={"a": ("m5", 9), "b": ("m5", 1)})
    assert placed.assignment() == {"a": ("m5", 2), "b": ("m5", 1)} and placed.kept == ["b"]
    placed = place({"a": 20, "b": 20}, gpus, keep={"a": ("m5", 1), "b": ("m5", 1)})
    assert placed.assignment() == {"a": ("m5", 1), "b": ("m5", 2)} and placed.kept == ["a"]


def test_where_spreading_leaves_no_room_the_tightest_fit_is_tried() -> None:
    gpus = [Gpu("h", 0, "A", 24.0, "declared"), Gpu("h", 1, "B", 16.0, "declared")]
    placed = place({"x": 16, "y": 12, "z": 12}, gpus)
    assert placed.assignment() == {"x": ("h", 1), "y": ("h", 0), "z": ("h", 0)}


def test_a_model_too_big_for_any_gpu_is_refused_with_its_need_and_the_largest_gpu() -> None:
    orch = Orchestra.model_validate(
        {
            "warm": 2,
            "rotate": 1,
            "models": [{"name": "Llama-3.1-70B-Instruct", "size_gb": 140}, {"name": "x", "size_gb": 4}],
        }
    )
    with pytest.raises(InputError) as e:
        place(orch.needs(), seed_gpus())
    msg = e.value.message
    assert "Cannot place Llama-3.1-70B-Instruct: it needs 168.5 GB" in msg
    assert "m5 GPU 1 (Tesla P40, 24 GB)" in msg and "no GPU of the orchestra is that big" in msg
    assert "bits: 4" in e.value.hint


def test_a_model_that_fits_a_gpu_but_not_beside_the_others_is_refused_saying_so() -> None:
    with pytest.raises(InputError) as e:
        place({"a": 20, "b": 20, "c": 20, "d": 20, "e": 20}, p40s())
    msg = e.value.message
    assert "Cannot place e: it needs 20.0 GB" in msg and "4.0 GB" in msg
    assert "would hold it empty, but the other models of the warm set" in msg


# --- the capacity view --------------------------------------------------------------------------


def test_the_capacity_view_of_the_seed_lab_beside_seed_000s_claims() -> None:
    inv, orch = seed_inventory(), seed_orchestra()
    lab_gpus = gpus_for(list(inv.hosts.values()), {}, (), seed_claims())  # every GPU but the V100
    assert sum(g.memory_gb for g in lab_gpus) == 124  # seed 000 §2.7: "124GB inference-optimized"
    rows = {r.label: r for r in capacity(lab_gpus, orch.overhead)}
    assert [(label, r.count, r.seed) for label, r in rows.items()] == [
        ("7B fp16", 4, "15-20"),
        ("13B fp16", 2, "8-10"),
        ("70B 4-bit", 2, "1-2"),
    ]
    assert rows["7B fp16"].need_gb == pytest.approx(17.3)
    assert [n for _, n in rows["7B fp16"].whole] == [1, 1, 1, 1] and rows["7B fp16"].split == []
    assert rows["13B fp16"].split == ["2x Tesla P40 on m5 (tensor parallel): 2 models"]
    assert rows["70B 4-bit"].split == ["2x Tesla P40 on m5 (tensor parallel): 2 models"]
    note = rows["7B fp16"].note
    assert (
        "below the lab's plan of 15-20" in note and "8.3 GB each, less than its weights alone (14 GB)" in note
    )
    assert "within the lab's plan of 1-2" in rows["70B 4-bit"].note
    # Small models pack several to a GPU.
    small = capacity(p40s(1), orch.overhead.model_copy(update={"fraction": 0.0, "context_gb": 0.0}))
    assert (
        small[0].count == 1 and capacity([Gpu("h", 0, "A100", 80.0, "declared")], orch.overhead)[0].count == 4
    )


# --- who leaves, who joins ----------------------------------------------------------------------

LIB = ["a", "b", "c", "d", "e", "f", "g", "h"]


def warm_of(names: list[str], since: dict[str, float] | None = None) -> list[dict[str, Any]]:
    return [{"name": n, "since": (since or {}).get(n, float(i))} for i, n in enumerate(names)]


def test_first_start_takes_pinned_models_first_then_the_librarys_order() -> None:
    c = choose(LIB, ["g"], 4, 2, [])
    assert (c.leaving, c.joining, c.cursor) == ([], ["g", "a", "b", "c"], "c")
    assert c.why["g"] == "pinned"
    c = choose(LIB, ["g"], 4, 2, [], in_=["h"])
    assert c.joining == ["g", "h", "a", "b"]


def test_the_least_recently_rotated_in_leave_and_the_next_in_order_join() -> None:
    current = warm_of(["a", "b", "c", "d"], {"a": 50, "b": 10, "c": 20, "d": 40})
    c = choose(LIB, [], 4, 2, current, cursor="d")
    assert (c.leaving, c.joining, c.cursor) == (["b", "c"], ["e", "f"], "f")
    assert c.warm_after == ["a", "d", "e", "f"]
    # The cursor wraps round the library and skips warm models.
    c = choose(LIB, [], 4, 2, warm_of(["g", "a", "b", "h"]), cursor="h")
    assert c.joining == ["c", "d"] and c.leaving == ["g", "a"]


def test_pinned_models_never_leave_however_long_they_have_been_warm() -> None:
    current = warm_of(["a", "b", "c"], {"a": 0, "b": 5, "c": 6})
    cursor = None
    for _ in range(20):
        c = choose(LIB, ["a"], 3, 2, current, cursor)
        cursor = c.cursor
        assert "a" not in c.leaving and "a" in c.warm_after and len(c.warm_after) == 3
        t = max(float(x["since"]) for x in current) + 1
        current = [x for x in current if x["name"] not in c.leaving] + [
            {"name": n, "since": t} for n in c.joining
        ]
    with pytest.raises(InputError) as e:
        choose(LIB, ["a"], 3, 2, current, out=["a"])
    assert "pinned" in e.value.message and "pinned:" in e.value.hint


def test_in_and_out_name_who_swaps_and_wrong_names_say_the_fix() -> None:
    current = warm_of(["a", "b", "c", "d"])
    c = choose(LIB, [], 4, 2, current, cursor="d", out=["c"])
    assert (c.leaving, c.joining) == (["c"], ["e"])
    c = choose(LIB, [], 4, 2, current, cursor="d", in_=["h"])
    assert (c.leaving, c.joining, c.cursor) == (["a"], ["h"], "d")  # a named model does not move the cursor
    c = choose(LIB, [], 4, 2, current, out=["b", "c"], in_=["g", "h"])
    assert (c.leaving, c.joining) == (["b", "c"], ["g", "h"])
    cases = [
        ({"out": ["e"]}, "--out e: it is not warm", "Warm now: a, b, c, d"),
        ({"out": ["zz"]}, "--out 'zz' is not a model", "Name one of"),
        ({"in_": ["c"]}, "--in c: it is already warm", "not warm"),
        ({"in_": ["hh"]}, "--in 'hh' is not a model", "Did you mean 'h'?"),
    ]
    for kw, message, hint in cases:
        with pytest.raises(InputError) as e:
            choose(LIB, [], 4, 2, current, **kw)
        assert message in e.value.message and hint in e.value.hint


def test_the_warm_set_comes_back_to_its_size_and_drops_models_gone_from_the_library() -> None:
    # warm lowered from 4 to 3: one more leaves than rotate says.
    c = choose(LIB, [], 3, 1, warm_of(["a", "b", "c", "d"]), cursor="d")
    assert (c.leaving, c.joining) == (["a", "b"], ["e"])
    # A model no longer in the library leaves on top of the rotation; a pinned one not warm joins.
    c = choose(LIB, ["h"], 4, 1, warm_of(["a", "gone", "b", "c"]), cursor="c")
    assert c.leaving == ["gone", "a"] and c.joining == ["h", "d"]
    assert c.why["gone"] == "no longer in the library" and c.why["h"] == "pinned, not warm"
    c = choose(LIB, [], 4, 1, warm_of(["a", "gone", "b", "c"]), out=["gone"])
    assert (c.leaving, c.joining, c.warm_after) == (["gone"], ["d"], ["a", "b", "c", "d"])
    # A library with nothing left to join: nobody leaves.
    c = choose(["a", "b", "c"], [], 3, 1, warm_of(["a", "b", "c"]))
    assert isinstance(c, Choice) and (c.leaving, c.joining) == ([], [])


# --- the order of steps -------------------------------------------------------------------------


def test_joiners_start_before_leavers_stop_where_the_gpu_has_room() -> None:
    gpus = p40s(2)
    before = placement_of({"a": ("m5", 1), "b": ("m5", 2)}, {"a": 10, "b": 10}, gpus)
    after = place({"a": 10, "c": 10}, gpus, keep=before.assignment())
    assert after.assignment() == {"a": ("m5", 1), "c": ("m5", 2)}
    steps = order_steps(before, after)
    assert [s.as_tuple() for s in steps] == [("start", "c", "m5", 2), ("stop", "b", "m5")]
    assert {s.mode for s in steps} == {"make-before-break"} and lowest_warm(2, steps) == 2


def test_where_the_gpu_is_full_the_leaver_stops_first_one_pair_at_a_time() -> None:
    orch, gpus = packed_orchestra(), seed_gpus()
    first = choose(orch.names, orch.pinned, orch.warm, orch.rotate, [])
    before = place(orch.needs(first.warm_after), gpus)
    current = [{"name": n, "since": 0} for n in first.warm_after]
    nxt = choose(orch.names, orch.pinned, orch.warm, orch.rotate, current, cursor=first.cursor)
    after = place(orch.needs(nxt.warm_after), gpus, keep=before.assignment())
    steps = order_steps(before, after)
    assert [(s.as_tuple(), s.mode) for s in steps] == [
        (("stop", "CodeLlama-7B-Instruct", "m5"), "break-before-make"),
        (("start", "Mistral-7B-Instruct-v0.3", "m5", 3), "break-before-make"),
        (("stop", "Phi-3-mini-4k-instruct", "m5"), "break-before-make"),
        (("start", "Llama-3.2-3B-Instruct", "m5", 4), "break-before-make"),
    ]
    assert lowest_warm(5, steps) == 4  # one model short at a time, never two


def test_make_before_break_starts_come_first_and_moved_models_stop_then_start() -> None:
    gpus = [*p40s(2), Gpu("m5", 3, "Tesla P40", 24.0, "declared")]
    before = placement_of({"a": ("m5", 1), "b": ("m5", 2), "m": ("m5", 3)}, {"a": 20, "b": 10, "m": 5}, gpus)
    after = placement_of(
        {"j1": ("m5", 1), "b": ("m5", 2), "j2": ("m5", 2), "m": ("m5", 1)},
        {"j1": 10, "b": 10, "j2": 10, "m": 5},
        gpus,
    )
    steps = order_steps(before, after)
    assert [(s.action, s.model, s.mode) for s in steps] == [
        ("start", "j2", "make-before-break"),
        ("stop", "m", "move"),
        ("stop", "a", "break-before-make"),
        ("start", "m", "move"),
        ("start", "j1", "break-before-make"),
    ]
    assert all(isinstance(s, Step) for s in steps) and lowest_warm(3, steps) == 2


def test_a_day_of_rotations_on_the_seed_lab_always_places_and_keeps_the_pinned_model() -> None:
    orch, gpus = seed_orchestra(), seed_gpus()
    current: list[dict[str, Any]] = []
    cursor: str | None = None
    before: Placement | None = None
    joined: set[str] = set()
    for t in range(1, 31):  # five days at 4h
        c = choose(orch.names, orch.pinned, orch.warm, orch.rotate, current, cursor)
        after = place(orch.needs(c.warm_after), gpus, keep=before.assignment() if before else None)
        if before is not None:
            steps = order_steps(before, after)
            assert lowest_warm(orch.warm, steps) >= orch.warm - 1
            assert len(c.leaving) == len(c.joining) == orch.rotate
            assert set(after.kept) == set(c.warm_after) - set(c.joining)  # nobody staying moves
        assert set(orch.pinned) <= set(c.warm_after) and len(c.warm_after) == orch.warm
        joined |= set(c.joining)
        current = [x for x in current if x["name"] not in c.leaving] + [
            {"name": n, "since": t} for n in c.joining
        ]
        cursor, before = c.cursor, after
    assert joined == set(orch.names)  # every model of the library had its turn


def test_named_swaps_that_cannot_keep_the_warm_set_whole_are_refused() -> None:
    with pytest.raises(InputError) as e:
        choose(["a", "b", "c"], [], 3, 1, warm_of(["a", "b", "c"]), out=["b"])
    assert "no model of the library is left to take its place" in e.value.message
    with pytest.raises(InputError) as e:
        choose(LIB, ["h"], 2, 1, warm_of(["a", "b"]), in_=["e", "f"])
    assert "3 models would have to join (h, e, f) but the warm set holds 2" in e.value.message


def test_any_rotation_keeps_the_warm_size_the_pinned_models_and_swaps_what_it_can() -> None:
    import random

    rng = random.Random(12)  # a fixed sample of states: warm sets short, over-full or stale
    for _ in range(3000):
        lib = [f"m{i}" for i in range(rng.randint(2, 10))]
        warm = rng.randint(2, len(lib))
        rotate = rng.randint(1, warm - 1)
        pinned = rng.sample(lib, rng.randint(0, warm - rotate))
        names = rng.sample([*lib, "gone1", "gone2"], rng.randint(0, min(len(lib) + 2, warm + 2)))
        cursor = rng.choice([*lib, None, "gone1"])
        c = choose(
            lib, pinned, warm, rotate, [{"name": n, "since": rng.randint(0, 5)} for n in names], cursor
        )
        staying = set(names) - set(c.leaving)
        assert len(c.warm_after) == len(set(c.warm_after)) == warm
        assert set(c.leaving) <= set(names) and not set(c.joining) & staying
        assert set(pinned) <= set(c.warm_after) and not set(pinned) & set(c.leaving)
        assert set(c.warm_after) <= set(lib)
        live = [n for n in names if n in lib]
        if names:  # as many swap as rotate says, after refilling a short set, where models are there
            outside = len(lib) - len(live) - max(0, warm - len(live))
            can = max(0, min(rotate, len([n for n in live if n not in pinned]), outside))
            assert len([n for n in c.leaving if n in lib]) - max(0, len(live) - warm) >= can
