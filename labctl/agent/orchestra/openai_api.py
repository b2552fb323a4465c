"""The OpenAI-compatible face of labctl's model server: GET /v1/models, POST /v1/completions and
POST /v1/chat/completions, each answered whole or streamed as server-sent events.

vLLM, llama.cpp's server and the hosted APIs speak this protocol, so the trainer's client (and
any OpenAI SDK) asks labctl's small servers and a remote tier the same way. This module holds
the protocol only (requests checked into a `CompletionRequest` or `ChatRequest`, answers, stream
chunks and errors shaped as the API shapes them, what a stop sequence lets out); the server's
model does the forward passes. Standard library only.

What labctl's server does not do is refused with a 400 naming the field, never silently
ignored: token-id prompts, best_of, logit_bias, penalties other than 0, a suffix, logprobs on a
stream or a chat, tools. Scoring is the API's own idiom: `echo: true, logprobs: 0, max_tokens: 0`
gives the prompt's per-token log-probabilities (the first token has none).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

MAX_N = 8  # choices per prompt
MAX_PROMPTS = 32  # prompts per request
MAX_STOPS = 4  # the API's own limit on stop sequences
MAX_MESSAGES = 256
ROLES = ("system", "developer", "user", "assistant", "tool")
DONE = b"data: [DONE]\n\n"


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
    stream: bool = False
    include_usage: bool = False


@dataclass
class ChatRequest:
    """A /v1/chat/completions body, checked: messages as [{role, content: text}]."""

    messages: List[Dict[str, str]]
    max_tokens: int
    temperature: float
    top_p: float
    n: int
    seed: Optional[int]
    stop: List[str]
    stream: bool = False
    include_usage: bool = False
    # What a CompletionRequest has and a chat does not take (the same engine answers both).
    echo: bool = field(default=False, init=False)
    logprobs: Optional[int] = field(default=None, init=False)


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
    "best_of": (1,),
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "logit_bias": ({},),
    "suffix": ("",),
}
_KNOWN = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "n", "seed", "stop", "echo",
    "logprobs", "user", "stream", "stream_options", *_NEUTRAL,
}  # fmt: skip
_CHAT_NEUTRAL: Dict[str, tuple] = {
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "logit_bias": ({},),
    "logprobs": (False,),
    "tools": ([],),
    "response_format": ({"type": "text"},),
}
_CHAT_KNOWN = {
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "seed",
    "stop", "user", "stream", "stream_options", *_CHAT_NEUTRAL,
}  # fmt: skip


def _neutral(value: Any, neutral: tuple) -> bool:
    # type() as well as ==: true == 1 and 0 == false in Python, not in the API.
    return value is None or any(type(value) is type(n) and value == n for n in neutral)


def _common(body: Any, served: str, known: set, neutral: Dict[str, tuple]) -> Dict[str, Any]:
    """What both endpoints check alike: a JSON object, no unknown field, this server's model,
    neutral values only for what it lacks."""
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object", "body")
    unknown = sorted(set(body) - known)
    if unknown:
        raise _bad(
            f"unknown field {unknown[0]!r}; labctl's server takes {', '.join(sorted(known))}", unknown[0]
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
    for key, values in neutral.items():
        value = body.get(key)
        if not _neutral(value, values):
            raise _bad(f"{key}={value!r} is not supported by labctl's model server; leave {key} out", key)
    return body


def _stops(body: Dict[str, Any]) -> List[str]:
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOPS
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise _bad(f"stop must be a non-empty text or a list of at most {MAX_STOPS} of them", "stop")
    return stops


def _streaming(body: Dict[str, Any]) -> Tuple[bool, bool]:
    """(stream, include_usage), as the API takes them: stream_options only with stream."""
    stream = body.get("stream")
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad(f"stream must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise _bad("stream_options is only allowed with stream: true", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise _bad(f"stream_options takes {{include_usage: bool}}, got {options!r}", "stream_options")
    usage = options.get("include_usage", False)
    if not isinstance(usage, bool):
        raise _bad(f"stream_options.include_usage must be true or false, got {usage!r}", "stream_options")
    return stream, usage


def _sampling(body: Dict[str, Any], max_tokens: int) -> Dict[str, Any]:
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise _bad("top_p must be above 0 (1 keeps every token)", "top_p")
    return {
        "max_tokens": max_tokens,
        "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),
        "top_p": top_p,
        "n": _integer(body, "n", 1, 1, MAX_N) or 1,
        "seed": _integer(body, "seed", None, 0, 2**63 - 1),
        "stop": _stops(body),
    }


def parse_completion(body: Any, served: str, max_tokens_cap: int) -> CompletionRequest:
    """`body` as this server can answer it, or ApiError: 404 for another model's name, 400 else."""
    _common(body, served, _KNOWN, _NEUTRAL)
    prompt = body.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if (
        not isinstance(prompts, list)
        or not prompts
        or len(prompts) > MAX_PROMPTS
        or not all(isinstance(p, str) for p in prompts)
    ):
        raise _bad(
            f"prompt must be text or a list of 1 to {MAX_PROMPTS} texts (token ids are not taken: "
            "send the text, the server tokenizes it)",
            "prompt",
        )
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise _bad(f"echo must be true or false, got {echo!r}", "echo")
    stream, usage = _streaming(body)
    logprobs = _integer(body, "logprobs", None, 0, 0)
    if stream and logprobs is not None:
        raise _bad("logprobs is not supported on a stream by labctl's model server; leave it out", "logprobs")
    sampling = _sampling(body, _integer(body, "max_tokens", 16, 0, max_tokens_cap) or 0)
    request = CompletionRequest(
        prompts=prompts, echo=echo, logprobs=logprobs, stream=stream, include_usage=usage, **sampling
    )
    if any(not p for p in prompts):
        raise _bad("prompt is empty: give at least one character to continue", "prompt")
    return request


