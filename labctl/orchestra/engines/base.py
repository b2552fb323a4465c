"""What an engine declares: the contract every model server of the orchestra is held to.

Pure data and pure functions: `labctl orchestra plan` checks a model's format and its GPU's
compute capability against its engine before any host is touched, and the rotation passes
`start_args` to the host's `orchestra.start` (labctl/agent/orchestra/host.py), which checks the
binary and the build's CUDA archs there and fills the template's {port} and {file}.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

Cap = tuple[int, int]

FORMAT_NAMES = {
    "hf": "a Hugging Face folder",
    "gguf": "a GGUF file",
    "tinylm": "a tinylm checkpoint",
    "unknown": "files of no format labctl knows",
}


@dataclass(frozen=True)
class Engine:
    name: str
    title: str  # what a person calls it: "llama.cpp's llama-server"
    formats: tuple[str, ...]  # model formats it serves; "*" any
    min_cap: Cap | None  # lowest compute capability it runs on; None: any GPU torch/CUDA runs on
    # The server's command, filled on the controller with what it knows (name, context, GPU
    # layers) and on the host with {port}, {path} (the model's folder) and {file} (its weights
    # file); None: labctl's own server, started with the host's torch python.
    command: str | None
    binary: str | None = None  # looked for on the host before a start
    # How the host learns which CUDA archs the engine's build covers: "torch" (the server
    # checks torch's arch list as it loads), "build.json" (the manifest beside a llama.cpp
    # build), None (not known: the engine's own error says it).
    cuda_check: str | None = None
    health: str = "/health"
    # Health answers that mean "still loading": the text of a 503's error message (llama-server
    # says "Loading model") mapped to the state shown.
    loading_words: tuple[str, ...] = ("loading",)
    # Readiness is proven by a one-token completion through the OpenAI API, after health.
    ready_by_completion: bool = True
    max_tokens: int | None = None  # the most tokens one request may ask (None: the model's context)
    # Below this compute capability the engine computes 16-bit weights in fp32 (fp16 is slow
    # there: a P40 runs it at 1/64 rate), so they take twice their bytes on the GPU.
    fp32_below: Cap | None = None
    notes: tuple[str, ...] = field(default=())

    def weight_scale(self, cap: Cap | None, dtype: str | None) -> float:
        """GPU bytes per file byte of weights of `dtype` on a GPU of `cap`."""
        half = (dtype or "").upper() in ("BF16", "F16", "FLOAT16", "BFLOAT16")
        if half and self.fp32_below is not None and cap is not None and cap < self.fp32_below:
            return 2.0
        return 1.0

    def serves(self, fmt: str) -> bool:
        return "*" in self.formats or fmt in self.formats

    def runs_on(self, cap: Cap | None) -> bool:
        return self.min_cap is None or cap is None or cap >= self.min_cap

    def template(
        self, name: str, context: int, gpu: int | None, user_command: str | None = None
    ) -> str | None:
        """The command for one model, everything but {port}, {path} and {file} filled in."""
        if self.command is None:
            return None
        return self.command.format(
            name=shlex.quote(name),
            context=int(context),
            gpu_layers=0 if gpu is None else 999,
            port="{port}",
            path="{path}",
            file="{file}",
            gpu="{gpu}",
        )

    def start_args(self, name: str, context: int, gpu: int | None) -> dict[str, Any]:
        """What orchestra.start needs of the engine, beside the model and its path."""
        return {
            "engine": self.name,
            "command": self.template(name, context, gpu),
            "binary": self.binary,
            "cuda_check": self.cuda_check,
            "health_path": self.health,
            "loading_words": list(self.loading_words),
            "ready_by_completion": self.ready_by_completion,
        }


def fmt_cap(cap: Cap | None) -> str:
    return "?" if cap is None else f"{cap[0]}.{cap[1]}"
