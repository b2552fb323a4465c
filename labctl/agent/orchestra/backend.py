"""What labctl's model server asks of a model format (`ServedModel`), and the parts every format
shares: the requests answered from a few primitives (encode, decode, a chat prompt's tokens, a
token stream, the prompt's log-probabilities), sampling, and the device choice. hf_model.py and
tinylm_model.py subclass it; server.py holds the HTTP side and the lifecycle. Standard library
at import time: torch is imported by the formats, inside the process that serves.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import threading
import time
from contextlib import closing, contextmanager
from typing import Any, Callable, Dict, FrozenSet, Generator, Iterator, List, Optional, Tuple, Union

from . import openai_api
from .openai_api import ApiError, ChatRequest, CompletionRequest

MAX_TOKENS = 256
DEFAULT_MAX_TOKENS = 16

Request = Union[CompletionRequest, ChatRequest]
Gone = Optional[Callable[[], bool]]


class BadRequest(ValueError):
    """What the client sent cannot be answered: 400 with the message."""


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


def _event(event: str, **fields: Any) -> None:
    fields["event"] = event
    sys.stderr.write(json.dumps(fields, sort_keys=True) + "\n")
    sys.stderr.flush()


class Choice:
    """One generated answer: its tokens (an end-of-sequence token included: it was generated),
    their log-probabilities when asked for, why it ended, and its text."""

    def __init__(self) -> None:
        self.tokens: List[int] = []
        self.logprobs: List[Optional[float]] = []
        self.finish = "length"
        self.text: Optional[str] = None
        # The prompt's own log-probabilities, for an echo with logprobs.
        self.echoed: List[float] = []


class ServedModel:
    """The model this server holds, from files to ready, and what it answers.

    A format subclasses it with check/load/warm and the primitives below; the requests are
    answered here, alike for every format."""

    format = ""
    # How a too-long prompt's refusal names the unit and the limit (config.json's own key).
    token_unit = "tokens"
    limit_name = "context"
    eos: FrozenSet[int] = frozenset()

    def __init__(self, name: str, model_dir: str, device: str = "auto") -> None:
        self.name = name
        self.model_dir = model_dir
        self.device_arg = device
        self.state = "loading"
        self.config: Dict[str, Any] = {}
        self.device = ""
        self.dtype = ""
        self.load_s = 0.0
        self.warmup_s = 0.0
        self.params = 0
        self.memory_bytes = 0
        self.created = int(time.time())
        # One forward pass at a time: concurrent requests would each hold activations.
        self.lock = threading.Lock()
        # Requests past the state check and not yet answered: a drain finishes these (/health says
        # how many, so a caller can see that a stop has work left, and a test can stop mid-request).
        self.in_flight = 0
        self._counting = threading.Lock()

    # ---- what a format provides ------------------------------------------------------------

    def check(self) -> None:
        """What can be checked without torch (config, file headers): a bad folder fails in ms."""
        raise NotImplementedError

    def load(self) -> None:
        """The weights onto the device; then the state is "warming"."""
        raise NotImplementedError

    def warm(self) -> None:
        """The model built around the loaded weights and its first forward pass run: "ready"."""
        raise NotImplementedError

    @property
    def max_len(self) -> int:
        """The longest prompt, in tokens (/v1/models' max_model_len)."""
        raise NotImplementedError

    def encode(self, text: str) -> List[int]:
        raise NotImplementedError

    def chat_tokens(self, messages: List[Dict[str, str]]) -> List[int]:
        """The chat's prompt as the model's chat template writes it, ready for the answer."""
        raise ApiError(
            400,
            f"{self.name} is a {self.format} model: it has no chat template; use /v1/completions",
            "messages",
        )

    def decode(self, tokens: List[int]) -> str:
        raise NotImplementedError

    def token_strings(self, tokens: List[int]) -> List[str]:
        """Each token's own text (the API's logprobs.tokens)."""
        raise NotImplementedError

    def tokens(
        self, ids: List[int], n: int, temperature: float, top_p: float, generator: Any, logprobs: bool
    ) -> Generator[Tuple[int, Optional[float]], None, None]:
        """Up to `n` tokens after `ids`, each computed when asked for (the caller stops early on a
        stop sequence or a client gone), with its log-probability when `logprobs`. Temperature 0
        is greedy; above it, sample_token() with `generator`. Hold self.lock."""
        raise NotImplementedError

    def prompt_logprobs(self, ids: List[int]) -> List[float]:
        """Each token's log-probability given those before it (the first has none: len - 1)."""
        raise NotImplementedError

    # ---- lifecycle ---------------------------------------------------------------------------

    def health(self) -> Tuple[int, Dict[str, Any]]:
        if self.state != "ready":
            return 503, {"state": self.state, "name": self.name}
        return 200, {
            "state": "ready",
            "name": self.name,
            "format": self.format,
            "device": self.device,
            "dtype": self.dtype,
            "params": self.params,
            "load_s": round(self.load_s, 4),
            "warmup_s": round(self.warmup_s, 4),
            "memory_bytes": self.memory_bytes,
            "in_flight": self.in_flight,
        }

    @contextmanager
    def serving(self) -> Iterator[None]:
        """One request counted in `in_flight` while it is worked on."""
        with self._counting:
            self.in_flight += 1
        try:
            yield
        finally:
            with self._counting:
                self.in_flight -= 1

    # ---- requests ----------------------------------------------------------------------------

    def _encode(self, text: Any, field: str) -> List[int]:
        if not isinstance(text, str):
            raise BadRequest(f"{field} must be a string")
        return self._fits(self.encode(text), field)

    def _fits(self, ids: List[int], field: str) -> List[int]:
        if len(ids) > self.max_len:
            raise BadRequest(
                f"{field} is {len(ids)} {self.token_unit}; this model takes at most "
                f"{self.limit_name}={self.max_len}"
            )
        return ids

    def new_generator(self, seed: Optional[int]) -> Any:
        """The random source of one request's samples: seeded, or from the OS."""
        import torch

        generator = torch.Generator()
        if seed is not None:
            generator.manual_seed(seed)
        else:
            generator.seed()
        return generator

    def generate(self, body: Dict[str, Any]) -> Dict[str, Any]:
        """POST /generate: the prompt continued greedily; `tokens` has every token generated."""
        ids = self._encode(body.get("prompt"), "prompt")
        if not ids:
            raise BadRequest("prompt is empty: give at least one character to continue")
        n = body.get("max_tokens", DEFAULT_MAX_TOKENS)
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_TOKENS:
            raise BadRequest(f"max_tokens must be an integer from 0 to {MAX_TOKENS}, got {n!r}")
        start = time.perf_counter()
        greedy = CompletionRequest([], n, 0.0, 1.0, 1, None, [], False, None)
        out = Choice()
        with self.lock:
            for _ in self._choice(ids, greedy, None, out, None, False):
                pass
        return {
            "name": self.name,
            "tokens": out.tokens,
            "text": out.text,
            "seconds": round(time.perf_counter() - start, 4),
        }

    def score(self, body: Dict[str, Any]) -> Dict[str, Any]:
        """POST /score: the text's mean log-probability, each token given those before it."""
        ids = self._encode(body.get("text"), "text")
        if len(ids) < 2:
            raise BadRequest(
                f"text must be at least 2 {self.token_unit}: each one is scored given those before it"
            )
        start = time.perf_counter()
        with self.lock:
            picked = self.prompt_logprobs(ids)
        return {
            "name": self.name,
            "mean_logprob": sum(picked) / len(picked),
            "tokens": len(ids) - 1,
            "seconds": round(time.perf_counter() - start, 4),
        }

    def _prompts(self, req: Request) -> List[Tuple[List[int], str]]:
        """(tokens, the text an echo repeats) per prompt; ApiError 400 for one the model cannot take."""
        if isinstance(req, ChatRequest):
            try:
                return [(self._fits(self.chat_tokens(req.messages), "messages"), "")]
            except BadRequest as exc:
                raise ApiError(400, str(exc), "messages") from None
        try:
            return [(self._encode(p, "prompt"), p if req.echo else "") for p in req.prompts]
        except BadRequest as exc:
            raise ApiError(400, str(exc), "prompt") from None

    def complete(self, req: Request, gone: Gone = None) -> Dict[str, Any]:
        """/v1/completions (or, for a ChatRequest, /v1/chat/completions) answered whole: n
        choices per prompt, in the API's order (prompt by prompt). `gone` says the client hung
        up (it timed out): the work stops there, ClientGone, instead of holding the model for an
        answer nobody reads while live requests queue behind it."""
        prompts = self._prompts(req)
        choices: List[Dict[str, Any]] = []
        with closing(self._answers(req, prompts, gone, False)) as answers:
            for index, _, done in answers:
                if done is None:
                    continue
                ids, echo = prompts[index // req.n]
                choice: Dict[str, Any] = {
                    "text": echo + (done.text or ""),
                    "finish_reason": done.finish,
                    "tokens": len(done.tokens),
                }
                if req.logprobs is not None:
                    choice["logprobs"] = self._logprobs_doc(ids if echo else [], done)
                choices.append(choice)
        prompt_tokens = sum(len(ids) for ids, _ in prompts)
        if isinstance(req, ChatRequest):
            return openai_api.chat_doc(self.name, choices, prompt_tokens)
        return openai_api.completion_doc(self.name, choices, prompt_tokens)

    def stream(self, req: Request, gone: Gone = None) -> Generator[Dict[str, Any], None, None]:
        """The same answer as complete(), as the API's stream chunks. The prompts are checked
        here, before the first chunk: a refusal is still a plain error answer."""
        return self._stream(req, self._prompts(req), gone)

    def _stream(
        self, req: Request, prompts: List[Tuple[List[int], str]], gone: Gone
    ) -> Generator[Dict[str, Any], None, None]:
        chunks = openai_api.Chunks(self.name, isinstance(req, ChatRequest), req.include_usage)
        opened = -1
        completion_tokens = 0
        with closing(self._answers(req, prompts, gone, True)) as answers:
            for index, text, done in answers:
                if index != opened:
                    opened = index
                    first = chunks.start(index)
                    if first is not None:
                        yield first
                    echo = prompts[index // req.n][1]
                    if echo:
                        yield chunks.text(index, echo)
                if done is not None:
                    completion_tokens += len(done.tokens)
                    yield chunks.text(index, "", done.finish)
                elif text:
                    yield chunks.text(index, text)
        usage = chunks.usage(sum(len(ids) for ids, _ in prompts), completion_tokens)
        if usage is not None:
            yield usage

    def _answers(
        self, req: Request, prompts: List[Tuple[List[int], str]], gone: Gone, live: bool
    ) -> Generator[Tuple[int, str, Optional[Choice]], None, None]:
        """(choice index, text to send now, None) while a choice grows when `live`, then (index,
        "", the finished Choice). Holds the model from the first token to the last."""
        generator = self.new_generator(req.seed) if req.temperature > 0 else None
        want = req.logprobs is not None
        index = 0
        with self.lock:
            for ids, _ in prompts:
                echoed = self.prompt_logprobs(ids) if req.echo and want and ids else []
                for _ in range(req.n):
                    out = Choice()
                    out.echoed = echoed
                    grown = self._choice(ids, req, generator, out, gone, live)
                    with closing(grown):
                        for text in grown:
                            yield index, text, None
                    yield index, "", out
                    index += 1

    def _choice(
        self, ids: List[int], req: Request, generator: Any, out: Choice, gone: Gone, live: bool
    ) -> Generator[str, None, None]:
        """Fills `out` token by token; when `live`, yields the text as it becomes safe to send
        (openai_api.releasable). A stop sequence ends it, left out with what follows; an end-of-
        sequence token ends it too. Hold self.lock."""
        sent = ""
        stops = req.stop
        steps = self.tokens(
            ids, req.max_tokens, req.temperature, req.top_p, generator, req.logprobs is not None
        )
        with closing(steps):
            while True:
                if gone is not None and gone():
                    raise ClientGone()
                step = next(steps, None)
                if step is None:
                    break
                out.tokens.append(step[0])
                out.logprobs.append(step[1])
                if step[0] in self.eos:
                    out.finish = "stop"
                    break
                if not stops and not live:
                    continue
                text = self.decode(out.tokens)
                kept = openai_api.cut_at_stop(text, stops) if stops else None
                if kept is not None:
                    out.finish = "stop"
                    self._trim(out, kept)
                    break
                ready = openai_api.releasable(text, stops)
                # A decoder may respell the end when a token arrives; what was sent stays sent.
                if len(ready) > len(sent) and ready.startswith(sent):
                    yield ready[len(sent) :]
                    sent = ready
        if out.text is None:
            out.text = self.decode(out.tokens)
        if live and len(out.text) > len(sent) and out.text.startswith(sent):
            yield out.text[len(sent) :]

    def _trim(self, out: Choice, kept: str) -> None:
        """`out` cut to the tokens that wrote `kept` (the text before the stop sequence)."""
        k = len(out.tokens)
        while k > 0 and len(self.decode(out.tokens[: k - 1])) >= len(kept):
            k -= 1
        del out.tokens[k:]
        del out.logprobs[k:]
        out.text = kept

    def _logprobs_doc(self, echoed_ids: List[int], done: Choice) -> Dict[str, Any]:
        shown = echoed_ids + done.tokens
        values: List[Optional[float]] = (
            [None, *done.echoed, *done.logprobs] if echoed_ids else [*done.logprobs]
        )
        strings = self.token_strings(shown)
        offsets, at = [], 0
        for s in strings:
            offsets.append(at)
            at += len(s)
        return {"tokens": strings, "token_logprobs": values, "top_logprobs": None, "text_offset": offsets}


def peer_closed(sock: socket.socket) -> bool:
    """Whether the other end closed `sock` (readable with nothing to read). A client that sent
    more (a pipelined request) is still there."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def sample_token(torch: Any, logits: Any, temperature: float, top_p: float, generator: Any) -> int:
    """One token from softmax(logits / temperature), kept to the top_p nucleus; drawn on the CPU
    so that a seed gives the same tokens on every device."""
    probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)
    if top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        # Keep each token whose predecessors sum below top_p: the first one always stays.
        keep = torch.cumsum(ordered, dim=0) - ordered < top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], ordered[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


def pick_device(torch: Any, wanted: str) -> str:
    """auto: cuda:0 (the first GPU CUDA_VISIBLE_DEVICES leaves) where torch sees one, else cpu. A
    card this torch build has no kernels for is refused before any weight is loaded."""
    if wanted == "auto":
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    elif wanted.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"--device {wanted} asked for, but torch {torch.__version__} sees no GPU here")
        device = "cuda:0" if wanted == "cuda" else wanted
    else:
        return wanted
    if device.startswith("cuda"):
        cap = tuple(torch.cuda.get_device_capability(device))
        why = arch_gap(list(torch.cuda.get_arch_list()), (int(cap[0]), int(cap[1])))
        if why:
            raise RuntimeError(
                f"torch {torch.__version__} {why} {torch.cuda.get_device_name(device)}: provision a torch "
                "build for it (labctl provision --tags torch_env) or serve the model as GGUF with llama.cpp"
            )
    return device


def arch_gap(arch_list: List[str], cap: Tuple[int, int]) -> Optional[str]:
    """Why a torch built for `arch_list` (torch.cuda.get_arch_list()) cannot run on a card of
    compute capability `cap`, or None where it can: a cubin sm_XY runs on X.Z with Z >= Y, PTX
    (compute_XY) is compiled for anything newer."""
    from ..core.gpus import runs_on

    if runs_on(arch_list, cap):
        return None
    return f"was built for {', '.join(arch_list)}, which has no kernels for sm_{cap[0]}{cap[1]}, the"
