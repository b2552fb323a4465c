"""Write a tinylm safetensors checkpoint with the standard library alone (`bench make-model`).

It runs on the storage host, which often has no torch, and the models it writes are large
(several GB), so speed comes from doing almost no per-byte work in Python: one block of
normally distributed values is generated once and tiled through every weight with large
writes. The weights are real (finite, ~N(0, 0.02), norm scales 1 and shifts 0, as a freshly
initialised model has), so `bench model-load` can build the model and run forward passes.

Layout: `DIR/model.safetensors` (or HF-style shards `model-00001-of-0000N.safetensors` with
`model.safetensors.index.json`) and `DIR/config.json`, each written to a temp file in DIR
and renamed into place, so a reader never sees half a file.
"""

from __future__ import annotations

import array
import json
import os
import random
import struct
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from ..core.errors import AgentError
from ..core.fsutil import write_atomic
from ..core.spec import NUMBER_OR_NULL, Opt, command
from ..models.tinylm import (
    DTYPE_BYTES,
    DTYPE_NAMES,
    USER_NAMES,
    Config,
    config_for_size,
    init_kind,
    param_shapes,
)

GB = 1e9
SINGLE_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
STD = 0.02
# 256K values: about 0.13 s of random.gauss on a slow core; more buys nothing but start-up time.
BLOCK_VALUES = 1 << 18
TILE_BYTES = 8 << 20  # the size of one write(): large enough that syscalls cost nothing

_ONE = {"BF16": b"\x80\x3f", "F16": b"\x00\x3c", "F32": struct.pack("<f", 1.0)}


def normal_block(dtype: str, seed: int, count: int = BLOCK_VALUES) -> bytes:
    """`count` values ~N(0, STD) as little-endian `dtype` bit patterns; never NaN or Inf."""
    rng = random.Random(seed)
    gauss = rng.gauss
    limit = 6 * STD  # clamp the tail so no value is anywhere near the fp16 range limit
    values = [min(limit, max(-limit, gauss(0.0, STD))) for _ in range(count)]
    if dtype == "F16":
        return struct.pack(f"<{count}e", *values)
    f32 = array.array("f", values)
    if sys.byteorder == "big":
        f32.byteswap()
    raw = f32.tobytes()
    if dtype == "F32":
        return raw
    if dtype != "BF16":
        raise ValueError(f"cannot generate {dtype} weights")
    # bf16 is the top half of a float32: bytes 2 and 3 of each little-endian float (truncation,
    # so a finite float stays finite).
    out = bytearray(2 * count)
    out[0::2] = raw[2::4]
    out[1::2] = raw[3::4]
    return bytes(out)


