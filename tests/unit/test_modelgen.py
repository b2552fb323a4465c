"""tinylm's shapes without torch, and checkpoints written by the stdlib-only generator."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.core.errors import AgentError
from labctl.agent.modelload.modelgen import INDEX_NAME, make_model, make_model_command, normal_block
from labctl.agent.models.tinylm import config_for_size, make_config, param_count, param_shapes

REPO = Path(__file__).resolve().parents[2]
PY38 = Path("/root/.pyenv/versions/3.8.18/bin/python3")
MB = 1_000_000

CONFIGS = [
    make_config(vocab=256, d_model=64, n_layers=1, n_heads=1, d_ff=256, max_seq=128),
    make_config(vocab=300, d_model=96, n_layers=3, n_heads=3, d_ff=200, max_seq=64, tie_embeddings=True),
    make_config(vocab=512, d_model=128, n_layers=2, n_heads=2, d_ff=376, max_seq=256, dtype="fp32"),
]


@pytest.mark.parametrize(
    "target", [1 * MB, 4 * MB, 64 * MB, 1000 * MB, 7_000 * MB, 14_000 * MB, 70_000 * MB], ids=str
)
@pytest.mark.parametrize("dtype_bytes", [2, 4])
def test_config_for_size_is_close_and_well_formed(target: int, dtype_bytes: int) -> None:
    config = config_for_size(target, dtype_bytes)
    assert abs(param_count(config) * dtype_bytes - target) / target < 0.01
    assert config["d_model"] % config["n_heads"] == 0 and config["d_model"] // config["n_heads"] == 64
    # A transformer, not an embedding table: the blocks hold most of the weights.
    block = config["n_layers"] * (4 * config["d_model"] ** 2 + 2 * config["d_model"] * config["d_ff"])
    assert block > 0.5 * param_count(config)


def test_shapes_follow_the_config_arithmetic() -> None:
    c = CONFIGS[0]
    shapes = param_shapes(c)
    assert shapes["embed.weight"] == ((256, 64), "BF16")
    assert shapes["blocks.0.attn.qkv.weight"] == ((192, 64), "BF16")
    assert shapes["blocks.0.mlp.proj.weight"] == ((64, 256), "BF16")
    assert "lm_head.weight" in shapes and "lm_head.weight" not in param_shapes(CONFIGS[1])
    assert param_shapes(CONFIGS[2])["ln_f.bias"] == ((128,), "F32")
    with pytest.raises(ValueError, match="multiple of n_heads"):
        make_config(vocab=10, d_model=100, n_layers=1, n_heads=3, d_ff=10, max_seq=8)
    with pytest.raises(ValueError, match="n_layers must be a positive integer"):
        param_shapes(dict(c, n_layers=0))


torch = None
try:
    import torch
except ImportError:
    pass
needs_torch = pytest.mark.skipif(torch is None, reason="building the model needs torch")


@needs_torch
@pytest.mark.parametrize("config", CONFIGS, ids=["small", "tied", "fp32"])
def test_param_shapes_equal_the_module_state_dict(config: dict[str, Any]) -> None:
    from labctl.agent.models.tinylm import build_model

    state = build_model(config).state_dict()
    shapes = param_shapes(config)
    assert list(shapes) == list(state)  # same names in the same order
    for name, (shape, _) in shapes.items():
        assert tuple(state[name].shape) == shape, name
    assert param_count(config) == sum(t.numel() for t in state.values())


@needs_torch
def test_built_on_meta_then_given_weights_is_complete() -> None:
    """bench model-load builds on the meta device and assigns loaded tensors: nothing may stay on meta."""
    from labctl.agent.models.tinylm import build_model

    config = CONFIGS[1]
    real = build_model(config)
    with torch.device("meta"):
        model = build_model(config)
    model.load_state_dict(real.state_dict(), strict=True, assign=True)
    assert not any(t.is_meta for t in model.state_dict().values())
    tokens = torch.randint(0, config["vocab"], (2, 16))
    assert torch.equal(model(tokens), real(tokens))


def check_checkpoint(folder: Path, answer: dict[str, Any]) -> None:
    """Loads with safetensors, finite, exactly the module's names/shapes, forward pass finite."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from labctl.agent.models.tinylm import build_model, storage_dtype

    config = json.loads((folder / "config.json").read_text())
    assert config == answer["config"]
    weights: dict[str, Any] = {}
    shards = [f["name"] for f in answer["files"] if f["name"].endswith(".safetensors")]
    for name in shards:
        weights.update(load_file(str(folder / name)))
        with safe_open(str(folder / name), framework="pt") as f:
            assert json.loads(f.metadata()["config"]) == config
    model = build_model(config)
    expected = model.state_dict()
    assert sorted(weights) == sorted(expected)
    want_dtype = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}[storage_dtype(config)]
    for name, t in weights.items():
        assert t.shape == expected[name].shape and t.dtype == want_dtype, name
        assert bool(torch.isfinite(t).all()), name
        if name.endswith("ln1.weight"):
            assert bool((t == 1).all())
        if name.endswith(".bias"):
            assert bool((t == 0).all())
    big = weights["blocks.0.mlp.fc.weight"].float()
    assert abs(big.std().item() - 0.02) < 0.002 and abs(big.mean().item()) < 0.002
    # Two weight matrices of the same shape must not hold the same values.
    assert not torch.equal(weights["blocks.0.attn.proj.weight"], weights["embed.weight"][: config["d_model"]])
    model.load_state_dict(weights, strict=True)
    logits = model(torch.randint(0, config["vocab"], (1, 32)))
    assert logits.shape == (1, 32, config["vocab"]) and bool(torch.isfinite(logits).all())


