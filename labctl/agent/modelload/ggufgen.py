"""A Hugging Face Llama folder as one GGUF file, for llama.cpp's llama-server.

    python -m labctl.agent.modelload.ggufgen --hf DIR --out FILE.gguf [--ftype f16|f32|q8_0] [--name NAME]

It reads what hfgen.py writes (config.json, model.safetensors or its shards, tokenizer.json with a
byte-level BPE, the chat template) and writes the same model the way llama.cpp's own converter
(convert_hf_to_gguf.py) does for Llama: its metadata keys and tensor names, and the row order
llama.cpp's RoPE expects of the Q and K projections. Only a GPT-2 byte-level tokenizer is taken:
llama.cpp re-implements pre-tokenizers by name, and "gpt-2" is the one whose rule is the same as
`pre_tokenizers.ByteLevel(use_regex=True)`; any other would tokenize differently there, silently.

The weights are read with numpy from the safetensors bytes directly (bfloat16 included, which
numpy cannot name), so it runs where numpy and gguf are installed: the controller's venv or a
host's torch_env. The file is written beside `out` and renamed into place.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import sys
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Tuple

FTYPES = ("f32", "f16", "q8_0")
# HF model_type -> llama.cpp architecture. Mistral's weights are Llama's (llama.cpp's converter
# maps MistralForCausalLM to its LlamaModel); a sliding window it may declare is not written.
ARCHS = {"llama": "llama", "mistral": "llama"}

# HF parameter name inside a block -> llama.cpp's tensor name (gguf-py's tensor_mapping.py).
BLOCK_TENSORS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
TOP_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
REQUIRED = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "intermediate_size")
BLOCK_RE = re.compile(r"^model\.layers\.([0-9]+)\.(.+)\.(weight|bias)$")
# Buffers some checkpoints carry that llama.cpp recomputes.
SKIPPED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")

SAFETENSORS_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8"}


class ConvertError(Exception):
    """The folder cannot be written as a GGUF that llama.cpp reads as the same model."""


def _read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# -- weights -----------------------------------------------------------------------------------


def safetensors_files(hf_dir: str) -> List[str]:
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        shards = sorted(set(_read_json(index)["weight_map"].values()))
        return [os.path.join(hf_dir, s) for s in shards]
    single = os.path.join(hf_dir, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    raise ConvertError(f"{hf_dir} has no model.safetensors (nor an index of shards)")


def read_safetensors(path: str) -> Iterator[Tuple[str, Any]]:
    """(name, float32 numpy array) for each tensor of one safetensors file, in file order."""
    import numpy as np

    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    entries = sorted(
        ((k, v) for k, v in header.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0]
    )
    for name, info in entries:
        dtype = SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ConvertError(f"{path}: tensor {name} is {info['dtype']}; only F32, F16 and BF16 are read")
        start, end = info["data_offsets"]
        raw = np.frombuffer(data[start:end], dtype=dtype).reshape(info["shape"])
        if info["dtype"] == "BF16":
            # bfloat16 is the upper half of a float32: widen the bits, no rounding involved.
            arr = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            arr = raw.astype(np.float32)
        yield name, arr


def permute_rope(w: Any, n_head: int) -> Any:
    """HF's Llama rotates the first half of each head's dimensions against the second half;
    llama.cpp's (non-NeoX) RoPE rotates neighbouring pairs. Interleaving the two halves of every
    head's rows of q_proj / k_proj makes the two compute the same thing (llama.cpp's converter
    does this in LlamaModel.permute)."""
    shape = w.shape
    return w.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def gguf_name(hf_name: str) -> Optional[str]:
    if hf_name in TOP_TENSORS:
        return TOP_TENSORS[hf_name]
    m = BLOCK_RE.match(hf_name)
    if m and m.group(2) in BLOCK_TENSORS:
        return f"blk.{m.group(1)}.{BLOCK_TENSORS[m.group(2)]}.{m.group(3)}"
    return None


# -- tokenizer ---------------------------------------------------------------------------------


def _merge_text(merge: Any) -> str:
    # tokenizers >= 0.20 saves a merge as a pair; older files as "a b". Neither part holds a
    # space: byte-level BPE spells it "Ġ".
    return merge if isinstance(merge, str) else " ".join(merge)


def _token_id(name: Any, vocab: Dict[str, int]) -> Optional[int]:
    if isinstance(name, dict):  # tokenizer_config.json's AddedToken form
        name = name.get("content")
    return vocab.get(name) if isinstance(name, str) else None


def read_tokenizer(hf_dir: str, config: Dict[str, Any], n_vocab: int) -> Dict[str, Any]:
    """The GGUF tokenizer fields of a byte-level BPE tokenizer.json (ConvertError otherwise)."""
    path = os.path.join(hf_dir, "tokenizer.json")
    if not os.path.isfile(path):
        raise ConvertError(f"{hf_dir} has no tokenizer.json")
    tok = _read_json(path)
    model = tok.get("model") or {}
    pre = tok.get("pre_tokenizer") or {}
    if model.get("type") != "BPE":
        raise ConvertError(f"{path}: the tokenizer is {model.get('type')}, not a BPE")
    if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) or pre.get("add_prefix_space"):
        raise ConvertError(
            f"{path}: the pre-tokenizer is not GPT-2's byte-level split ({json.dumps(pre)[:200]}); "
            "llama.cpp would split text differently"
        )
    if tok.get("normalizer"):
        raise ConvertError(
            f"{path}: a normalizer ({tok['normalizer'].get('type')}) has no llama.cpp twin here"
        )

    import gguf

    if not isinstance(model.get("vocab"), dict):
        raise ConvertError(f"{path}: the BPE model has no vocab")
    vocab: Dict[str, int] = dict(model["vocab"])
    added = {t["content"]: t for t in tok.get("added_tokens") or []}
    for text, t in added.items():
        vocab[text] = t["id"]
    by_id = {i: text for text, i in vocab.items()}
    if by_id and max(by_id) >= n_vocab:
        raise ConvertError(f"{path}: token id {max(by_id)} is past the model's vocab_size {n_vocab}")
    tokens: List[str] = []
    types: List[int] = []
    for i in range(n_vocab):
        text = by_id.get(i)
        if text is None:
            # The embedding has rows no token uses: llama.cpp needs a name for each all the same.
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif text in added:
            tokens.append(text)
            types.append(
                gguf.TokenType.CONTROL if added[text].get("special") else gguf.TokenType.USER_DEFINED
            )
        else:
            tokens.append(text)
            types.append(gguf.TokenType.NORMAL)

    tok_config_path = os.path.join(hf_dir, "tokenizer_config.json")
    tok_config = _read_json(tok_config_path) if os.path.isfile(tok_config_path) else {}

    def special(key: str) -> Optional[int]:
        found = config.get(f"{key}_token_id")
        if isinstance(found, list):
            found = found[0] if found else None
        if isinstance(found, int):
            return found
        return _token_id(tok_config.get(f"{key}_token"), vocab)

    template = tok_config.get("chat_template")
    template_path = os.path.join(hf_dir, "chat_template.jinja")
    if os.path.isfile(template_path):
        with open(template_path, encoding="utf-8") as f:
            template = f.read()
    eos = special("eos")
    bos = special("bos")
    if bos is None:
        # The model adds no BOS (add_bos_token false below), but llama.cpp falls back to GPT-2's id
        # 11 for a gpt2 vocabulary without one: name a real special token instead, as GPT-2 did.
        bos = vocab.get("<|endoftext|>", eos)
    return {
        "tokens": tokens,
        "types": types,
        "merges": [_merge_text(m) for m in model.get("merges") or []],
        "bos": bos,
        "eos": eos,
        "pad": special("pad"),
        "add_bos": bool(tok_config.get("add_bos_token", False)),
        "chat_template": template if isinstance(template, str) else None,
    }


# -- the file ----------------------------------------------------------------------------------


def _tensor_type(name: str, arr: Any, ftype: str) -> str:
    """f32, f16 or q8_0 for one tensor: norms and other vectors stay f32, as llama.cpp's converter
    keeps them; a row length Q8_0's 32-value blocks do not divide falls back to f16."""
    if ftype == "f32" or arr.ndim < 2 or name.endswith("_norm.weight"):
        return "f32"
    if ftype == "q8_0" and arr.shape[-1] % 32 == 0:
        return "q8_0"
    return "f16"


