"""tinylm: a real, small decoder-only transformer that labctl writes, loads, benchmarks and trains.

The shapes are pure arithmetic (`param_shapes`), so the stdlib-only model generator on a host
without torch writes a checkpoint whose names and shapes are exactly those of
`build_model(config).state_dict()`. torch is imported only inside `build_model`.

The model has no buffers (positions are a learned embedding, the causal mask comes from
`scaled_dot_product_attention(is_causal=True)`): a model built on the meta device and given
loaded tensors with `load_state_dict(..., assign=True)` is then complete, nothing left on meta.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    import torch

Config = Dict[str, Any]

# Element sizes of the dtypes a checkpoint can be written in, by safetensors name.
DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4}
# The names users type (`--dtype bf16`) and safetensors' names for them.
DTYPE_NAMES = {"bf16": "BF16", "fp16": "F16", "fp32": "F32", "BF16": "BF16", "F16": "F16", "F32": "F32"}
USER_NAMES = {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}

CONFIG_KEYS = ("vocab", "d_model", "n_layers", "n_heads", "d_ff", "max_seq")


def make_config(
    vocab: int,
    d_model: int,
    n_layers: int,
    n_heads: int,
    d_ff: int,
    max_seq: int,
    tie_embeddings: bool = False,
    dtype: str = "bf16",
) -> Config:
    config = {
        "model_type": "tinylm",
        "vocab": vocab,
        "d_model": d_model,
        "n_layers": n_layers,
        "n_heads": n_heads,
        "d_ff": d_ff,
        "max_seq": max_seq,
        "tie_embeddings": tie_embeddings,
        "dtype": dtype,
    }
    check_config(config)
    return config


def check_config(config: Config) -> None:
    """Raise ValueError naming the first bad field (config.json may come from anywhere)."""
    for key in CONFIG_KEYS:
        value = config.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"tinylm config: {key} must be a positive integer, got {value!r}")
    if config["d_model"] % config["n_heads"]:
        raise ValueError(
            f"tinylm config: d_model ({config['d_model']}) must be a multiple of n_heads ({config['n_heads']})"
        )
    if storage_dtype(config) not in DTYPE_BYTES:
        raise ValueError(f"tinylm config: dtype must be bf16, fp16 or fp32, got {config.get('dtype')!r}")


def storage_dtype(config: Config) -> str:
    """The safetensors dtype name of the config's weights (BF16 when the config names none)."""
    return DTYPE_NAMES.get(str(config.get("dtype", "bf16")), str(config.get("dtype")))


def param_shapes(config: Config) -> Dict[str, Tuple[Tuple[int, ...], str]]:
    """name -> (shape, safetensors dtype), in `build_model(config).state_dict()` order."""
    check_config(config)
    v, d, ff, s = config["vocab"], config["d_model"], config["d_ff"], config["max_seq"]
    dt = storage_dtype(config)
    shapes: Dict[str, Tuple[Tuple[int, ...], str]] = OrderedDict()
    shapes["embed.weight"] = ((v, d), dt)
    shapes["pos.weight"] = ((s, d), dt)
    for i in range(config["n_layers"]):
        p = f"blocks.{i}."
        shapes[p + "ln1.weight"] = ((d,), dt)
        shapes[p + "ln1.bias"] = ((d,), dt)
        shapes[p + "attn.qkv.weight"] = ((3 * d, d), dt)
        shapes[p + "attn.proj.weight"] = ((d, d), dt)
        shapes[p + "ln2.weight"] = ((d,), dt)
        shapes[p + "ln2.bias"] = ((d,), dt)
        shapes[p + "mlp.fc.weight"] = ((ff, d), dt)
        shapes[p + "mlp.proj.weight"] = ((d, ff), dt)
    shapes["ln_f.weight"] = ((d,), dt)
    shapes["ln_f.bias"] = ((d,), dt)
    if not config.get("tie_embeddings", False):
        shapes["lm_head.weight"] = ((v, d), dt)
    return shapes


def init_kind(name: str) -> str:
    """How a fresh model initialises this tensor: "ones" (norm scales), "zeros" (norm shifts), "normal"."""
    if ".ln" in name or name.startswith("ln"):
        return "ones" if name.endswith(".weight") else "zeros"
    return "normal"


def param_count(config: Config) -> int:
    return sum(math.prod(shape) for shape, _ in param_shapes(config).values())


def _count(vocab: int, d: int, n: int, ff: int, seq: int, tie: bool) -> int:
    """param_count without building the dict: the size search evaluates thousands of shapes."""
    embed = vocab * d * (1 if tie else 2) + seq * d + 2 * d
    return embed + n * (4 * d * d + 2 * d * ff + 4 * d)


# Vocabulary and context length, largest first: small targets get small embeddings so the
# transformer blocks, not the embedding tables, hold most of the weights (as in a real model).
_EMBED_CHOICES = ((32000, 2048), (8192, 1024), (2048, 512), (512, 256), (256, 128))