@needs_torch
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_make_model_writes_a_loadable_checkpoint(tmp_path: Path, dtype: str) -> None:
    size = 4 * MB
    answer = make_model(str(tmp_path), size, dtype=dtype, seed=1)
    assert [f["name"] for f in answer["files"]] == ["model.safetensors", "config.json"]
    weights = (tmp_path / "model.safetensors").stat().st_size
    assert abs(weights - size) / size < 0.05
    assert answer["bytes"] == sum(os.path.getsize(tmp_path / f["name"]) for f in answer["files"])
    check_checkpoint(tmp_path, answer)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]  # no temp file left


@needs_torch
def test_sharded_checkpoint_and_regeneration_replaces_it(tmp_path: Path) -> None:
    answer = make_model(str(tmp_path), 8 * MB, shard_bytes=3 * MB)
    shards = [f["name"] for f in answer["files"] if f["name"].endswith(".safetensors")]
    assert len(shards) >= 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    assert index["metadata"]["total_size"] == param_count(answer["config"]) * 2
    from labctl.agent.modelload.loader import load_model_dir, read_header

    for name in shards:
        header = read_header(str(tmp_path / name))
        # A shard only goes over the limit when it holds one tensor larger than the limit.
        assert header.data_bytes <= 3 * MB or len(header.tensors) == 1
    check_checkpoint(tmp_path, answer)

    assert sorted(load_model_dir(tmp_path)) == sorted(index["weight_map"])
    # The same folder rewritten unsharded holds one model again: old shards and index gone.
    again = make_model(str(tmp_path), 2 * MB)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    check_checkpoint(tmp_path, again)


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a = make_model(str(tmp_path / "a"), 2 * MB, seed=5)
    b = make_model(str(tmp_path / "b"), 2 * MB, seed=5)
    c = make_model(str(tmp_path / "c"), 2 * MB, seed=6)
    data = [(tmp_path / x / "model.safetensors").read_bytes() for x in "abc"]
    assert a["config"] == b["config"] == c["config"]
    assert data[0] == data[1] and data[0] != data[2]


def test_block_values_are_finite_and_small() -> None:
    import array
    import struct

    f32 = array.array("f", normal_block("F32", 0, 4096))
    assert all(abs(v) <= 0.12 for v in f32) and 0.015 < (sum(v * v for v in f32) / len(f32)) ** 0.5 < 0.025
    f16 = struct.unpack("<4096e", normal_block("F16", 0, 4096))
    assert all(abs(v) <= 0.12 for v in f16)
    bf16 = normal_block("BF16", 0, 4096)
    # bf16 bits are the top half of the float32's: widen back and compare.
    widened = struct.unpack("<4096f", b"".join(b"\0\0" + bf16[i : i + 2] for i in range(0, len(bf16), 2)))
    assert all(abs(w - v) <= abs(v) / 64 for w, v in zip(widened, f32, strict=True))


