"""labctl's tinylm format behind the model server (server.py): config.json with `vocab` and
`max_seq`, safetensors weights, tokens that are the text's UTF-8 bytes modulo the vocabulary.

These models are random, so what matters is that the answers are real forward passes and
deterministic. There is no KV cache: each token runs the whole window again (at most max_seq
tokens; a longer text slides it). There is no chat template either, so /v1/chat/completions is
refused with a 400 that says to use /v1/completions (joining the messages would invent a format
the model never saw). Standard library at import; torch inside the methods.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Generator, List, Optional, Tuple

from .backend import ServedModel, pick_device, sample_token

WARMUP_TOKENS = 128


class Model(ServedModel):
    """A tinylm checkpoint, from files to ready, and its primitives."""

    format = "tinylm"
    token_unit = "tokens (bytes)"
    limit_name = "max_seq"

    def __init__(self, name: str, model_dir: str, device: str = "auto") -> None:
        super().__init__(name, model_dir, device)
        self._tensors: Optional[Any] = None
        self._model: Any = None

    def check(self) -> None:
        from ..modelload.loader import model_files, read_header
        from ..models.tinylm import check_config

        with open(os.path.join(self.model_dir, "config.json")) as f:
            config = json.load(f)
        if not isinstance(config, dict):
            raise ValueError("config.json is not a JSON object")
        check_config(config)
        for path in model_files(self.model_dir):
            read_header(path)
        self.config = config

    def load(self) -> None:
        if not self.config:
            self.check()
        try:
            import torch
        except ImportError:
            raise RuntimeError(f"torch is not installed for {sys.executable}") from None
        from ..modelload.loader import load_model_dir

        self.device = pick_device(torch, self.device_arg)
        start = time.perf_counter()
        self._tensors = load_model_dir(self.model_dir, device=self.device)
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)
        self.load_s = time.perf_counter() - start
        self.state = "warming"

    def warm(self) -> None:
        import torch

        from ..modelload.stages import warm_up

        assert self._tensors is not None, "load() first"
        start = time.perf_counter()
        seq = min(WARMUP_TOKENS, int(self.config["max_seq"]))
        self._model, _ = warm_up(torch, self.config, self._tensors, self.device, seq)
        self.warmup_s = time.perf_counter() - start
        self._tensors = None
        params = list(self._model.parameters())
        self.params = sum(p.numel() for p in params)
        self.dtype = str(params[0].dtype).replace("torch.", "") if params else ""
        if self.device.startswith("cuda"):
            # What the GPU holds for this process (weights, activations, the allocator's cache).
            self.memory_bytes = int(torch.cuda.memory_reserved(self.device))
        else:
            self.memory_bytes = sum(p.numel() * p.element_size() for p in params)
        self.state = "ready"

    @property
    def max_len(self) -> int:
        return int(self.config["max_seq"])

    def encode(self, text: str) -> List[int]:
        vocab = int(self.config["vocab"])
        return [b % vocab for b in text.encode("utf-8")]

    def decode(self, tokens: List[int]) -> str:
        return bytes(t % 256 for t in tokens).decode("utf-8", "replace")

    def token_strings(self, tokens: List[int]) -> List[str]:
        return [chr(t % 256) for t in tokens]

    def tokens(
        self, ids: List[int], n: int, temperature: float, top_p: float, generator: Any, logprobs: bool
    ) -> Generator[Tuple[int, Optional[float]], None, None]:
        import torch

        max_seq = self.max_len
        seq = torch.tensor([ids], dtype=torch.long, device=self.device)
        for _ in range(n):
            with torch.no_grad():
                logits = self._model(seq[:, -max_seq:])[0, -1].float()
            if temperature == 0:
                # The first of equal maxima: deterministic.
                nxt = int(torch.argmax(logits))
            else:
                nxt = sample_token(torch, logits, temperature, top_p, generator)
            yield nxt, float(torch.log_softmax(logits, dim=-1)[nxt]) if logprobs else None
            seq = torch.cat([seq, torch.tensor([[nxt]], dtype=torch.long, device=self.device)], dim=1)

    def prompt_logprobs(self, ids: List[int]) -> List[float]:
        import torch
        from torch.nn import functional as F

        with torch.no_grad():
            seq = torch.tensor([ids], dtype=torch.long, device=self.device)
            logp = F.log_softmax(self._model(seq)[0, :-1].float(), dim=-1)
            return [float(x) for x in logp.gather(1, seq[0, 1:].unsqueeze(1)).squeeze(1)]
