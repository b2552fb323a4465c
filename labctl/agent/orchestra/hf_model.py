"""A Hugging Face causal LM behind labctl's model server (server.py), through `transformers`.

The folder is what the Hub holds: config.json (`model_type`), *.safetensors, tokenizer.json and
tokenizer_config.json, the chat template in tokenizer_config.json's `chat_template` or in
chat_template.jinja, maybe generation_config.json. The weights come through labctl's loader
(modelload/loader.py: one read per file, straight onto the device) into a model built on the
meta device, so they are never copied twice and never initialised for nothing. Decoding keeps
a KV cache: each new token costs one position, not the whole sequence. The tokenizer and the
chat template are the model's own, so usage is counted in its tokens.

The dtype follows the device (pick_dtype): bf16 where the GPU does it natively, fp16 on 7.x,
fp32 on older GPUs and on the CPU. A prompt longer than max_position_embeddings is refused; an
answer stops there ("length"). Standard library at import; torch and transformers inside.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from typing import Any, Dict, Generator, Iterator, List, Optional, Tuple

from .backend import ServedModel, pick_device, sample_token
from .openai_api import ApiError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def pick_dtype(device: str, capability: Optional[Tuple[int, int]], bf16_supported: bool) -> str:
    """The dtype to serve in on `device` (a GPU's compute capability and torch's bf16 verdict):
    bf16 from Ampere (8.0) on, where it is native and keeps fp32's range; fp16 on Volta and
    Turing (7.x), which have fp16 tensor cores and no bf16; fp32 below (a Pascal P40 runs fp16
    at 1/64 of its fp32 rate) and on the CPU, where fp32 is the fast and exact one."""
    if not device.startswith("cuda") or capability is None:
        return "float32"
    if tuple(capability) >= (8, 0) and bf16_supported:
        return "bfloat16"
    if tuple(capability) >= (7, 0):
        return "float16"
    return "float32"


def device_dtype(torch: Any, device: str) -> str:
    """pick_dtype for a real device, asking torch."""
    if not device.startswith("cuda"):
        return pick_dtype(device, None, False)
    capability = tuple(torch.cuda.get_device_capability(device))
    return pick_dtype(device, (int(capability[0]), int(capability[1])), bool(torch.cuda.is_bf16_supported()))


@contextmanager
def parameters_on_meta(torch: Any) -> Iterator[None]:
    """Modules made inside get their parameters on the meta device (no memory, no init), their
    buffers on the CPU as usual. The buffers matter: the rotary embedding's inverse frequencies
    are non-persistent buffers, absent from the checkpoint, computed when the module is made."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: Any, name: str, param: Any) -> None:
        register(module, name, param)
        if param is not None:
            param = module._parameters[name]
            module._parameters[name] = type(param)(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def _ids(value: Any) -> List[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value])]


