"""What a model folder holds, told from its files alone: `describe(path)` (agent: `modelload.describe`).

Runs on storage hosts, which often have no torch and no `gguf` package: standard library only,
Python 3.8. Nothing is loaded: it reads config.json, the safetensors headers (loader.read_header)
and the GGUF header (metadata and tensor infos, parsed here), which is enough to know the format,
the weights' size and type, the architecture and the KV-cache geometry a server will need.

A bad file is never an exception: each thing wrong is one line in `problems`, saying what to do
about it, and the rest of the answer holds whatever could still be read.
"""

from __future__ import annotations

import json
import os
import re
import struct
from typing import IO, Any, Dict, List, Optional, Tuple

from ..core.errors import AgentError
from ..core.spec import command
from ..models.tinylm import check_config
from .loader import INDEX_NAME, FormatError, model_files, read_header

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
GGUF_ALIGNMENT = 32  # general.alignment's default
READ_BLOCK = 1 << 20
# Numeric arrays up to this long are kept (per-layer head counts); longer ones (token scores
# and types, a vocabulary long) are seeked over and only their length is kept.
KEEP_ARRAY = 1024
KEEP_STRING = 16 << 20  # a chat template is a few KB; a longer string value is skipped
MAX_KEY = 1 << 16
MAX_DIMS = 8  # ggml has 4; more means the tensor infos are not where we are reading
MAX_COUNT = 1 << 24  # tensors or keys: a larger count is a corrupt header, not a model

# ggml type id -> (name, elements per block, bytes per block), as gguf.constants.GGML_QUANT_SIZES
# has them (tests/unit/test_model_formats.py checks this table against the installed package).
GGML_TYPES: Dict[int, Tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}

# general.file_type -> name, from gguf.constants.LlamaFileType without its MOSTLY_/ALL_ prefix
# (checked against the installed package by the tests). llama.cpp ORs in 1024 when it guessed.
FILE_TYPES: Dict[int, str] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
    39: "NVFP4",
    40: "Q1_0",
}
FILE_TYPE_GUESSED = 1024

# GGUF value type -> struct code; 8 is STRING and 9 ARRAY.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING = 8
_ARRAY = 9

_SPLIT_RE = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")
TINYLM_KEYS = ("vocab", "d_model", "n_layers", "n_heads", "max_seq")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
# What `labctl bench make-model --kind coder` writes beside the model: the phase-3 tasks it was
# trained on, so phase 3 can be pointed at them (rl.tasks) to see learning.
CODER_RECORD = "labctl_coder.json"


class _Truncated(Exception):
    pass


class _Corrupt(Exception):
    pass


class _Array:
    """An array value that was skipped: its element type and length, never its items."""

    __slots__ = ("count", "etype")

    def __init__(self, etype: int, count: int) -> None:
        self.etype = etype
        self.count = count


