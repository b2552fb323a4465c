"""What a model folder holds, told from its headers alone (labctl/agent/modelload/formats.py):
real GGUF files written by the `gguf` package, the tiny Hugging Face Llama, tinylm checkpoints,
and the broken inputs a storage host really has (cut-off downloads, wrong files, stray copies)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from labctl.agent import commands
from labctl.agent.commands import answer_problem
from labctl.agent.core.errors import AgentError
from labctl.agent.modelload import formats
from labctl.agent.modelload.formats import (
    FILE_TYPES,
    GGML_TYPES,
    describe,
    kv_cache_bytes,
    read_gguf,
)
from labctl.agent.modelload.modelgen import make_model
from labctl.agent.models.tinylm import make_config, param_count

REPO = Path(__file__).resolve().parents[2]
PY38 = Path("/root/.pyenv/versions/3.8.18/bin/python3")
TINY = make_config(vocab=256, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq=64)
TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
TOKENS = 50_000


def write_gguf(
    path: Path,
    tokens: int = TOKENS,
    file_type: Any = None,
    template: bool = True,
    key_length: int | None = None,
    big_endian: bool = False,
    split_max_tensors: int = 0,
) -> dict[str, int]:
    """A small llama GGUF (F32, F16 and Q8_0 tensors); returns the params and bytes written,
    counted from the arrays handed to the writer, not from any GGUF arithmetic."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    Q = gguf.GGMLQuantizationType
    endian = gguf.GGUFEndian.BIG if big_endian else gguf.GGUFEndian.LITTLE
    w = gguf.GGUFWriter(str(path), "llama", endianess=endian, split_max_tensors=split_max_tensors)
    w.add_context_length(4096)
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(8)
    w.add_head_count_kv(2)
    if key_length is not None:
        w.add_key_length(key_length)
    if template:
        w.add_chat_template(TEMPLATE)
    if file_type is not None:
        w.add_file_type(file_type)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i}" for i in range(tokens)])
    w.add_token_scores([0.0] * tokens)  # a numeric array a vocabulary long: seeked over
    rng = np.random.default_rng(0)
    f32 = rng.standard_normal((16, 64)).astype(np.float32)
    f16 = rng.standard_normal((64, 64)).astype(np.float16)
    ffn = rng.standard_normal((128, 64)).astype(np.float32)
    q8 = gguf.quants.quantize(ffn, Q.Q8_0)
    w.add_tensor("token_embd.weight", f32)
    w.add_tensor("blk.0.attn_q.weight", f16)
    w.add_tensor("blk.0.ffn_up.weight", q8, raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"params": f32.size + f16.size + ffn.size, "bytes": f32.nbytes + f16.nbytes + q8.nbytes}


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    path = tmp_path_factory.mktemp("gguf") / "model.gguf"
    return path, write_gguf(path)


# ---- the tables copied from the gguf package ----


def test_ggml_type_sizes_are_the_gguf_packages() -> None:
    constants = pytest.importorskip("gguf.constants")
    theirs = {t.value: (t.name, *constants.GGML_QUANT_SIZES[t]) for t in constants.GGMLQuantizationType}
    assert theirs == GGML_TYPES


def test_file_type_names_are_the_gguf_packages() -> None:
    constants = pytest.importorskip("gguf.constants")
    theirs = {
        t.value: t.name.replace("MOSTLY_", "", 1).replace("ALL_", "", 1)
        for t in constants.LlamaFileType
        if t.name != "GUESSED"
    }
    assert theirs == FILE_TYPES
    assert FILE_TYPES[15] == "Q4_K_M"


# ---- GGUF ----


def test_gguf_header_gives_sizes_geometry_and_template(gguf_model: tuple[Path, dict[str, int]]) -> None:
    path, written = gguf_model
    d = describe(str(path))
    assert d["format"] == "gguf"
    assert d["file"] == ["model.gguf"]
    assert d["params"] == written["params"]
    assert d["weight_bytes"] == written["bytes"]
    assert d["bits_per_weight"] == pytest.approx(written["bytes"] * 8 / written["params"], abs=1e-4)
    # No general.file_type: the type holding most of the weights names the file.
    assert d["dtype"] == "Q8_0" and d["quantization"] is None
    assert (d["arch"], d["context"], d["layers"], d["hidden"]) == ("llama", 4096, 2, 64)
    # No key_length: head_dim is embedding_length / head_count.
    assert (d["heads"], d["kv_heads"], d["head_dim"]) == (8, 2, 8)
    assert d["vocab"] == TOKENS  # no llama.vocab_size: the token list's length
    assert d["chat_template"] is True
    assert (d["gguf_version"], d["tensor_count"]) == (3, 3)
    assert d["problems"] == []
    assert json.loads(json.dumps(d)) == d


def test_gguf_sizes_agree_with_the_gguf_packages_reader(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    write_gguf(path, tokens=10)  # GGUFReader reads every token: a long list would cost seconds
    reader = gguf.GGUFReader(str(path))
    g = read_gguf(str(path))
    assert [t.name for t in g.tensors] == [t.name for t in reader.tensors]
    assert [t.offset for t in g.tensors] == [int(t.data_offset) - g.data_start for t in reader.tensors]
    assert describe(str(path))["weight_bytes"] == sum(int(t.n_bytes) for t in reader.tensors)


def test_gguf_token_list_is_skipped_not_kept(gguf_model: tuple[Path, dict[str, int]]) -> None:
    path, _ = gguf_model
    start = time.perf_counter()
    g = read_gguf(str(path))
    seconds = time.perf_counter() - start
    tokens = g.metadata["tokenizer.ggml.tokens"]
    scores = g.metadata["tokenizer.ggml.scores"]
    assert not isinstance(tokens, list) and tokens.count == TOKENS
    assert not isinstance(scores, list) and scores.count == TOKENS
    # About 10 ms here (one unbuffered read per string: 50 ms); loose, for shared and slow CPUs.
    assert seconds < 1.0, seconds


@pytest.mark.parametrize("block", [16, 333, 4096])
def test_gguf_reads_the_same_whatever_the_read_block(
    gguf_model: tuple[Path, dict[str, int]], monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    # The whole test file fits one default 1 MiB block; small blocks make strings, lengths and
    # arrays straddle block ends, where the buffered reader refills or seeks.
    path, _ = gguf_model
    whole = describe(str(path))
    monkeypatch.setattr(formats, "READ_BLOCK", block)
    assert describe(str(path)) == whole
    g = read_gguf(str(path))
    assert [t.name for t in g.tensors][-1] == "blk.0.ffn_up.weight"
    assert g.metadata["tokenizer.chat_template"] == TEMPLATE


def test_gguf_file_type_names_the_quantization(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    written = write_gguf(
        tmp_path / "m.gguf", tokens=10, file_type=gguf.LlamaFileType.MOSTLY_Q4_K_M, key_length=32
    )
    d = describe(str(tmp_path / "m.gguf"))
    assert d["quantization"] == d["dtype"] == "Q4_K_M"
    assert d["head_dim"] == 32  # key_length wins over embedding_length / head_count
    assert d["vocab"] == 10 and d["params"] == written["params"]


def test_a_folder_with_one_gguf_is_that_gguf_and_a_projector_beside_it_is_not_a_second(
    tmp_path: Path, gguf_model: tuple[Path, dict[str, int]]
) -> None:
    path, written = gguf_model
    shutil.copy(path, tmp_path / "qwen-7b.gguf")
    alone = describe(str(tmp_path))
    shutil.copy(path, tmp_path / "mmproj-qwen-7b-f16.gguf")
    d = describe(str(tmp_path))
    assert alone["file"] == d["file"] == ["qwen-7b.gguf"]
    assert d["params"] == written["params"] and d["problems"] == []


def test_two_ggufs_are_ambiguous_until_file_names_one(
    tmp_path: Path, gguf_model: tuple[Path, dict[str, int]]
) -> None:
    path, written = gguf_model
    shutil.copy(path, tmp_path / "a-Q8_0.gguf")
    shutil.copy(path, tmp_path / "a-Q4_K_M.gguf")
    d = describe(str(tmp_path))
    assert d["format"] == "gguf" and d["file"] == [] and d["params"] is None
    assert len(d["problems"]) == 1
    assert "2 GGUF models" in d["problems"][0] and "a-Q8_0.gguf" in d["problems"][0]
    assert "file=" in d["problems"][0]
    picked = describe(str(tmp_path), file="a-Q4_K_M.gguf")
    assert picked["file"] == ["a-Q4_K_M.gguf"] and picked["params"] == written["params"]
    wrong = describe(str(tmp_path), file="nope.gguf")
    assert "a-Q4_K_M.gguf" in wrong["problems"][0] and wrong["params"] is None


def test_a_split_gguf_is_one_model_and_a_missing_part_is_named(tmp_path: Path) -> None:
    written = write_gguf(tmp_path / "big.gguf", tokens=10, split_max_tensors=2)
    parts = sorted(os.listdir(tmp_path))
    assert parts == ["big-00001-of-00002.gguf", "big-00002-of-00002.gguf"]
    d = describe(str(tmp_path))
    assert d["file"] == parts
    assert (d["params"], d["weight_bytes"]) == (written["params"], written["bytes"])
    assert d["tensor_count"] == 3 and d["arch"] == "llama" and d["problems"] == []
    # Any part's path stands for the whole model.
    assert describe(str(tmp_path / parts[1]))["params"] == written["params"]
    os.unlink(tmp_path / parts[1])
    cut = describe(str(tmp_path))
    assert cut["file"] == parts[:1]
    assert any("2 parts, 1 here" in p and "download the missing parts" in p for p in cut["problems"])


def test_a_big_endian_gguf_reads_the_same(tmp_path: Path) -> None:
    written = write_gguf(tmp_path / "be.gguf", tokens=100, big_endian=True)
    assert (tmp_path / "be.gguf").read_bytes()[4:8] == struct.pack(">I", 3)
    d = describe(str(tmp_path / "be.gguf"))
    assert (d["params"], d["weight_bytes"]) == (written["params"], written["bytes"])
    assert (d["context"], d["kv_heads"], d["vocab"]) == (4096, 2, 100)
    assert d["problems"] == []


def test_a_gguf_cut_off_in_its_header_is_reported_not_raised(
    tmp_path: Path, gguf_model: tuple[Path, dict[str, int]]
) -> None:
    path, _ = gguf_model
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 3])  # inside the 50,000 tokens
    d = describe(str(cut))
    assert d["format"] == "gguf" and d["params"] is None and d["weight_bytes"] is None
    assert len(d["problems"]) == 1
    assert "cut.gguf: the file ends at byte" in d["problems"][0]
    assert "metadata" in d["problems"][0] and "download it again" in d["problems"][0]
    # What came before the cut is still told.
    assert d["arch"] == "llama" and d["context"] == 4096


def test_a_gguf_cut_off_in_its_tensor_data_is_reported(
    tmp_path: Path, gguf_model: tuple[Path, dict[str, int]]
) -> None:
    path, written = gguf_model
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:-100])
    d = describe(str(cut))
    # The header is whole, so the sizes are still known; the data is not all there.
    assert d["params"] == written["params"]
    assert [p for p in d["problems"] if "truncated" in p] == [
        f"cut.gguf: its tensors end at byte {len(data)} but the file has {len(data) - 100} bytes "
        "(truncated): download it again"
    ]


@pytest.mark.parametrize("head", [b"PK\x03\x04rest", b"", b"GGU"])
def test_a_file_that_is_not_gguf_says_its_magic(tmp_path: Path, head: bytes) -> None:
    (tmp_path / "model.gguf").write_bytes(head)
    d = describe(str(tmp_path))
    assert d["format"] == "gguf" and d["params"] is None
    assert d["problems"] == [
        f"model.gguf: not a GGUF file (magic {head[:4]!r}, expected b'GGUF'): download it again, "
        "or convert the model with llama.cpp's convert_hf_to_gguf.py"
    ]


def test_gguf_version_1_is_named(tmp_path: Path) -> None:
    (tmp_path / "old.gguf").write_bytes(b"GGUF" + struct.pack("<III", 1, 0, 0))
    (problem,) = describe(str(tmp_path / "old.gguf"))["problems"]
    assert "GGUF version 1" in problem and "convert the model again" in problem


def test_a_corrupt_tensor_count_is_not_read_as_a_model(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 0))
    (problem,) = describe(str(tmp_path / "x.gguf"))["problems"]
    assert "claims 1099511627776 tensors" in problem and "damaged" in problem


def test_a_gguf_without_a_chat_template_gets_a_note(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m.gguf", tokens=5, template=False)
    d = describe(str(tmp_path / "m.gguf"))
    assert d["chat_template"] is False
    assert [p for p in d["problems"] if p.startswith("note:")] == [
        "note: m.gguf has no tokenizer.chat_template: chat requests need a template given to the server; "
        "completions work without one"
    ]


# ---- Hugging Face ----


def safetensors_counts(folder: Path) -> tuple[int, int]:
    """(params, bytes) of a folder's safetensors files, through the safetensors package."""
    safetensors = pytest.importorskip("safetensors")
    params = nbytes = 0
    for f in sorted(folder.glob("*.safetensors")):
        with safetensors.safe_open(str(f), "np") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                array = st.get_tensor(name)
                params += array.size
                nbytes += array.nbytes
    return params, nbytes


def test_the_tiny_hf_model_is_described(tiny_hf_model: Path) -> None:
    config = json.loads((tiny_hf_model / "config.json").read_text())
    d = describe(str(tiny_hf_model))
    params, nbytes = safetensors_counts(tiny_hf_model)
    assert d["format"] == "hf"
    assert (d["arch"], d["architectures"]) == ("llama", ["LlamaForCausalLM"])
    assert (d["context"], d["layers"], d["hidden"]) == (512, 2, 64)
    assert (d["heads"], d["kv_heads"], d["head_dim"]) == (4, 2, 16)
    assert d["vocab"] == config["vocab_size"]
    assert (d["file"], d["shards"]) == (["model.safetensors"], 1)
    assert (d["params"], d["weight_bytes"], d["dtype"]) == (params, nbytes, "F32")
    assert d["bits_per_weight"] == 32.0
    assert "tokenizer.json" in d["tokenizer"] and d["chat_template"] is True
    assert d["problems"] == []
    assert kv_cache_bytes(d, 512) == 2 * 2 * 2 * 16 * 512 * 2
    assert kv_cache_bytes(d, 1000, bytes_per_elem=1) == 2 * 2 * 2 * 16 * 1000


def test_an_hf_folder_without_tokenizer_or_template_or_weights_says_what_to_fetch(
    tmp_path: Path, tiny_hf_model: Path
) -> None:
    folder = tmp_path / "m"
    shutil.copytree(tiny_hf_model, folder)
    for name in ("tokenizer.json", "chat_template.jinja", "model.safetensors"):
        (folder / name).unlink(missing_ok=True)
    tok_config = folder / "tokenizer_config.json"
    if tok_config.exists():
        tok_config.write_text(
            json.dumps({k: v for k, v in json.loads(tok_config.read_text()).items() if k != "chat_template"})
        )
    d = describe(str(folder))
    assert d["format"] == "hf" and d["layers"] == 2
    assert (d["file"], d["shards"], d["params"], d["chat_template"]) == ([], 0, None, False)
    assert d["problems"] == [
        "no weights: no *.safetensors in the folder: download the model's *.safetensors files",
        "no tokenizer files (tokenizer.json, tokenizer.model, or vocab.json + merges.txt): "
        "download them from the model's repository",
        "note: no chat template (tokenizer_config.json chat_template or chat_template.jinja): "
        "chat requests need one; completions work without it",
    ]
    (folder / "pytorch_model.bin").write_bytes(b"\0")
    assert "convert its pytorch_model*.bin to safetensors" in describe(str(folder))["problems"][0]


def write_sharded_hf(folder: Path) -> tuple[int, int]:
    """A multimodal-style HF folder: text_config geometry, BF16 weights in two shards + index."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    folder.mkdir()
    shards = {
        "model-00001-of-00002.safetensors": {
            "embed": torch.zeros(100, 32, dtype=torch.bfloat16),
            "norm": torch.ones(32, dtype=torch.float32),
        },
        "model-00002-of-00002.safetensors": {"lm_head": torch.zeros(100, 32, dtype=torch.bfloat16)},
    }
    for name, tensors in shards.items():
        save_file(tensors, str(folder / name))
    index = {"weight_map": {t: name for name, tensors in shards.items() for t in tensors}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    config = {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": {
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "hidden_size": 32,
            "head_dim": 256,
            "max_position_embeddings": 131072,
            "vocab_size": 100,
        },
        "vision_config": {"num_hidden_layers": 27, "hidden_size": 1152},
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.model").write_bytes(b"sp")
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    params = 100 * 32 * 2 + 32
    return params, 100 * 32 * 2 * 2 + 32 * 4


def test_sharded_hf_with_a_text_config(tmp_path: Path) -> None:
    params, nbytes = write_sharded_hf(tmp_path / "g")
    d = describe(str(tmp_path / "g"))
    assert d["format"] == "hf" and d["arch"] == "gemma3"
    assert d["shards"] == 2 and d["file"] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert (d["params"], d["weight_bytes"], d["dtype"]) == (params, nbytes, "BF16")
    # The language model's geometry, not the vision tower's.
    assert (d["layers"], d["heads"], d["kv_heads"], d["head_dim"], d["hidden"]) == (3, 4, 1, 256, 32)
    assert (d["context"], d["vocab"]) == (131072, 100)
    assert (d["tokenizer"], d["chat_template"], d["problems"]) == (["tokenizer.model"], True, [])
    assert kv_cache_bytes(d, 8192) == 2 * 3 * 1 * 256 * 8192 * 2


def test_a_shard_the_index_names_but_the_folder_lacks(tmp_path: Path) -> None:
    write_sharded_hf(tmp_path / "g")
    (tmp_path / "g" / "model-00002-of-00002.safetensors").unlink()
    d = describe(str(tmp_path / "g"))
    assert d["problems"] == [
        "model-00002-of-00002.safetensors: named in model.safetensors.index.json but missing: download it"
    ]
    assert d["params"] == 100 * 32 + 32  # the shard that is there still counts


def test_a_truncated_safetensors_header_is_reported(tmp_path: Path, tiny_hf_model: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(tiny_hf_model, folder)
    weights = folder / "model.safetensors"
    (length,) = struct.unpack("<Q", weights.read_bytes()[:8])
    weights.write_bytes(weights.read_bytes()[:100])
    d = describe(str(folder))
    assert d["format"] == "hf" and d["params"] is None and d["weight_bytes"] is None
    assert d["problems"] == [
        f"model.safetensors: header cut short (92 of {length} bytes): the file is damaged or incomplete; "
        "download it again"
    ]


# ---- tinylm ----


def test_a_tinylm_checkpoint_is_described(tmp_path: Path) -> None:
    make_model(str(tmp_path / "t"), 0, config=TINY)
    d = describe(str(tmp_path / "t"))
    assert (d["format"], d["arch"], d["architectures"]) == ("tinylm", "tinylm", None)
    assert (d["context"], d["layers"], d["hidden"], d["vocab"]) == (64, 2, 64, 256)
    assert (d["heads"], d["kv_heads"], d["head_dim"]) == (4, 4, 16)
    assert (d["params"], d["weight_bytes"]) == (param_count(TINY), 2 * param_count(TINY))
    assert (d["dtype"], d["bits_per_weight"], d["file"]) == ("BF16", 16.0, ["model.safetensors"])
    assert d["problems"] == [] and "tokenizer" not in d
    assert kv_cache_bytes(d, 64) == 2 * 2 * 4 * 16 * 64 * 2


def test_a_sharded_tinylm_checkpoint_counts_every_shard(tmp_path: Path) -> None:
    make_model(str(tmp_path / "t"), 0, config=TINY, shard_bytes=60_000, dtype="fp32")
    d = describe(str(tmp_path / "t"))
    assert d["shards"] > 1 and len(d["file"]) == d["shards"]
    assert (d["params"], d["weight_bytes"], d["dtype"]) == (param_count(TINY), 4 * param_count(TINY), "F32")


def test_a_bad_tinylm_config_names_the_field(tmp_path: Path) -> None:
    make_model(str(tmp_path / "t"), 0, config=TINY)
    config = json.loads((tmp_path / "t" / "config.json").read_text())
    config["n_heads"] = 3
    (tmp_path / "t" / "config.json").write_text(json.dumps(config))
    d = describe(str(tmp_path / "t"))
    assert d["format"] == "tinylm" and d["head_dim"] is None
    (problem,) = d["problems"]
    assert "must be a multiple of n_heads (3)" in problem and "labctl bench make-model" in problem


# ---- neither ----


def test_a_config_that_is_not_json_still_tells_the_weights(tmp_path: Path) -> None:
    make_model(str(tmp_path / "t"), 0, config=TINY)
    (tmp_path / "t" / "config.json").write_text('{"vocab": 256,')
    d = describe(str(tmp_path / "t"))
    assert d["format"] == "unknown" and d["arch"] is None
    assert d["params"] == param_count(TINY)
    (problem,) = d["problems"]
    assert problem.startswith("config.json is not JSON (") and problem.endswith(": download it again")


def test_a_config_of_no_known_kind(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    d = describe(str(tmp_path))
    assert d["format"] == "unknown"
    assert d["problems"][0].startswith("config.json has no model_type (Hugging Face) nor tinylm's")


def test_an_empty_folder_is_not_a_model(tmp_path: Path) -> None:
    d = describe(str(tmp_path))
    assert d["format"] == "unknown" and d["file"] == [] and d["params"] is None
    assert d["problems"] == [
        "not a model folder: no config.json, *.safetensors or *.gguf in it (is the download complete?)"
    ]
    with pytest.raises(ValueError, match="layers, kv_heads, head_dim unknown"):
        kv_cache_bytes(d, 10)


def test_a_path_that_does_not_exist_raises_no_model(tmp_path: Path) -> None:
    with pytest.raises(AgentError) as info:
        describe(str(tmp_path / "gone"))
    assert info.value.kind == "no_model" and "gone" in info.value.message


# ---- the agent command ----


def test_model_describe_answers_every_path_in_the_declared_shape(
    tmp_path: Path, gguf_model: tuple[Path, dict[str, int]]
) -> None:
    path, written = gguf_model
    make_model(str(tmp_path / "t"), 0, config=TINY)
    args = {"paths": [str(path), str(tmp_path / "t"), str(tmp_path / "gone")]}
    answer = json.loads(json.dumps(commands.call("modelload.describe", args)))
    models = answer["models"]
    assert models[str(path)]["params"] == written["params"]
    assert models[str(tmp_path / "t")]["format"] == "tinylm"
    assert models[str(tmp_path / "gone")]["kind"] == "no_model"
    assert answer_problem("modelload.describe", answer, args) is None
    del models[str(tmp_path / "t")]
    assert (
        answer_problem("modelload.describe", answer, args)
        == f"at models: no answer for {str(tmp_path / 't')!r}"
    )


@pytest.mark.parametrize("args", [{}, {"paths": "x"}, {"paths": [1]}, {"paths": [""]}])
def test_model_describe_refuses_bad_args(args: dict[str, Any]) -> None:
    with pytest.raises(AgentError) as info:
        commands.call("modelload.describe", args)
    assert info.value.kind == "bad_args" and "paths" in info.value.message


@pytest.mark.skipif(not PY38.exists(), reason=f"no Python 3.8 interpreter at {PY38}")
def test_model_describe_under_python38_without_gguf_or_numpy(
    tmp_path: Path, gguf_model: tuple[Path, dict[str, int]]
) -> None:
    """Storage hosts run the zipapp under their own python3: 3.8, no gguf, no numpy, no torch."""
    from labctl.hosts.agent_ship import agent_zip

    path, written = gguf_model
    make_model(str(tmp_path / "t"), 0, config=TINY)
    pyz = tmp_path / "agent.pyz"
    pyz.write_bytes(agent_zip()[0])
    args = {"paths": [str(path), str(tmp_path / "t")]}
    guard = "import runpy, sys; sys.modules['torch'] = sys.modules['numpy'] = sys.modules['gguf'] = None; "
    guard += f"sys.argv = ['agent', 'modelload.describe', {json.dumps(args)!r}]; runpy.run_path({str(pyz)!r})"
    proc = subprocess.run([str(PY38), "-c", guard], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    models = json.loads(proc.stdout)["models"]
    assert models[str(path)]["params"] == written["params"]
    assert models[str(path)]["vocab"] == TOKENS
    assert models[str(tmp_path / "t")]["params"] == param_count(TINY)