def hf_to_gguf(hf_dir: str, out_path: str, ftype: str = "f16", name: Optional[str] = None) -> Dict[str, Any]:
    """Write the model in `hf_dir` as the GGUF file `out_path`; what was written, as data."""
    import gguf
    import numpy as np

    if ftype not in FTYPES:
        raise ConvertError(f"ftype must be one of {', '.join(FTYPES)}, got {ftype!r}")
    config_path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(config_path):
        raise ConvertError(f"{hf_dir} has no config.json: not a Hugging Face model folder")
    config = _read_json(config_path)
    model_type = config.get("model_type")
    arch = ARCHS.get(str(model_type))
    if arch is None:
        raise ConvertError(
            f"model_type {model_type!r} is not converted here; known: {', '.join(sorted(ARCHS))}"
        )
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if rope_type != "default":
        raise ConvertError(f"RoPE scaling {rope_type!r} is not converted here")
    rope_theta = float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0)

    missing = [k for k in REQUIRED if not isinstance(config.get(k), int)]
    if missing:
        raise ConvertError(f"{config_path} lacks {', '.join(missing)} (or they are not integers)")
    hidden = int(config["hidden_size"])
    n_head = int(config["num_attention_heads"])
    n_kv = int(config.get("num_key_value_heads") or n_head)
    head_dim = int(config.get("head_dim") or hidden // n_head)
    n_layer = int(config["num_hidden_layers"])
    n_vocab = int(config["vocab_size"])
    tokenizer = read_tokenizer(hf_dir, config, n_vocab)

    file_type = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }[ftype]
    out_path = os.path.abspath(out_path)
    parent = os.path.dirname(out_path)
    os.makedirs(parent, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ggufgen-", suffix=".gguf", dir=parent)
    os.close(fd)
    counts: Dict[str, int] = {}
    names: List[str] = []
    try:
        w = gguf.GGUFWriter(tmp, arch)
        w.add_name(name or os.path.basename(os.path.normpath(hf_dir)))
        w.add_file_type(file_type)
        if ftype == "q8_0":
            w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_vocab_size(n_vocab)
        w.add_context_length(int(config.get("max_position_embeddings") or 2048))
        w.add_embedding_length(hidden)
        w.add_block_count(n_layer)
        w.add_feed_forward_length(int(config["intermediate_size"]))
        w.add_head_count(n_head)
        w.add_head_count_kv(n_kv)
        w.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
        w.add_rope_freq_base(rope_theta)
        w.add_rope_dimension_count(head_dim)
        if head_dim * n_head != hidden:
            # llama.cpp assumes hidden / heads per head unless told otherwise.
            w.add_key_length(head_dim)
            w.add_value_length(head_dim)

        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(tokenizer["tokens"])
        w.add_token_types(tokenizer["types"])
        w.add_token_merges(tokenizer["merges"])
        for key, add in (
            ("bos", w.add_bos_token_id),
            ("eos", w.add_eos_token_id),
            ("pad", w.add_pad_token_id),
        ):
            if tokenizer[key] is not None:
                add(tokenizer[key])
        w.add_add_bos_token(tokenizer["add_bos"])
        w.add_add_eos_token(False)
        if tokenizer["chat_template"]:
            w.add_chat_template(tokenizer["chat_template"])

        seen_output = False
        for path in safetensors_files(hf_dir):
            for hf_name, arr in read_safetensors(path):
                if SKIPPED.search(hf_name):
                    continue
                target = gguf_name(hf_name)
                if target is None:
                    raise ConvertError(f"tensor {hf_name} has no llama.cpp name here")
                if hf_name.endswith(("q_proj.weight", "q_proj.bias")):
                    arr = permute_rope(arr, n_head)
                elif hf_name.endswith(("k_proj.weight", "k_proj.bias")):
                    arr = permute_rope(arr, n_kv)
                seen_output = seen_output or target == "output.weight"
                kind = _tensor_type(target, arr, ftype)
                if kind == "q8_0":
                    q = gguf.quants.quantize(np.ascontiguousarray(arr), gguf.GGMLQuantizationType.Q8_0)
                    w.add_tensor(target, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
                else:
                    w.add_tensor(
                        target, np.ascontiguousarray(arr, dtype=np.float16 if kind == "f16" else np.float32)
                    )
                counts[kind] = counts.get(kind, 0) + 1
                names.append(target)
        if not seen_output and not config.get("tie_word_embeddings", False):
            raise ConvertError("the checkpoint has no lm_head.weight and does not tie it to the embeddings")
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.chmod(tmp, 0o644)
        os.replace(tmp, out_path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return {
        "path": out_path,
        "arch": arch,
        "ftype": ftype,
        "tensors": len(names),
        "tensor_types": counts,
        "vocab": n_vocab,
        "context": int(config.get("max_position_embeddings") or 2048),
        "bytes": os.path.getsize(out_path),
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labctl.agent.modelload.ggufgen", description=__doc__)
    parser.add_argument("--hf", required=True, help="the Hugging Face model folder")
    parser.add_argument("--out", required=True, help="the GGUF file to write")
    parser.add_argument("--ftype", default="f16", choices=FTYPES)
    parser.add_argument("--name", default=None, help="general.name (default: the folder's name)")
    a = parser.parse_args(argv)
    try:
        info = hf_to_gguf(a.hf, a.out, a.ftype, a.name)
    except (ImportError, ConvertError, OSError, ValueError) as exc:
        sys.stderr.write(f"ggufgen: {exc}\n")
        return 1
    sys.stdout.write(json.dumps(info) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
