"""The GGUF writer (labctl/agent/modelload/ggufgen.py) on the session's tiny Llama: the file read
back with gguf's own reader has llama.cpp's metadata, tensor names, shapes and tokenizer, and the
Q/K row order makes llama.cpp's RoPE compute what Hugging Face's does. llama.cpp itself serving
the file is tests/integration/test_llama_server.py."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

from labctl.agent.modelload import ggufgen  # noqa: E402
from labctl.agent.modelload.ggufgen import ConvertError, hf_to_gguf, permute_rope  # noqa: E402

LAYER_TENSORS = [
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
]


def field(reader: Any, key: str) -> Any:
    return reader.fields[key].contents()


@pytest.fixture(scope="module")
def converted(tiny_hf_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gguf")
    return {
        ft: Path(hf_to_gguf(str(tiny_hf_model), str(out / f"tiny-{ft}.gguf"), ft)["path"])
        for ft in ggufgen.FTYPES
    }


def hf_tensors(hf: Path) -> dict[str, Any]:
    return dict(ggufgen.read_safetensors(str(hf / "model.safetensors")))


def test_metadata_is_llamas(converted: dict[str, Path], tiny_hf_model: Path) -> None:
    config = json.loads((tiny_hf_model / "config.json").read_text())
    r = gguf.GGUFReader(converted["f16"])
    assert field(r, "general.architecture") == "llama"
    assert field(r, "general.name") == tiny_hf_model.name
    assert field(r, "general.file_type") == gguf.LlamaFileType.MOSTLY_F16
    assert field(r, "llama.context_length") == config["max_position_embeddings"] == 512
    assert field(r, "llama.embedding_length") == config["hidden_size"]
    assert field(r, "llama.block_count") == config["num_hidden_layers"]
    assert field(r, "llama.feed_forward_length") == config["intermediate_size"]
    assert field(r, "llama.attention.head_count") == config["num_attention_heads"]
    assert field(r, "llama.attention.head_count_kv") == config["num_key_value_heads"]
    assert field(r, "llama.attention.layer_norm_rms_epsilon") == pytest.approx(config["rms_norm_eps"])
    assert field(r, "llama.rope.freq_base") == config["rope_parameters"]["rope_theta"]
    assert field(r, "llama.rope.dimension_count") == config["hidden_size"] // config["num_attention_heads"]
    assert field(r, "llama.vocab_size") == config["vocab_size"]


def test_tensor_names_shapes_and_types(converted: dict[str, Path], tiny_hf_model: Path) -> None:
    config = json.loads((tiny_hf_model / "config.json").read_text())
    hidden, ff, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = config["num_key_value_heads"] * hidden // config["num_attention_heads"]
    # GGUF lists a tensor's dimensions innermost first: a (rows, cols) matrix is [cols, rows].
    want = {
        "token_embd.weight": [hidden, vocab],
        "output_norm.weight": [hidden],
        "output.weight": [hidden, vocab],
    }
    for b in range(config["num_hidden_layers"]):
        shapes = {
            "attn_norm": [hidden],
            "ffn_norm": [hidden],
            "attn_q": [hidden, hidden],
            "attn_k": [hidden, kv],
            "attn_v": [hidden, kv],
            "attn_output": [hidden, hidden],
            "ffn_gate": [hidden, ff],
            "ffn_up": [hidden, ff],
            "ffn_down": [ff, hidden],
        }
        assert sorted(shapes) == sorted(LAYER_TENSORS)
        want.update({f"blk.{b}.{n}.weight": s for n, s in shapes.items()})
    for ftype, matrix_type in (("f32", "F32"), ("f16", "F16"), ("q8_0", "Q8_0")):
        r = gguf.GGUFReader(converted[ftype])
        got = {t.name: [int(x) for x in t.shape] for t in r.tensors}
        assert got == want, ftype
        types = {t.name: t.tensor_type.name for t in r.tensors}
        for name, shape in want.items():
            # Norms stay f32 in every file, as llama.cpp's converter keeps them.
            assert types[name] == ("F32" if len(shape) == 1 else matrix_type), (ftype, name)


def test_weights_match_and_q_k_rows_are_permuted(converted: dict[str, Path], tiny_hf_model: Path) -> None:
    hf = hf_tensors(tiny_hf_model)
    r = gguf.GGUFReader(converted["f32"])
    data = {t.name: np.asarray(t.data) for t in r.tensors}
    np.testing.assert_array_equal(data["token_embd.weight"], hf["model.embed_tokens.weight"])
    np.testing.assert_array_equal(data["output.weight"], hf["lm_head.weight"])
    np.testing.assert_array_equal(data["blk.1.ffn_down.weight"], hf["model.layers.1.mlp.down_proj.weight"])
    np.testing.assert_array_equal(data["blk.0.attn_v.weight"], hf["model.layers.0.self_attn.v_proj.weight"])
    q = hf["model.layers.0.self_attn.q_proj.weight"]
    k = hf["model.layers.0.self_attn.k_proj.weight"]
    assert not np.array_equal(data["blk.0.attn_q.weight"], q)
    np.testing.assert_array_equal(data["blk.0.attn_q.weight"], permute_rope(q, 4))
    np.testing.assert_array_equal(data["blk.0.attn_k.weight"], permute_rope(k, 2))
    # Q8_0 keeps each value within half a step of its block's scale.
    r8 = gguf.GGUFReader(converted["q8_0"])
    t = next(t for t in r8.tensors if t.name == "blk.0.ffn_up.weight")
    back = gguf.quants.dequantize(t.data, t.tensor_type).reshape(
        hf["model.layers.0.mlp.up_proj.weight"].shape
    )
    err = np.abs(back - hf["model.layers.0.mlp.up_proj.weight"]).max()
    assert err <= np.abs(hf["model.layers.0.mlp.up_proj.weight"]).max() / 127


def test_permutation_turns_hf_rope_into_llama_cpps() -> None:
    """HF rotates dimension i against i + d/2 of each head; llama.cpp's normal RoPE rotates 2i
    against 2i+1. The same input through permuted rows gives the same scores, position by position."""
    rng = np.random.default_rng(0)
    n_head, d, hidden = 2, 8, 6
    w = rng.standard_normal((n_head * d, hidden))
    x = rng.standard_normal(hidden)
    theta = 10000.0 ** (-np.arange(0, d, 2) / d)

    def hf_rope(v: Any, pos: int) -> Any:
        cos, sin = np.cos(pos * theta), np.sin(pos * theta)
        a, b = v[: d // 2], v[d // 2 :]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin])

    def llama_cpp_rope(v: Any, pos: int) -> Any:
        cos, sin = np.cos(pos * theta), np.sin(pos * theta)
        out = v.copy()
        out[0::2] = v[0::2] * cos - v[1::2] * sin
        out[1::2] = v[0::2] * sin + v[1::2] * cos
        return out

    heads_hf = (w @ x).reshape(n_head, d)
    heads_cpp = (permute_rope(w, n_head) @ x).reshape(n_head, d)
    for pos in (0, 1, 7):
        for h in range(n_head):
            a = hf_rope(heads_hf[h], pos)
            b = llama_cpp_rope(heads_cpp[h], pos)
            # Same values, in the interleaved order: so every q·k product is the same.
            np.testing.assert_allclose(np.sort(a), np.sort(b))
            np.testing.assert_allclose(a @ hf_rope(heads_hf[h], 3), b @ llama_cpp_rope(heads_cpp[h], 3))


def test_tokenizer_and_chat_template(converted: dict[str, Path], tiny_hf_model: Path) -> None:
    from labctl.agent.modelload.hfgen import CHAT_TEMPLATE

    tok = json.loads((tiny_hf_model / "tokenizer.json").read_text())
    r = gguf.GGUFReader(converted["q8_0"])
    assert field(r, "tokenizer.ggml.model") == "gpt2"
    assert field(r, "tokenizer.ggml.pre") == "gpt-2"
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    assert len(tokens) == len(types) == field(r, "llama.vocab_size")
    for text, i in tok["model"]["vocab"].items():
        assert tokens[i] == text
    assert tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert types[:3] == [gguf.TokenType.CONTROL] * 3
    assert set(types[3:]) == {gguf.TokenType.NORMAL}
    assert field(r, "tokenizer.ggml.merges") == [" ".join(m) for m in tok["model"]["merges"]]
    assert field(r, "tokenizer.ggml.eos_token_id") == 2
    assert field(r, "tokenizer.ggml.padding_token_id") == 0
    assert field(r, "tokenizer.ggml.bos_token_id") == 0
    assert field(r, "tokenizer.ggml.add_bos_token") is False
    assert field(r, "tokenizer.chat_template") == CHAT_TEMPLATE


def test_cli_writes_and_says_what(
    tiny_hf_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sub" / "m.gguf"
    assert (
        ggufgen.main(["--hf", str(tiny_hf_model), "--out", str(out), "--ftype", "q8_0", "--name", "tiny"])
        == 0
    )
    info = json.loads(capsys.readouterr().out)
    assert (
        info["path"] == str(out)
        and info["ftype"] == "q8_0"
        and info["tensor_types"] == {"q8_0": 16, "f32": 5}
    )
    assert field(gguf.GGUFReader(out), "general.name") == "tiny"
    assert [p.name for p in out.parent.iterdir()] == ["m.gguf"]  # no temporary file left
    assert ggufgen.main(["--hf", str(tmp_path), "--out", str(tmp_path / "x.gguf")]) == 1
    assert "no config.json" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


def copy_model(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_a_tokenizer_llama_cpp_would_split_otherwise_is_refused(tiny_hf_model: Path, tmp_path: Path) -> None:
    hf = copy_model(tiny_hf_model, tmp_path / "m")
    tok = json.loads((hf / "tokenizer.json").read_text())
    tok["pre_tokenizer"] = {"type": "Whitespace"}
    (hf / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ConvertError, match="not GPT-2's byte-level split"):
        hf_to_gguf(str(hf), str(tmp_path / "m.gguf"))
    assert not list(tmp_path.glob("*.gguf")) and not list(tmp_path.glob(".ggufgen-*"))


def test_unknown_tensor_and_architecture_are_refused(tiny_hf_model: Path, tmp_path: Path) -> None:
    hf = copy_model(tiny_hf_model, tmp_path / "m")
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "model_type": "gpt_neox"}))
    with pytest.raises(ConvertError, match="gpt_neox"):
        hf_to_gguf(str(hf), str(tmp_path / "m.gguf"))
    (hf / "config.json").write_text(json.dumps(config))
    write_safetensors(
        hf / "model.safetensors", {"model.layers.0.mystery.weight": ("F32", [2], struct.pack("<2f", 1, 2))}
    )
    with pytest.raises(ConvertError, match="mystery"):
        hf_to_gguf(str(hf), str(tmp_path / "m.gguf"))
    assert not list(tmp_path.glob("*.gguf")) and not list(tmp_path.glob(".ggufgen-*"))


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    header: dict[str, Any] = {}
    blob = b""
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + blob)


def test_bfloat16_weights_are_read_exactly(tmp_path: Path) -> None:
    values = np.array([1.0, -2.5, 3.140625, 0.0], dtype=np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2").tobytes()  # exact: these need 8 mantissa bits
    write_safetensors(
        tmp_path / "m.safetensors", {"w": ("BF16", [2, 2], bf16), "h": ("F16", [2], b"\x00\x3c\x00\xc0")}
    )
    got = dict(ggufgen.read_safetensors(str(tmp_path / "m.safetensors")))
    np.testing.assert_array_equal(got["w"], values.reshape(2, 2))
    np.testing.assert_array_equal(got["h"], [1.0, -2.0])
    assert got["w"].dtype == np.float32