class HFModel(ServedModel):
    """A Hugging Face causal LM folder, from files to ready, and its primitives."""

    format = "hf"
    limit_name = "max_position_embeddings"

    def __init__(self, name: str, model_dir: str, device: str = "auto") -> None:
        super().__init__(name, model_dir, device)
        self._model: Any = None
        self._tok: Any = None
        # The forward's name for the KV cache: `cache` in transformers 5.x, `past_key_values` before.
        self._cache_arg = "past_key_values"
        self._keep_arg = False

    def check(self) -> None:
        from ..modelload.loader import model_files, read_header

        with open(os.path.join(self.model_dir, "config.json")) as f:
            config = json.load(f)
        if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
            raise ValueError("config.json is not a Hugging Face config: it names no model_type")
        if not any(os.path.exists(os.path.join(self.model_dir, n)) for n in TOKENIZER_FILES):
            raise ValueError(f"{self.model_dir} has no tokenizer ({', '.join(TOKENIZER_FILES)})")
        for path in model_files(self.model_dir):
            read_header(path)
        self.config = config

    def load(self) -> None:
        """Tokenizer, config and weights; the model built on the meta device and given them."""
        if not self.config:
            self.check()
        try:
            import torch
            import transformers
        except ImportError as exc:
            raise RuntimeError(f"{exc.name} is not installed for {sys.executable}") from None
        from ..modelload.loader import load_model_dir

        self.device = pick_device(torch, self.device_arg)
        self.dtype = device_dtype(torch, self.device)
        start = time.perf_counter()
        self._tok = transformers.AutoTokenizer.from_pretrained(self.model_dir)
        config = transformers.AutoConfig.from_pretrained(self.model_dir)
        with parameters_on_meta(torch):
            model = transformers.AutoModelForCausalLM.from_config(config)
        dtype = getattr(torch, self.dtype)
        tensors = {
            k: v.to(dtype) if v.is_floating_point() else v
            for k, v in load_model_dir(self.model_dir, device=self.device).items()
        }
        result = model.load_state_dict(tensors, strict=False, assign=True)
        del tensors
        # Old checkpoints carry the rotary frequencies that models now compute themselves.
        unexpected = [k for k in result.unexpected_keys if not k.endswith("rotary_emb.inv_freq")]
        if unexpected:
            raise ValueError(
                f"the checkpoint has weights this {config.model_type} model lacks: {unexpected[:3]}"
            )
        if getattr(config, "tie_word_embeddings", False):
            head, embed = model.get_output_embeddings(), model.get_input_embeddings()
            if head is not None and head.weight.is_meta:
                head.weight = embed.weight
        missing = [name for name, p in model.named_parameters() if p.is_meta]
        if missing:
            raise ValueError(f"the checkpoint lacks weights the model needs: {missing[:3]}")
        # The buffers (made on the CPU) join the weights; their dtype stays (rotary: fp32).
        self._model = model.to(self.device).eval()
        forward = _parameters(self._model.forward)
        self._cache_arg = "cache" if "cache" in forward else "past_key_values"
        self._keep_arg = "logits_to_keep" in forward
        self.eos = frozenset(self._eos_ids(config))
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)
        self.load_s = time.perf_counter() - start
        self.state = "warming"

    def _eos_ids(self, config: Any) -> List[int]:
        """Every token that ends an answer: the config's, the generation config's, the tokenizer's."""
        found = _ids(getattr(config, "eos_token_id", None)) + _ids(self._tok.eos_token_id)
        path = os.path.join(self.model_dir, "generation_config.json")
        if os.path.exists(path):
            with open(path) as f:
                generation = json.load(f)
            if isinstance(generation, dict):
                found += _ids(generation.get("eos_token_id"))
        return sorted(set(found))

    def warm(self) -> None:
        """One forward pass of one token: kernels chosen, memory allocated, before "ready"."""
        import torch

        assert self._model is not None, "load() first"
        start = time.perf_counter()
        first = next(iter(self.eos), 0)
        with torch.inference_mode():
            logits = self._forward(torch.tensor([[first]], device=self.device), None)[0]
            if self.device.startswith("cuda"):
                torch.cuda.synchronize(self.device)
        if not bool(torch.isfinite(logits).all()):
            raise ValueError("the model's first forward pass gave non-finite logits")
        self.warmup_s = time.perf_counter() - start
        params = list(self._model.parameters())
        self.params = sum(p.numel() for p in params)
        if self.device.startswith("cuda"):
            self.memory_bytes = int(torch.cuda.memory_reserved(self.device))
        else:
            self.memory_bytes = sum(p.numel() * p.element_size() for p in params)
        self.state = "ready"

    def _forward(self, input_ids: Any, cache: Any, last_only: bool = True) -> Tuple[Any, Any]:
        """(logits, the KV cache after these tokens). Call in inference mode."""
        kwargs: Dict[str, Any] = {"input_ids": input_ids, "use_cache": True}
        if cache is not None:
            kwargs[self._cache_arg] = cache
        if last_only and self._keep_arg:
            kwargs["logits_to_keep"] = 1  # the other positions' logits are never read
        out = self._model(**kwargs)
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        return out.logits, cache

    @property
    def max_len(self) -> int:
        return int(self.config.get("max_position_embeddings") or self._tok.model_max_length)

    def encode(self, text: str) -> List[int]:
        return [int(t) for t in self._tok.encode(text)]

    def chat_tokens(self, messages: List[Dict[str, str]]) -> List[int]:
        if not getattr(self._tok, "chat_template", None):
            raise ApiError(
                400, f"{self.name} has no chat template in its folder; use /v1/completions", "messages"
            )
        try:
            ids = self._tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        except Exception as exc:  # jinja's TemplateError, or the template's own raise_exception()
            raise ApiError(
                400, f"the model's chat template refused the messages: {exc}", "messages"
            ) from None
        # transformers 5 answers a BatchEncoding, 4.x a list of ids.
        if not isinstance(ids, list):
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def decode(self, tokens: List[int]) -> str:
        # No clean-up of spaces: an answer's text must grow by appending, for a stream to send it.
        return str(self._tok.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False))

    def token_strings(self, tokens: List[int]) -> List[str]:
        return [str(self._tok.decode([t], clean_up_tokenization_spaces=False)) for t in tokens]

    def tokens(
        self, ids: List[int], n: int, temperature: float, top_p: float, generator: Any, logprobs: bool
    ) -> Generator[Tuple[int, Optional[float]], None, None]:
        import torch

        # Positions past the context are where the model was never trained: the answer ends there.
        n = min(n, self.max_len - len(ids))
        if n <= 0:
            return
        with torch.inference_mode():
            logits, cache = self._forward(torch.tensor([ids], device=self.device), None)
        for i in range(n):
            with torch.inference_mode():
                last = logits[0, -1].float()
                if temperature == 0:
                    nxt = int(torch.argmax(last))
                else:
                    nxt = sample_token(torch, last, temperature, top_p, generator)
                lp = float(torch.log_softmax(last, dim=-1)[nxt]) if logprobs else None
            yield nxt, lp
            if i + 1 < n:
                with torch.inference_mode():
                    logits, cache = self._forward(torch.tensor([[nxt]], device=self.device), cache)

    def prompt_logprobs(self, ids: List[int]) -> List[float]:
        import torch

        with torch.inference_mode():
            seq = torch.tensor([ids], device=self.device)
            logits = self._model(input_ids=seq, use_cache=False).logits[0, :-1].float()
            logp = torch.log_softmax(logits, dim=-1)
            return [float(x) for x in logp.gather(1, seq[0, 1:].unsqueeze(1)).squeeze(1)]


def _parameters(fn: Any) -> List[str]:
    import inspect

    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []
