"""The OpenAI-compatible face of labctl's model server: GET /v1/models, POST /v1/completions.

vLLM, llama.cpp's server and the hosted APIs speak this protocol, so the trainer's client (and
any OpenAI SDK) asks labctl's small servers and a remote tier the same way. This module holds
the protocol only (requests checked into a `CompletionRequest`, answers and errors shaped as the
API shapes them); the server's `Model` does the forward passes. Standard library only.

What labctl's server does not do is refused with a 400 naming the field, never silently
ignored: streaming, token-id prompts, best_of, logit_bias, penalties other than 0, a suffix.
Scoring is the API's own idiom: `echo: true, logprobs: 0, max_tokens: 0` gives the prompt's
per-token log-probabilities (the first token has none).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

MAX_N = 8  # choices per prompt
MAX_PROMPTS = 32  # prompts per request
MAX_STOPS = 4  # the API's own limit on stop sequences


class ApiError(Exception):
    """A request the server refuses, as the API reports it: {"error": {message, type, param, code}}."""

    def __init__(
        self,
        status: int,
        message: str,
        param: Optional[str] = None,
        code: Optional[str] = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind

    def doc(self) -> Dict[str, Any]:
        return error_doc(self.message, self.kind, self.param, self.code)


def error_doc(
    message: str, kind: str, param: Optional[str] = None, code: Optional[str] = None
) -> Dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass
class CompletionRequest:
    """A /v1/completions body, checked: every prompt a non-empty string, numbers in range."""

    prompts: List[str]
    max_tokens: int
    temperature: float
    top_p: float
    n: int
    seed: Optional[int]
    stop: List[str]
    echo: bool
    logprobs: Optional[int]


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param)


def _number(body: Dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise _bad(f"{key} must be a number from {low:g} to {high:g}, got {value!r}", key)
    return float(value)


def _integer(body: Dict[str, Any], key: str, default: Optional[int], low: int, high: int) -> Optional[int]:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(f"{key} must be an integer from {low} to {high}, got {value!r}", key)
    return value


# Fields a client may send with their neutral value; any other value asks for what this server lacks.
_NEUTRAL: Dict[str, tuple] = {
    "stream": (False,),
    "best_of": (1,),
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "logit_bias": ({},),
    "suffix": ("",),
}
_KNOWN = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "n", "seed", "stop", "echo",
    "logprobs", "user", "stream_options", *_NEUTRAL,
}  # fmt: skip


def _neutral(value: Any, neutral: tuple) -> bool:
    # type() as well as ==: true == 1 and 0 == false in Python, not in the API.
    return value is None or any(type(value) is type(n) and value == n for n in neutral)


def parse_completion(body: Any, served: str, max_tokens_cap: int) -> CompletionRequest:
    """`body` as this server can answer it, or ApiError: 404 for another model's name, 400 else."""
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object", "body")
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise _bad(
            f"unknown field {unknown[0]!r}; labctl's server takes {', '.join(sorted(_KNOWN))}", unknown[0]
        )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad(f"model is required: this server holds {served!r}", "model")
    if model != served:
        raise ApiError(
            404,
            f"The model {model!r} does not exist here; this server holds {served!r}",
            "model",
            "model_not_found",
        )
    for key, neutral in _NEUTRAL.items():
        value = body.get(key)
        if not _neutral(value, neutral):
            raise _bad(f"{key}={value!r} is not supported by labctl's model server; leave {key} out", key)
    prompt = body.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if (
        not isinstance(prompts, list)
        or not prompts
        or len(prompts) > MAX_PROMPTS
        or not all(isinstance(p, str) for p in prompts)
    ):
        raise _bad(
            f"prompt must be text or a list of 1 to {MAX_PROMPTS} texts (token ids are not taken: this "
            "server's tokens are the text's bytes)",
            "prompt",
        )
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOPS
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise _bad(f"stop must be a non-empty text or a list of at most {MAX_STOPS} of them", "stop")
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise _bad(f"echo must be true or false, got {echo!r}", "echo")
    request = CompletionRequest(
        prompts=prompts,
        max_tokens=_integer(body, "max_tokens", 16, 0, max_tokens_cap) or 0,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        n=_integer(body, "n", 1, 1, MAX_N) or 1,
        seed=_integer(body, "seed", None, 0, 2**63 - 1),
        stop=stops,
        echo=echo,
        logprobs=_integer(body, "logprobs", None, 0, 0),
    )
    if request.top_p == 0:
        raise _bad("top_p must be above 0 (1 keeps every token)", "top_p")
    if any(not p for p in prompts):
        raise _bad("prompt is empty: give at least one character to continue", "prompt")
    return request


def models_doc(name: str, created: int, max_model_len: int) -> Dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "labctl",
                "max_model_len": max_model_len,
            }
        ],
    }


def completion_doc(name: str, choices: List[Dict[str, Any]], prompt_tokens: int) -> Dict[str, Any]:
    """The API's text_completion object around `choices` (each {text, finish_reason, logprobs?,
    tokens: completion tokens})."""
    now = time.time()
    completion_tokens = sum(int(c.pop("tokens")) for c in choices)
    for i, c in enumerate(choices):
        c["index"] = i
        c.setdefault("logprobs", None)
    return {
        "id": f"cmpl-{int(now * 1e6):x}",
        "object": "text_completion",
        "created": int(now),
        "model": name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def cut_at_stop(text: str, stops: List[str]) -> Optional[str]:
    """`text` up to its first stop sequence (the stop left out), or None when none occurs."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return text[: min(found)] if found else None