class _Reader:
    """Sequential reads from a file through one large buffer, and seeks over what is not kept.

    The tokenizer's arrays hold hundreds of thousands of length-prefixed strings: read one at a
    time, each would be a call into the file object; from a 1 MiB block they cost a slice each.
    """

    def __init__(self, f: IO[bytes], size: int, endian: str) -> None:
        self.f = f
        self.size = size
        self.endian = endian
        self.buf = b""
        self.pos = 0
        self.base = 0  # the file offset of buf[0]
        self.section = "header"
        self._u32 = struct.Struct(endian + "I")
        self._u64 = struct.Struct(endian + "Q")

    def tell(self) -> int:
        return self.base + self.pos

    def _fill(self, n: int) -> None:
        if self.tell() + n > self.size:
            # Checked before reading: a corrupt length must not become a read of that size.
            raise _Truncated(self.section)
        rest = self.buf[self.pos :]
        self.base += self.pos
        self.buf = rest + self.f.read(max(READ_BLOCK, n - len(rest)))
        self.pos = 0
        if len(self.buf) < n:
            raise _Truncated(self.section)

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            self._fill(n)
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def skip(self, n: int) -> None:
        if self.pos + n <= len(self.buf):
            self.pos += n
            return
        target = self.tell() + n
        if target > self.size:
            raise _Truncated(self.section)
        self.f.seek(target)
        self.base, self.buf, self.pos = target, b"", 0

    def u32(self) -> int:
        value: int = self._u32.unpack(self.take(4))[0]
        return value

    def u64(self) -> int:
        value: int = self._u64.unpack(self.take(8))[0]
        return value

    def unpack(self, code: str, count: int = 1) -> Tuple[Any, ...]:
        fmt = struct.Struct(f"{self.endian}{count}{code}")
        return fmt.unpack(self.take(fmt.size))

    def string(self, limit: int) -> Optional[str]:
        n = self.u64()
        if n > limit:
            self.skip(n)
            return None
        return self.take(n).decode("utf-8", "replace")

    def skip_strings(self, count: int) -> None:
        unpack = self._u64.unpack_from
        buf, pos = self.buf, self.pos
        for _ in range(count):
            if pos + 8 > len(buf):
                self.pos = pos
                self._fill(8)
                buf, pos = self.buf, self.pos
            pos += 8 + unpack(buf, pos)[0]
            if pos > len(buf):
                over = pos - len(buf)
                self.pos = len(buf)
                self.skip(over)
                buf, pos = self.buf, self.pos
        self.pos = pos


def _value(r: _Reader, vtype: int, key: str) -> Any:
    code = _SCALARS.get(vtype)
    if code is not None:
        return r.unpack(code)[0]
    if vtype == _STRING:
        return r.string(KEEP_STRING)
    if vtype != _ARRAY:
        raise _Corrupt(f"key {key!r} has value type {vtype}, which GGUF does not define")
    etype, count = r.u32(), r.u64()
    code = _SCALARS.get(etype)
    if code is not None:
        if count <= KEEP_ARRAY:
            return list(r.unpack(code, count))
        r.skip(count * struct.calcsize(code))
    elif etype == _STRING:
        r.skip_strings(count)
    elif etype == _ARRAY:
        for _ in range(count):
            _value(r, _ARRAY, key)
    else:
        raise _Corrupt(f"key {key!r} is an array of value type {etype}, which GGUF does not define")
    return _Array(etype, count)


class _Tensor:
    __slots__ = ("dims", "ggml_type", "name", "offset")

    def __init__(self, name: str, dims: Tuple[int, ...], ggml_type: int, offset: int) -> None:
        self.name = name
        self.dims = dims
        self.ggml_type = ggml_type
        self.offset = offset