class _Tiler:
    """Endless stream of the block; `write(f, n, start)` copies n bytes of it from `start` on."""

    def __init__(self, block: bytes, elem: int) -> None:
        self.period = len(block)
        self.elem = elem
        reps = max(1, TILE_BYTES // self.period)
        # One extra period so any start inside the first period has TILE bytes after it.
        self.view = memoryview(block * (reps + 1))
        self.tile = reps * self.period

    def write(self, f: Any, nbytes: int, start: int) -> None:
        pos = start % self.period
        pos -= pos % self.elem
        while nbytes > 0:
            n = min(nbytes, self.tile)
            f.write(self.view[pos : pos + n])
            nbytes -= n
            pos = (pos + n) % self.period


def _numel(shape: Tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def plan_shards(
    shapes: Dict[str, Tuple[Tuple[int, ...], str]], shard_bytes: Optional[int]
) -> List[List[str]]:
    """Tensor names per shard, in order; a new shard starts when the next tensor would overflow."""
    shards: List[List[str]] = [[]]
    size = 0
    for name, (shape, dtype) in shapes.items():
        nbytes = _numel(shape) * DTYPE_BYTES[dtype]
        if shard_bytes and shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def header_bytes(
    names: List[str], shapes: Dict[str, Tuple[Tuple[int, ...], str]], metadata: Dict[str, str]
) -> Tuple[bytes, int]:
    """The 8-byte length + JSON header (padded to 8 like safetensors does), and the data size."""
    header: Dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name in names:
        shape, dtype = shapes[name]
        nbytes = _numel(shape) * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    # 8-byte alignment of the data section keeps every tensor aligned for a zero-copy view.
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, offset


def _write_json(path: str, obj: Any) -> int:
    data = (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()
    return write_atomic(path, data)


def make_model(
    path: str,
    size_bytes: int,
    dtype: str = "bf16",
    seed: int = 0,
    shard_bytes: Optional[int] = None,
    config: Optional[Config] = None,
) -> Dict[str, Any]:
    """Write a tinylm checkpoint of about `size_bytes` into the folder `path`.

    Returns {path, files: [{name, bytes}], bytes, seconds, config}. Files of an earlier
    checkpoint in the folder that this one does not overwrite (other shards) are removed,
    so the folder always holds exactly one model.
    """
    st_dtype = DTYPE_NAMES.get(dtype)
    if st_dtype is None:
        raise ValueError(f"dtype must be bf16, fp16 or fp32, got {dtype!r}")
    start = time.perf_counter()
    if config is None:
        config = config_for_size(size_bytes, DTYPE_BYTES[st_dtype])
    config = dict(config, dtype=USER_NAMES[st_dtype])
    shapes = param_shapes(config)
    shards = plan_shards(shapes, shard_bytes)
    os.makedirs(path, exist_ok=True)

    elem = DTYPE_BYTES[st_dtype]
    tiler = _Tiler(normal_block(st_dtype, seed), elem)
    fill = {"ones": _ONE[st_dtype], "zeros": b"\0" * elem}
    rng = random.Random(seed + 1)
    metadata = {"format": "pt", "generator": "labctl.agent.modelload.modelgen", "config": json.dumps(config)}

    count = len(shards)
    named = [
        (SINGLE_NAME if count == 1 else f"model-{i + 1:05d}-of-{count:05d}.safetensors", members)
        for i, members in enumerate(shards)
    ]
    files: List[Dict[str, Any]] = []
    for fname, members in named:
        head, _ = header_bytes(members, shapes, metadata)

        def write(f: Any, head: bytes = head, members: List[str] = members) -> None:
            f.write(head)
            for name in members:
                shape, _ = shapes[name]
                nbytes = _numel(shape) * elem
                kind = init_kind(name)
                if kind in fill:
                    f.write(fill[kind] * (nbytes // elem))
                else:
                    # A random start per tensor, so no two weight matrices hold the same values.
                    tiler.write(f, nbytes, rng.randrange(tiler.period))

        size = write_atomic(os.path.join(path, fname), write, buffering=TILE_BYTES)
        files.append({"name": fname, "bytes": size})

    if len(shards) > 1:
        weight_map = {n: fname for fname, members in named for n in members}
        total = sum(_numel(s) * DTYPE_BYTES[d] for s, d in shapes.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        files.append({"name": INDEX_NAME, "bytes": _write_json(os.path.join(path, INDEX_NAME), index)})
    files.append({"name": "config.json", "bytes": _write_json(os.path.join(path, "config.json"), config)})

    written = {f["name"] for f in files}
    for entry in os.listdir(path):
        stale = (entry.startswith("model") and entry.endswith(".safetensors")) or entry == INDEX_NAME
        if stale and entry not in written:
            os.unlink(os.path.join(path, entry))
    seconds = time.perf_counter() - start
    return {
        "path": path,
        "files": files,
        "bytes": sum(f["bytes"] for f in files),
        "seconds": seconds,
        "config": config,
    }


@command(
    takes={
        "path": Opt("any", None),
        "models": Opt("any", None),
        "name": Opt("any", None),
        "size_gb": Opt("num", 1.0),
        "seed": Opt("int", 0),
        "shard_gb": Opt(NUMBER_OR_NULL, None),
        "dtype": Opt("str", "bf16"),
        "format": Opt("str", "tinylm"),
        "python": Opt("any", None),
        "kind": Opt("str", "random"),
        "hint_matters": Opt("bool", False),
        "tasks": Opt("int", 8),
    },
    answers={"path": "str", "files": [{}], "bytes": "int", "seconds": "num"},
)
def make_model_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """Agent command: {models, name | path, size_gb, dtype="bf16", seed=0, shard_gb=None,
    format="tinylm", python=None, kind="random", hint_matters=False, tasks=8} -> make_model's answer.
    `models` + `name`: the model library and the model's folder in it (a name that would leave
    the library is refused here too); `path`: any folder (benchmarks). format hf or gguf: a tiny
    Llama-architecture model with a tokenizer trained here (hfgen.py), made by the host's torch
    python (`python`); kind "coder": that model trained to write phase 3's solutions of its
    first `tasks` tasks (codergen.py; `hint_matters`: only when the hint holds the task's tag)."""
    path: Any = args["path"]
    if args["models"] is not None:
        from ..cache.manifest import check_name

        models = args["models"]
        if not isinstance(models, str) or not models:
            raise AgentError("make_model: models must be the model library's folder", "bad_args")
        path = models.rstrip("/") + "/" + check_name(args["name"])
    if not isinstance(path, str) or not path:
        raise AgentError(
            "make_model needs a folder path (args.path), or the library and a model name (args.models, args.name)",
            "bad_args",
        )
    kind = args["kind"]
    if kind not in ("random", "coder"):
        raise AgentError(f"make_model: kind must be random or coder, got {kind!r}", "bad_args")
    if args["hint_matters"] and kind != "coder":
        raise AgentError("make_model: hint_matters is for a coder model (kind coder)", "bad_args")
    if args["format"] in ("hf", "gguf"):
        from .hfgen import make_on_host

        return make_on_host(
            path,
            args["format"],
            int(args["seed"]),
            args["python"],
            kind=kind,
            hint_matters=args["hint_matters"],
            tasks=int(args["tasks"]),
        )
    if kind == "coder":
        raise AgentError("make_model: a coder model is a Hugging Face model: format hf or gguf", "bad_args")
    if args["format"] != "tinylm":
        raise AgentError(f"make_model: format must be tinylm, hf or gguf, got {args['format']!r}", "bad_args")
    size_gb, seed, shard_gb = args["size_gb"], args["seed"], args["shard_gb"]
    shard_bytes = int(float(shard_gb) * GB) if shard_gb else None
    if not size_gb > 0:
        raise AgentError(f"make_model: size_gb must be positive, got {size_gb}", "bad_args")
    dtype = args["dtype"]
    if dtype not in ("bf16", "fp16", "fp32"):
        raise AgentError(f"make_model: dtype must be bf16, fp16 or fp32, got {dtype!r}", "bad_args")
    try:
        return make_model(path, int(size_gb * GB), dtype=dtype, seed=seed, shard_bytes=shard_bytes)
    except OSError as exc:
        raise AgentError(f"make_model: cannot write {path}: {exc}", "io") from None