def test_command_checks_its_arguments(tmp_path: Path) -> None:
    with pytest.raises(AgentError) as info:
        make_model_command({"path": str(tmp_path), "size_gb": 0})
    assert info.value.kind == "bad_args"
    with pytest.raises(AgentError, match="bf16, fp16 or fp32"):
        make_model_command({"path": str(tmp_path), "size_gb": 0.001, "dtype": "int4"})
    with pytest.raises(AgentError, match="folder path"):
        make_model_command({"size_gb": 1})
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(AgentError) as info:
        make_model_command({"path": str(blocker / "sub"), "size_gb": 0.001})
    assert info.value.kind == "io"


@pytest.mark.skipif(not PY38.exists(), reason=f"no Python 3.8 interpreter at {PY38}")
def test_agent_command_under_python38_without_torch(tmp_path: Path) -> None:
    """The storage host runs the shipped zipapp under its own python3: 3.8, no torch, no numpy."""
    from labctl.hosts.agent_ship import agent_zip

    pyz = tmp_path / "agent.pyz"
    pyz.write_bytes(agent_zip()[0])
    args = {"path": str(tmp_path / "m"), "size_gb": 0.006, "dtype": "bf16", "seed": 2, "shard_gb": 0.004}
    guard = "import runpy, sys; sys.modules['torch'] = sys.modules['numpy'] = None; "
    guard += (
        f"sys.argv = ['agent', 'modelload.make_model', {json.dumps(args)!r}]; runpy.run_path({str(pyz)!r})"
    )
    proc = subprocess.run([str(PY38), "-c", guard], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    answer = json.loads(proc.stdout)
    assert [f["name"] for f in answer["files"]][-2:] == [INDEX_NAME, "config.json"]
    assert abs(answer["bytes"] - 6 * MB) / (6 * MB) < 0.05
    if torch is not None:
        check_checkpoint(tmp_path / "m", answer)


@pytest.mark.slow
def test_write_throughput_is_reported(tmp_path: Path) -> None:
    """Prints the generator's write rate (a figure for the reader, not a timed assertion)."""
    start = time.perf_counter()
    answer = make_model(str(tmp_path), 200 * MB)
    seconds = time.perf_counter() - start
    print(
        f"\nmake_model: {answer['bytes'] / MB:.0f} MB in {seconds:.2f} s = {answer['bytes'] / seconds / MB:.0f} MB/s"
    )
    assert answer["bytes"] >= 190 * MB


MAKE_INV = """\
lab: t
defaults: {connection: local}
hosts:
  b:
    address: 10.0.0.2
    roles: [storage]
    storage: {models: MODELS}
"""


def _made(tmp_path: Path, library: str, name: str, *extra: str) -> str:
    """`labctl bench make-model --name NAME` (tinylm, 1 MB) into `library`: its weights' sha256."""
    import hashlib
    import sys

    lib = tmp_path / library
    lib.mkdir(exist_ok=True)
    inv = tmp_path / f"{library}.yaml"
    inv.write_text(MAKE_INV.replace("MODELS", str(lib)))
    argv = ["-i", str(inv), "bench", "make-model", "--size-gb", "0.001", "--name", name, *extra]
    proc = subprocess.run(
        [sys.executable, "-m", "labctl", *argv], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted((lib / name).glob("*.safetensors"))
    assert files
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()


def test_make_model_seeds_from_the_name_unless_seed_is_given(tmp_path: Path) -> None:
    a, b = _made(tmp_path, "lib", "demo-a"), _made(tmp_path, "lib", "demo-b")
    assert a != b  # two names, two models: they answer differently
    assert _made(tmp_path, "lib2", "demo-a") == a  # the same name writes the same bytes again
    seeded = _made(tmp_path, "lib", "s-a", "--seed", "3")
    assert _made(tmp_path, "lib", "s-b", "--seed", "3") == seeded != a
    assert _made(tmp_path, "lib3", "demo-a", "--seed", "3") == seeded  # --seed wins over the name