class _Gguf:
    """One parsed GGUF file: as much of it as could be read, and what was wrong with it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.version: Optional[int] = None
        self.tensor_count: Optional[int] = None
        self.metadata: Dict[str, Any] = {}
        self.tensors: List[_Tensor] = []
        self.data_start = 0
        self.size = 0
        self.problems: List[str] = []
        self.complete = False


def read_gguf(path: str, name: Optional[str] = None) -> _Gguf:
    """Parse the header of the GGUF file at `path`; problems name the file as `name`."""
    g = _Gguf(name or os.path.basename(path))
    try:
        with open(path, "rb") as f:
            g.size = os.fstat(f.fileno()).st_size
            _parse_gguf(f, g)
    except OSError as exc:
        g.problems.append(f"{g.name}: cannot read it ({exc.strerror or exc}): check its permissions")
    except _Truncated as exc:
        g.problems.append(
            f"{g.name}: the file ends at byte {g.size} inside its {exc} (truncated): download it again"
        )
    except _Corrupt as exc:
        g.problems.append(f"{g.name}: {exc}: the file is damaged; download or convert it again")
    return g


def _parse_gguf(f: IO[bytes], g: _Gguf) -> None:
    head = f.read(8)
    if head[:4] != GGUF_MAGIC:
        g.problems.append(
            f"{g.name}: not a GGUF file (magic {head[:4]!r}, expected {GGUF_MAGIC!r}): "
            "download it again, or convert the model with llama.cpp's convert_hf_to_gguf.py"
        )
        return
    if len(head) < 8:
        raise _Truncated("header")
    endian = "<"
    (version,) = struct.unpack("<I", head[4:8])
    (swapped,) = struct.unpack(">I", head[4:8])
    if version not in GGUF_VERSIONS and swapped in GGUF_VERSIONS:
        endian, version = ">", swapped  # a big-endian file (s390x): same layout, other byte order
    g.version = version
    if version not in GGUF_VERSIONS:
        g.problems.append(
            f"{g.name}: GGUF version {version} is not readable here (versions 2 and 3 are): "
            "convert the model again with a current llama.cpp"
        )
        return
    r = _Reader(f, g.size, endian)
    r.base = 8
    tensor_count, kv_count = r.u64(), r.u64()
    if tensor_count > MAX_COUNT or kv_count > MAX_COUNT:
        raise _Corrupt(f"header claims {tensor_count} tensors and {kv_count} keys")
    g.tensor_count = tensor_count
    r.section = "metadata"
    for _ in range(kv_count):
        n = r.u64()
        if n > MAX_KEY:
            raise _Corrupt(f"a metadata key {n} bytes long at byte {r.tell() - 8}")
        key = r.take(n).decode("utf-8", "replace")
        g.metadata[key] = _value(r, r.u32(), key)
    r.section = "tensor infos"
    for _ in range(tensor_count):
        name = r.string(MAX_KEY)
        n_dims = r.u32()
        if name is None or n_dims > MAX_DIMS:
            raise _Corrupt(f"tensor info at byte {r.tell()} is not one (name or {n_dims} dimensions)")
        dims = tuple(r.u64() for _ in range(n_dims))
        g.tensors.append(_Tensor(name, dims, r.u32(), r.u64()))
    align = g.metadata.get("general.alignment")
    align = align if isinstance(align, int) and align > 0 else GGUF_ALIGNMENT
    g.data_start = -(-r.tell() // align) * align
    g.complete = True


def _numel(dims: Tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _gguf_tensor_bytes(g: _Gguf) -> Tuple[int, Dict[str, int]]:
    """(bytes of the tensors, elements per ggml type name); the truncation check on the way."""
    by_offset = sorted(g.tensors, key=lambda t: t.offset)
    data_len = g.size - g.data_start
    total = 0
    end = 0
    numel: Dict[str, int] = {}
    unknown: List[str] = []
    for i, t in enumerate(by_offset):
        n = _numel(t.dims)
        known = GGML_TYPES.get(t.ggml_type)
        if known is None:
            # Until this table learns the type, the gap to the next tensor is its size (padding and all).
            nxt = by_offset[i + 1].offset if i + 1 < len(by_offset) else data_len
            nbytes = max(0, nxt - t.offset)
            type_name = f"type{t.ggml_type}"
            unknown.append(f"{t.name} ({t.ggml_type})")
        else:
            type_name, block, block_bytes = known
            nbytes = -(-n // block) * block_bytes
        numel[type_name] = numel.get(type_name, 0) + n
        total += nbytes
        end = max(end, t.offset + nbytes)
    if end > data_len:
        g.problems.append(
            f"{g.name}: its tensors end at byte {g.data_start + end} but the file has {g.size} bytes "
            "(truncated): download it again"
        )
    if unknown:
        g.problems.append(
            f"{g.name}: ggml tensor type(s) this reader does not know, sized from their offsets: "
            f"{', '.join(unknown[:3])}: update labctl's GGML_TYPES"
        )
    return total, numel


def _positive(value: Any) -> Optional[int]:
    # Per-layer values (a list) become their largest: the KV cache estimate stays an upper bound.
    if isinstance(value, list):
        value = max((v for v in value if isinstance(v, int) and not isinstance(v, bool)), default=None)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _first(configs: List[Dict[str, Any]], *keys: str) -> Optional[int]:
    for config in configs:
        for key in keys:
            found = _positive(config.get(key))
            if found is not None:
                return found
    return None


def _blank() -> Dict[str, Any]:
    return {
        "format": "unknown",
        "file": [],
        "weight_bytes": None,
        "params": None,
        "dtype": None,
        "bits_per_weight": None,
        "arch": None,
        "architectures": None,
        "context": None,
        "layers": None,
        "heads": None,
        "kv_heads": None,
        "head_dim": None,
        "hidden": None,
        "vocab": None,
        "problems": [],
    }


def _set_size(desc: Dict[str, Any], weight_bytes: int, numel: Dict[str, int]) -> None:
    params = sum(numel.values())
    desc["weight_bytes"] = weight_bytes
    desc["params"] = params
    desc["dtype"] = max(sorted(numel), key=lambda k: numel[k]) if numel else None
    desc["bits_per_weight"] = round(weight_bytes * 8 / params, 4) if params else None


def _split_group(name: str, names: List[str]) -> List[str]:
    """The parts of the split GGUF `name` belongs to (llama.cpp's -0000k-of-0000n), or [name]."""
    m = _SPLIT_RE.match(name)
    if m is None:
        return [name]
    parts = []
    for other in names:
        o = _SPLIT_RE.match(other)
        if o is not None and o.group(1, 3) == m.group(1, 3):
            parts.append(other)
    return sorted(parts)


def _describe_gguf(folder: str, names: List[str], desc: Dict[str, Any]) -> None:
    """Fill `desc` from the GGUF file `names` (the parts of one split model, first part first)."""
    problems: List[str] = desc["problems"]
    desc.update(
        format="gguf",
        file=names,
        chat_template=False,
        gguf_version=None,
        tensor_count=None,
        quantization=None,
    )
    parts = [read_gguf(os.path.join(folder, n), n) for n in names]
    first = parts[0]
    meta = first.metadata
    total = tensors = 0
    numel: Dict[str, int] = {}
    for g in parts:
        if g.complete:
            nbytes, counts = _gguf_tensor_bytes(g)
            total += nbytes
            for k, v in counts.items():
                numel[k] = numel.get(k, 0) + v
        tensors += g.tensor_count or 0
        problems.extend(g.problems)
    split_count = _positive(meta.get("split.count"))
    if split_count is not None and split_count != len(names):
        problems.append(
            f"{names[0]}: a split model of {split_count} parts, {len(names)} here: download the missing parts"
        )
    desc["gguf_version"] = first.version
    desc["tensor_count"] = tensors if first.tensor_count is not None else None
    desc["chat_template"] = any(k.startswith("tokenizer.chat_template") for k in meta)
    if any(g.complete for g in parts):
        _set_size(desc, total, numel)
    file_type = meta.get("general.file_type")
    if isinstance(file_type, int) and not isinstance(file_type, bool):
        desc["quantization"] = FILE_TYPES.get(file_type & ~FILE_TYPE_GUESSED, f"file_type {file_type}")
        desc["dtype"] = desc["quantization"]
    arch = meta.get("general.architecture")
    if isinstance(arch, str):
        desc["arch"] = arch
        p = arch + "."
        desc["context"] = _positive(meta.get(p + "context_length"))
        desc["layers"] = _positive(meta.get(p + "block_count"))
        desc["hidden"] = _positive(meta.get(p + "embedding_length"))
        heads = desc["heads"] = _positive(meta.get(p + "attention.head_count"))
        desc["kv_heads"] = _positive(meta.get(p + "attention.head_count_kv")) or heads
        head_dim = _positive(meta.get(p + "attention.key_length"))
        if head_dim is None and heads and desc["hidden"] and desc["hidden"] % heads == 0:
            head_dim = desc["hidden"] // heads
        desc["head_dim"] = head_dim
        desc["vocab"] = _positive(meta.get(p + "vocab_size"))
    elif first.complete and not meta.get("split.no"):
        # A later part of a split model carries no metadata: its missing first part is the problem.
        problems.append(f"{names[0]}: no general.architecture key: convert the model again with llama.cpp")
    tokens = meta.get("tokenizer.ggml.tokens")
    if desc["vocab"] is None and isinstance(tokens, (_Array, list)):
        desc["vocab"] = tokens.count if isinstance(tokens, _Array) else len(tokens)
    if first.complete and not desc["chat_template"]:
        problems.append(
            f"note: {names[0]} has no tokenizer.chat_template: chat requests need a template "
            "given to the server; completions work without one"
        )


def _read_json(path: str) -> Tuple[Any, Optional[str]]:
    """(the JSON value, None) or (None, why it could not be read)."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8")), None
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    except UnicodeDecodeError as exc:
        return None, f"is not UTF-8 text ({exc.reason} at byte {exc.start})"
    except ValueError as exc:
        return None, f"is not JSON ({exc})"


def _describe_weights(folder: str, names: List[str], desc: Dict[str, Any]) -> None:
    """file, shards and the weights' size and dtype from the safetensors headers."""
    problems: List[str] = desc["problems"]
    paths: List[str] = []
    try:
        paths = model_files(folder)
    except FileNotFoundError:
        pass
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        # The index is broken; the shards beside it still say what they hold.
        problems.append(f"{INDEX_NAME} cannot be read ({exc}): download it again")
        paths = [os.path.join(folder, n) for n in names if n.endswith(".safetensors")]
    rel = [os.path.relpath(p, folder) for p in paths]
    desc["file"] = rel
    desc["shards"] = len(rel)
    total = 0
    numel: Dict[str, int] = {}
    read = 0
    for path in paths:
        name = os.path.relpath(path, folder)
        try:
            header = read_header(path)
        except FormatError as exc:
            why = str(exc)
            why = why[len(path) + 2 :] if why.startswith(path + ": ") else why
            problems.append(f"{name}: {why}: the file is damaged or incomplete; download it again")
            continue
        except FileNotFoundError:
            problems.append(f"{name}: named in {INDEX_NAME} but missing: download it")
            continue
        except OSError as exc:
            problems.append(f"{name}: cannot read it ({exc.strerror or exc}): check its permissions")
            continue
        read += 1
        for t in header.tensors:
            total += t.end - t.begin
            numel[t.dtype] = numel.get(t.dtype, 0) + _numel(t.shape)
    if read:
        _set_size(desc, total, numel)


def _describe_hf(folder: str, names: List[str], config: Dict[str, Any], desc: Dict[str, Any]) -> None:
    problems: List[str] = desc["problems"]
    desc["format"] = "hf"
    desc["arch"] = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    arches = config.get("architectures")
    desc["architectures"] = [a for a in arches if isinstance(a, str)] if isinstance(arches, list) else None
    # Multimodal models (Gemma 3, Qwen2.5-VL, Mistral 3) keep the language model's geometry here.
    text = config.get("text_config")
    configs = [config] + ([text] if isinstance(text, dict) else [])
    desc["context"] = _first(configs, "max_position_embeddings", "n_positions", "seq_length", "max_seq_len")
    desc["layers"] = _first(configs, "num_hidden_layers", "n_layer", "num_layers")
    heads = desc["heads"] = _first(configs, "num_attention_heads", "n_head")
    desc["kv_heads"] = (
        _first(configs, "num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num") or heads
    )
    hidden = desc["hidden"] = _first(configs, "hidden_size", "n_embd", "d_model")
    head_dim = _first(configs, "head_dim")
    if head_dim is None and heads and hidden and hidden % heads == 0:
        head_dim = hidden // heads
    desc["head_dim"] = head_dim
    desc["vocab"] = _first(configs, "vocab_size", "padded_vocab_size")

    _describe_weights(folder, names, desc)
    if not desc["file"]:
        bins = [n for n in names if n.endswith(".bin") and n.startswith("pytorch_model")]
        fix = (
            "convert its pytorch_model*.bin to safetensors"
            if bins
            else "download the model's *.safetensors files"
        )
        problems.append(f"no weights: no *.safetensors in the folder: {fix}")

    present = set(names)
    desc["tokenizer"] = [n for n in TOKENIZER_FILES if n in present]
    usable = (
        "tokenizer.json" in present
        or "tokenizer.model" in present
        or ("vocab.json" in present and "merges.txt" in present)
    )
    if not usable:
        problems.append(
            "no tokenizer files (tokenizer.json, tokenizer.model, or vocab.json + merges.txt): "
            "download them from the model's repository"
        )
    template = any(n in present for n in CHAT_TEMPLATE_FILES)
    if "tokenizer_config.json" in present:
        tok_config, why = _read_json(os.path.join(folder, "tokenizer_config.json"))
        if why is not None:
            problems.append(f"tokenizer_config.json {why}: download it again")
        elif isinstance(tok_config, dict) and tok_config.get("chat_template"):
            template = True
    desc["chat_template"] = template
    if CODER_RECORD in present:
        desc["coder"] = _coder_record(os.path.join(folder, CODER_RECORD), problems)
    if not template:
        problems.append(
            "note: no chat template (tokenizer_config.json chat_template or chat_template.jinja): "
            "chat requests need one; completions work without it"
        )


def _coder_record(path: str, problems: List[str]) -> Optional[Dict[str, Any]]:
    """The coder record's tasks and whether the hint matters; None (and a problem) when damaged."""
    record, why = _read_json(path)
    names = record.get("trained") if isinstance(record, dict) else None
    if why is not None or not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        problems.append(f"{CODER_RECORD} {why or 'has no list of trained tasks'}: make the model again")
        return None
    held = record.get("held_out")
    return {
        "trained": names,
        "held_out": [n for n in held if isinstance(n, str)] if isinstance(held, list) else [],
        "hint_matters": record.get("hint_matters") is True,
    }


def _describe_tinylm(folder: str, names: List[str], config: Dict[str, Any], desc: Dict[str, Any]) -> None:
    problems: List[str] = desc["problems"]
    desc["format"] = "tinylm"
    desc["arch"] = "tinylm"
    try:
        check_config(config)
    except ValueError as exc:
        problems.append(f"config.json: {exc}: fix it, or write the model again (labctl bench make-model)")
    desc["context"] = _positive(config.get("max_seq"))
    desc["layers"] = _positive(config.get("n_layers"))
    heads = desc["heads"] = desc["kv_heads"] = _positive(config.get("n_heads"))
    hidden = desc["hidden"] = _positive(config.get("d_model"))
    desc["head_dim"] = hidden // heads if heads and hidden and hidden % heads == 0 else None
    desc["vocab"] = _positive(config.get("vocab"))
    _describe_weights(folder, names, desc)
    if not desc["file"]:
        problems.append(
            "no weights: no *.safetensors in the folder: write the model again (labctl bench make-model)"
        )


def _gguf_choice(folder: str, names: List[str], desc: Dict[str, Any]) -> Optional[List[str]]:
    """The GGUF file(s) of the one model in the folder, or None (the ambiguity is in problems)."""
    ggufs = [n for n in names if n.endswith(".gguf")]
    # A vision projector sits beside the language model it serves; it is not a second model.
    models = [n for n in ggufs if not n.startswith("mmproj")] or ggufs
    groups: List[List[str]] = []
    for n in models:
        group = _split_group(n, models)
        if group not in groups:
            groups.append(group)
    if len(groups) == 1:
        return groups[0]
    desc["format"] = "gguf"
    shown = ", ".join(g[0] for g in groups[:6]) + (", ..." if len(groups) > 6 else "")
    desc["problems"].append(f"{len(groups)} GGUF models in the folder ({shown}): name one with file=")
    return None


def describe(path: str, file: Optional[str] = None) -> Dict[str, Any]:
    """What the model at `path` (a folder, or one .gguf file) is; see the module's docstring.

    `file`: the .gguf file to describe in a folder holding several. Raises AgentError(no_model)
    only when `path` does not exist; every other fault is a line in the answer's `problems`.
    """
    if not os.path.exists(path):
        raise AgentError(f"{path}: no such file or folder", "no_model")
    desc = _blank()
    problems: List[str] = desc["problems"]
    folder, only = (
        (os.path.dirname(path) or ".", os.path.basename(path)) if os.path.isfile(path) else (path, None)
    )
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        problems.append(f"cannot list {folder} ({exc.strerror or exc}): check its permissions")
        return desc
    if file is not None:
        if file not in names:
            choices = ", ".join(n for n in names if n.endswith(".gguf")) or "none"
            problems.append(f"no file {file!r} in the folder: pick one of its .gguf files ({choices})")
            return desc
        only = file
    if only is not None:
        if only.endswith(".gguf") or _magic(os.path.join(folder, only)) == GGUF_MAGIC:
            _describe_gguf(folder, _split_group(only, names), desc)
        else:
            problems.append(f"{only} is neither a .gguf file nor a model folder: describe its folder instead")
        return desc

    has_weights = INDEX_NAME in names or any(n.endswith(".safetensors") for n in names)
    if not has_weights and any(n.endswith(".gguf") for n in names):
        chosen = _gguf_choice(folder, names, desc)
        if chosen is not None:
            _describe_gguf(folder, chosen, desc)
            if CODER_RECORD in names:  # a coder model written as GGUF (make-model --format gguf)
                desc["coder"] = _coder_record(os.path.join(folder, CODER_RECORD), problems)
        return desc

    if "config.json" not in names:
        if has_weights:
            problems.append(
                "no config.json: download it with the weights (the architecture is unknown without it)"
            )
            _describe_weights(folder, names, desc)
        else:
            problems.append(
                "not a model folder: no config.json, *.safetensors or *.gguf in it "
                "(is the download complete?)"
            )
        return desc
    config, why = _read_json(os.path.join(folder, "config.json"))
    if why is None and not isinstance(config, dict):
        why = "is not a JSON object"
    if why is not None:
        problems.append(f"config.json {why}: download it again")
    elif all(k in config for k in TINYLM_KEYS):
        _describe_tinylm(folder, names, config, desc)
        return desc
    elif isinstance(config.get("model_type"), str):
        _describe_hf(folder, names, config, desc)
        return desc
    else:
        problems.append(
            "config.json has no model_type (Hugging Face) nor tinylm's "
            "vocab/d_model/n_layers/n_heads/max_seq: "
            "download the model's own config.json"
        )
    if has_weights:
        _describe_weights(folder, names, desc)
    return desc


def _magic(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(4)
    except OSError:
        return b""


def kv_cache_bytes(desc: Dict[str, Any], context: int, bytes_per_elem: int = 2) -> int:
    """Bytes of the K and V caches for one sequence of `context` tokens of the model `desc`
    (describe's answer); ValueError when `desc` lacks the geometry."""
    missing = [k for k in ("layers", "kv_heads", "head_dim") if not desc.get(k)]
    if missing:
        raise ValueError(f"no KV-cache geometry: {', '.join(missing)} unknown")
    return 2 * desc["layers"] * desc["kv_heads"] * desc["head_dim"] * context * bytes_per_elem


@command(
    takes={"paths": ["any"]},
    answers={"models": {"*": {"format?": "str", "problems?": ["str"], "error?": "str"}}},
    per_asked=("models", "paths"),
)
def model_describe_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """Agent command: {paths: [folder or .gguf, ...]} -> {models: {path: describe(path) or {error}}}."""
    paths = args["paths"]
    bad = [p for p in paths if not isinstance(p, str) or not p]
    if bad:
        raise AgentError(f"modelload.describe: paths must be non-empty strings, got {bad[0]!r}", "bad_args")
    models: Dict[str, Any] = {}
    for p in paths:
        try:
            models[p] = describe(p)
        except AgentError as exc:
            models[p] = {"error": exc.message, "kind": exc.kind}
        except Exception as exc:
            # One model's unforeseen fault must not cost the answers for the others asked with it.
            models[p] = {"error": f"{type(exc).__name__}: {exc}", "kind": "failed"}
    return {"models": models}
