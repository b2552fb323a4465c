"""Engines as declared contracts (labctl/orchestra/engines/): a model's format and its GPU's
compute capability are checked against its engine when the orchestra is planned, before a host
is touched, and every refusal names the way that works. Pure: no host, no server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from labctl.orchestra.decide import fitted, plan_placement
from labctl.orchestra.engines import ENGINES, engine
from labctl.orchestra.fit import check_models
from labctl.orchestra.place import Gpu
from labctl.orchestra.rotate import start_args
from labctl.orchestra.sizes import kv_cache_gb
from labctl.orchestra.spec import Orchestra, load_orchestra, serving_hosts
from labctl.output.errors import InputError
from tests.unit.test_orchestra_plan import seed_claims, seed_inventory, seed_orchestra

P40 = (6, 1)


def p40(i: int) -> Gpu:
    return Gpu("m5", i, "Tesla P40", 24.0, "declared", P40)


def library(*models: dict[str, Any], **extra: Any) -> Orchestra:
    return Orchestra.model_validate({"warm": 2, "rotate": 1, "models": list(models), **extra})


HF = {"format": "hf", "weight_bytes": 2_000_000_000, "params": 1_000_000_000, "dtype": "BF16",
      "context": 32768, "layers": 28, "heads": 12, "kv_heads": 2, "head_dim": 128, "storage": "irina"}  # fmt: skip
GGUF = {"format": "gguf", "weight_bytes": 8_100_000_000, "params": 7_600_000_000, "dtype": "Q8_0",
        "context": 32768, "layers": 28, "heads": 28, "kv_heads": 4, "head_dim": 128, "storage": "irina"}  # fmt: skip


def test_every_engine_is_one_declared_contract_in_its_own_file() -> None:
    for key in ENGINES:
        e = engine(key)
        assert e.name == key and e.formats and e.health.startswith("/")
        assert e.ready_by_completion  # every engine is ready only once a one-token completion answered
    assert engine("vllm").min_cap == (7, 5) and not engine("vllm").serves("gguf")
    assert engine("llama.cpp").serves("gguf") and not engine("llama.cpp").serves("hf")
    assert (
        engine("labctl").serves("hf")
        and engine("labctl").serves("tinylm")
        and not engine("labctl").serves("gguf")
    )


def test_vllm_on_a_p40_is_refused_at_plan_time_naming_llama_cpp_and_gguf() -> None:
    o = library(
        {"name": "coder", "engine": "vllm", "size_gb": 15},
        {"name": "b", "size_gb": 1},
        {"name": "c", "size_gb": 1},
    )
    fits = check_models(o, {}, [p40(1), p40(2)])
    text = fits["coder"].refusal or ""
    assert "vLLM needs compute capability 7.5 or higher" in text
    assert "m5 GPU 1 is a Tesla P40 (6.1)" in text
    assert "serve this model as GGUF with engine llama.cpp" in text
    assert fits["b"].refusal is None and fits["b"].allowed == {("m5", 1), ("m5", 2)}
    with pytest.raises(InputError, match=r"vLLM needs compute capability 7\.5"):
        fitted(o, {}, [p40(1), p40(2)], o.names)


def test_vllm_goes_only_to_the_gpus_it_runs_on() -> None:
    a100 = Gpu("m5", 3, "A100", 40.0, "detected", (8, 0))
    o = library(
        {"name": "coder", "engine": "vllm", "size_gb": 15},
        {"name": "b", "size_gb": 1},
        {"name": "c", "size_gb": 1},
    )
    needs, allowed, _ = fitted(o, {}, [p40(1), a100], o.names)
    assert allowed["coder"] == {("m5", 3)}
    from labctl.orchestra.place import place

    # The P40 has more room free, but the model may only go to the A100.
    placed = place({"coder": needs["coder"]}, [p40(1), a100], allowed=allowed)
    assert placed.assignment() == {"coder": ("m5", 3)}


def test_a_gguf_file_given_to_labctls_server_is_refused_naming_llama_cpp() -> None:
    o = library({"name": "q", "size_gb": 8}, {"name": "b", "size_gb": 1}, {"name": "c", "size_gb": 1})
    fits = check_models(o, {"q": GGUF}, [p40(1)])
    text = fits["q"].refusal or ""
    assert "labctl's server does not serve a GGUF file" in text
    assert "serve it with engine llama.cpp" in text
    # Typed, before the files are there, it is refused alike.
    typed = library(
        {"name": "q", "format": "gguf", "size_gb": 8},
        {"name": "b", "size_gb": 1},
        {"name": "c", "size_gb": 1},
    )
    assert "does not serve a GGUF file" in (check_models(typed, {}, [p40(1)])["q"].refusal or "")
    # The same file with engine llama.cpp fits the P40.
    ok = library(
        {"name": "q", "engine": "llama.cpp"}, {"name": "b", "size_gb": 1}, {"name": "c", "size_gb": 1}
    )
    assert check_models(ok, {"q": GGUF}, [p40(1)])["q"].refusal is None


def test_needs_come_from_the_files_weights_plus_the_kv_cache_of_the_served_context() -> None:
    o = library(
        {"name": "q", "engine": "llama.cpp", "context": 8192}, {"name": "h"}, {"name": "c", "size_gb": 1}
    )
    needs, _, fits = fitted(o, {"q": GGUF, "h": HF}, [p40(1)], o.names)
    kv = 2 * 28 * 4 * 128 * 8192 * 2 / 1e9
    assert kv_cache_gb(GGUF, 8192) == pytest.approx(kv)
    assert needs["q"] == pytest.approx(8.1 * 1.05 + kv + 0.5)
    # labctl's server computes bf16 weights in fp32 on a P40: twice the bytes; 4096 is the default context.
    assert needs["h"] == pytest.approx(2 * 2.0 * 1.05 + kv_cache_gb(HF, 4096) + 0.5)
    assert fits["q"].context == 8192 and fits["h"].context == 4096
    # A served context is capped at the model's own.
    short = library(
        {"name": "q", "engine": "llama.cpp", "context": 65536}, {"name": "h"}, {"name": "c", "size_gb": 1}
    )
    assert check_models(short, {"q": GGUF, "h": HF}, [p40(1)])["q"].context == 32768


def test_a_model_with_neither_files_nor_size_is_refused_naming_both_ways() -> None:
    o = library({"name": "h"}, {"name": "b", "size_gb": 1}, {"name": "c", "size_gb": 1})
    with pytest.raises(InputError) as e:
        fitted(o, {}, [p40(1)], o.names)
    assert "no size_gb and its files were not read" in e.value.message


def test_a_typed_size_far_from_the_files_and_a_wrong_typed_format_are_named() -> None:
    o = library(
        {"name": "q", "engine": "llama.cpp", "size_gb": 4.0, "format": "hf"},
        {"name": "b", "size_gb": 1},
        {"name": "c", "size_gb": 1},
    )
    fits = check_models(o, {"q": GGUF}, [p40(1)])
    notes = " ".join(fits["q"].notes)
    assert "types 4 GB of weights but the files hold 8.10 GB" in notes
    assert "the file says format hf but its files are a GGUF file" in notes
    assert fits["q"].format == "gguf" and fits["q"].refusal is None
    within = library(
        {"name": "q", "engine": "llama.cpp", "size_gb": 8.5},
        {"name": "b", "size_gb": 1},
        {"name": "c", "size_gb": 1},
    )
    assert check_models(within, {"q": GGUF}, [p40(1)])["q"].notes == []


def test_llama_cpp_starts_bound_to_every_interface_serving_the_orchestras_name() -> None:
    o = library(
        {"name": "Coder-Q8", "engine": "llama.cpp", "context": 2048},
        {"name": "b", "size_gb": 1},
        {"name": "c", "size_gb": 1},
    )
    args = start_args(o, "Coder-Q8", 2, GGUF)
    cmd = args["command"]
    assert "--host 0.0.0.0" in cmd and "--alias Coder-Q8" in cmd and "-c 2048" in cmd
    assert "--n-gpu-layers 999" in cmd and "{port}" in cmd and "{file}" in cmd and cmd.startswith("{binary} ")
    assert args["binary"] == "llama-server" and args["cuda_check"] == "build.json"
    assert "loading model" in args["loading_words"] and args["ready_by_completion"]
    assert "--n-gpu-layers 0" in start_args(o, "Coder-Q8", None, GGUF)["command"]
    pinned = library(
        {"name": "Coder-Q8", "engine": "llama.cpp"},
        {"name": "b", "size_gb": 1},
        {"name": "c", "size_gb": 1},
        server={"binaries": {"llama.cpp": "/opt/llama/bin/llama-server"}},
    )
    assert start_args(pinned, "Coder-Q8", 0, GGUF)["binary"] == "/opt/llama/bin/llama-server"
    # labctl's own server: no template, the torch python starts it.
    assert start_args(o, "b", 0, None)["command"] is None
    # A file's server.command is the command engine's template, kept as written.
    custom = library(
        {"name": "a", "size_gb": 1},
        {"name": "b", "size_gb": 1},
        server={"command": "srv --port {port} {path}"},
    )
    assert start_args(custom, "a", 0, None)["command"] == "srv --port {port} {path}"


def test_the_shipped_orchestra_names_a_format_and_an_engine_that_fit_the_p40s() -> None:
    o = seed_orchestra()
    inv = seed_inventory()
    from labctl.orchestra.place import gpus_for

    gpus = gpus_for(serving_hosts(o, inv), {}, o.gpus, seed_claims())
    assert gpus and all(g.cap == P40 for g in gpus)
    fits = check_models(o, {}, gpus)
    assert all(m.format in ("hf", "gguf") for m in o.models)
    assert [f.refusal for f in fits.values() if f.refusal] == []
    assert {f.engine for f in fits.values()} == {"labctl", "llama.cpp"}
    assert all(f.engine == "llama.cpp" for n, f in fits.items() if o.model(n).format == "gguf")
    view = plan_placement(inv, o, serving_hosts(o, inv), None)
    assert len(view.warm) == o.warm and view.models[0]["engine"] == "llama.cpp"


def test_plan_json_shows_each_models_format_engine_and_kv_cache(tmp_path: Path) -> None:
    o = load_orchestra(Path(__file__).resolve().parents[2] / "playbooks/orchestra.yaml")
    inv = seed_inventory()
    name = o.names[0]
    view = plan_placement(inv, o, serving_hosts(o, inv), None, {name: GGUF})
    row = next(m for m in view.to_json()["models"] if m["name"] == name)
    assert row["format"] == "gguf" and row["engine"] == "llama.cpp" and row["params"] == 7_600_000_000
    assert row["kv_gb"] == pytest.approx(kv_cache_gb(GGUF, 4096)) and row["source"] == "files on irina"