def _content(message: Dict[str, Any], i: int) -> str:
    """A message's text: a string, or the API's list of parts where every part is text."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if content is None and message.get("role") == "assistant":
        return ""
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    raise _bad(
        f"messages[{i}].content must be text or a list of text parts (labctl's server takes text only)",
        "messages",
    )


def parse_chat(body: Any, served: str, max_tokens_cap: int) -> ChatRequest:
    """A /v1/chat/completions body as this server can answer it, or ApiError (as parse_completion)."""
    _common(body, served, _CHAT_KNOWN, _CHAT_NEUTRAL)
    messages = body.get("messages")
    if not isinstance(messages, list) or not 1 <= len(messages) <= MAX_MESSAGES:
        raise _bad(f"messages must be a list of 1 to {MAX_MESSAGES} messages", "messages")
    checked: List[Dict[str, str]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise _bad(f"messages[{i}] needs a role, one of {', '.join(ROLES)}", "messages")
        extra = sorted(set(message) - {"role", "content", "name"})
        if extra:
            raise _bad(f"messages[{i}].{extra[0]} is not supported by labctl's model server", "messages")
        checked.append({"role": message["role"], "content": _content(message, i)})
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise _bad("give max_completion_tokens or max_tokens, not both", "max_completion_tokens")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    stream, usage = _streaming(body)
    sampling = _sampling(body, _integer(body, key, 16, 0, max_tokens_cap) or 0)
    return ChatRequest(messages=checked, stream=stream, include_usage=usage, **sampling)


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


def usage_doc(prompt_tokens: int, completion_tokens: int) -> Dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def answer_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{int(time.time() * 1e6):x}"


def completion_doc(name: str, choices: List[Dict[str, Any]], prompt_tokens: int) -> Dict[str, Any]:
    """The API's text_completion object around `choices` (each {text, finish_reason, logprobs?,
    tokens: completion tokens})."""
    completion_tokens = sum(int(c.pop("tokens")) for c in choices)
    for i, c in enumerate(choices):
        c["index"] = i
        c.setdefault("logprobs", None)
    return {
        "id": answer_id(False),
        "object": "text_completion",
        "created": int(time.time()),
        "model": name,
        "choices": choices,
        "usage": usage_doc(prompt_tokens, completion_tokens),
    }


def chat_doc(name: str, choices: List[Dict[str, Any]], prompt_tokens: int) -> Dict[str, Any]:
    """The API's chat.completion object; `choices` as completion_doc takes them."""
    return {
        "id": answer_id(True),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": name,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": c["text"]},
                "logprobs": None,
                "finish_reason": c["finish_reason"],
            }
            for i, c in enumerate(choices)
        ],
        "usage": usage_doc(prompt_tokens, sum(int(c["tokens"]) for c in choices)),
    }


class Chunks:
    """One streamed answer's chunks, as the API shapes them: text_completion objects for
    /v1/completions, chat.completion.chunk objects (a `delta`) for a chat. With include_usage
    every chunk carries "usage": null and one last chunk, with no choices, the counts."""

    def __init__(self, name: str, chat: bool, include_usage: bool) -> None:
        self.name = name
        self.chat = chat
        self.include_usage = include_usage
        self.id = answer_id(chat)
        self.created = int(time.time())

    def _doc(self, choices: List[Dict[str, Any]]) -> Dict[str, Any]:
        doc: Dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.name,
            "choices": choices,
        }
        if self.include_usage:
            doc["usage"] = None
        return doc

    def start(self, index: int) -> Optional[Dict[str, Any]]:
        """A chat choice opens with the assistant's role; a completion has no such chunk."""
        if not self.chat:
            return None
        delta = {"role": "assistant", "content": ""}
        return self._doc([{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}])

    def text(self, index: int, text: str, finish: Optional[str] = None) -> Dict[str, Any]:
        if self.chat:
            delta = {"content": text} if text else {}
            return self._doc([{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}])
        return self._doc([{"index": index, "text": text, "logprobs": None, "finish_reason": finish}])

    def usage(self, prompt_tokens: int, completion_tokens: int) -> Optional[Dict[str, Any]]:
        if not self.include_usage:
            return None
        doc = self._doc([])
        doc["usage"] = usage_doc(prompt_tokens, completion_tokens)
        return doc


def sse(doc: Dict[str, Any]) -> bytes:
    """One server-sent event: the API's `data: {json}` and a blank line."""
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def cut_at_stop(text: str, stops: List[str]) -> Optional[str]:
    """`text` up to its first stop sequence (the stop left out), or None when none occurs."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return text[: min(found)] if found else None


def releasable(text: str, stops: List[str]) -> str:
    """What of a growing answer's `text` can be sent now: not an unfinished UTF-8 character
    (U+FFFD at the end: its other bytes may come with the next token), and not an ending that
    the next tokens may turn into a stop sequence (the stop and what follows are never sent)."""
    end = len(text)
    while end and text[end - 1] == "\ufffd":
        end -= 1
    text = text[:end]
    hold = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:k]):
                hold = k
                break
    return text[: len(text) - hold]