def config_for_size(target_bytes: int, dtype_bytes: int = 2, tie_embeddings: bool = False) -> Config:
    """A tinylm config whose weights take about `target_bytes` (within 1% from a few MB up).

    d_model (a multiple of 64, heads of 64) and n_layers are chosen for a GPT-like shape
    (d_model / n_layers near 64, d_ff near 4 * d_model); d_ff then absorbs the remainder, which
    is what makes the size exact rather than a step of one whole layer.
    """
    if target_bytes <= 0:
        raise ValueError(f"target size must be positive, got {target_bytes}")
    target = target_bytes / dtype_bytes
    best: Optional[Tuple[float, List[int]]] = None
    for rank, (vocab, seq) in enumerate(_EMBED_CHOICES):
        for d in range(64, 8192 + 1, 64):
            embed = _count(vocab, d, 0, 0, seq, tie_embeddings)
            if embed > 0.4 * target:
                break
            step = 64 if d >= 1024 else 8
            for n in range(1, 129):
                rest = target - embed - n * (4 * d * d + 4 * d)
                ff = round(rest / (2 * d * n) / step) * step
                if ff < 2 * d:
                    break
                if ff > 6 * d:
                    continue
                err = abs(_count(vocab, d, n, ff, seq, tie_embeddings) - target) / target
                if err > 0.01:
                    continue
                score = abs(math.log(d / n / 64)) + abs(math.log(ff / (4 * d))) + 0.3 * rank + 20 * err
                if best is None or score < best[0]:
                    best = (score, [vocab, d, n, ff, seq])
    if best is None:
        # Below a few hundred KB no shape fits within 1%: the smallest sensible model.
        vocab, d, n, ff, seq = 256, 64, 1, 256, 128
    else:
        vocab, d, n, ff, seq = best[1]
    dtype = {2: "bf16", 4: "fp32"}.get(dtype_bytes, "bf16")
    return make_config(vocab, d, n, d // 64, ff, seq, tie_embeddings=tie_embeddings, dtype=dtype)


def _classes() -> Any:
    """Define the nn.Module classes on first use, so importing this module needs no torch."""
    global _CLASSES
    if _CLASSES is not None:
        return _CLASSES
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Attention(nn.Module):
        def __init__(self, d: int, n_heads: int) -> None:
            super().__init__()
            self.n_heads = n_heads
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.proj = nn.Linear(d, d, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(b, t, d))

    class MLP(nn.Module):
        def __init__(self, d: int, ff: int) -> None:
            super().__init__()
            self.fc = nn.Linear(d, ff, bias=False)
            self.proj = nn.Linear(ff, d, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(F.gelu(self.fc(x)))

    class Block(nn.Module):
        def __init__(self, d: int, n_heads: int, ff: int) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(d)
            self.attn = Attention(d, n_heads)
            self.ln2 = nn.LayerNorm(d)
            self.mlp = MLP(d, ff)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class TinyLM(nn.Module):
        def __init__(self, config: Config) -> None:
            super().__init__()
            d = config["d_model"]
            self.config = dict(config)
            self.embed = nn.Embedding(config["vocab"], d)
            self.pos = nn.Embedding(config["max_seq"], d)
            self.blocks = nn.ModuleList(
                Block(d, config["n_heads"], config["d_ff"]) for _ in range(config["n_layers"])
            )
            self.ln_f = nn.LayerNorm(d)
            # Tied: the head reuses embed.weight in forward() and owns no parameter, so the
            # state_dict (and a safetensors file, which refuses aliased tensors) holds it once.
            self.lm_head = None if config.get("tie_embeddings") else nn.Linear(d, config["vocab"], bias=False)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            t = tokens.shape[-1]
            if t > self.pos.num_embeddings:
                raise ValueError(f"sequence of {t} tokens is longer than max_seq={self.pos.num_embeddings}")
            x = self.embed(tokens) + self.pos(torch.arange(t, device=tokens.device))
            for block in self.blocks:
                x = block(x)
            x = self.ln_f(x)
            if self.lm_head is None:
                return F.linear(x, self.embed.weight)
            return self.lm_head(x)

        def init_weights(self, std: float = 0.02) -> None:
            with torch.no_grad():
                for name, p in self.named_parameters():
                    kind = init_kind(name)
                    if kind == "ones":
                        p.fill_(1.0)
                    elif kind == "zeros":
                        p.zero_()
                    else:
                        p.normal_(0.0, std)

    _CLASSES = TinyLM
    return TinyLM


_CLASSES: Any = None


def build_model(config: Config, device: Any = None, dtype: Optional[torch.dtype] = None) -> torch.nn.Module:
    """A TinyLM for `config`, initialised like the generator's weights (N(0, 0.02), norms 1/0).

    Under `with torch.device("meta"):` it allocates nothing; give it weights with
    `load_state_dict(state, assign=True)`.
    """
    import torch

    check_config(config)
    cls = _classes()
    if device is not None:
        # Built where it will live: a multi-GB model never passes through host memory first.
        with torch.device(device):
            model = cls(config)
    else:
        model = cls(config)
    if dtype is not None:
        model = model.to(dtype=dtype)
    if not any(p.is_meta for p in model.parameters()):
        model.init_weights()
    return model
