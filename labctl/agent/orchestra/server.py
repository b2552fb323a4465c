"""labctl's own model server: one model folder behind a small HTTP API.

    python -m labctl.agent.orchestra.server --model-dir DIR --port N --name NAME [--device D]
        [--host ADDR] [--format auto|hf|tinylm]

Two formats, one server: a Hugging Face causal LM (config.json with `model_type`, safetensors,
tokenizer.json, a chat template; hf_model.py, through `transformers`) and labctl's tinylm
(config.json with `vocab` and `max_seq`, byte tokens; tinylm_model.py). `--format auto` tells
them apart by config.json. This module is what does not depend on the format: the HTTP side,
the lifecycle, and the requests (`Engine`), which each format answers with the same primitives
(encode, decode, a chat prompt's tokens, a token stream, the prompt's log-probabilities).

The port is bound at once; GET /health answers 503 {"state": "loading" | "warming"} until the
weights are loaded (labctl's loader, the RAM-cache path) and one forward pass ran, then 200
{"state": "ready", "name", "format", "device", "dtype", "params", "load_s", "warmup_s",
"memory_bytes", "in_flight"}. POST /generate {"prompt", "max_tokens"} continues the prompt
greedily; POST /score {"text"} gives the text's mean log-probability. The same model answers
the OpenAI-compatible GET /v1/models, POST /v1/completions and POST /v1/chat/completions, whole
or streamed (openai_api.py), which the trainer's client and any OpenAI SDK speak. SIGTERM (or
SIGINT) stops it gracefully, exit 0; a model that cannot be loaded or a port that cannot be
bound ends it with exit 1 and one line on stderr. Progress goes to stderr as JSON lines (the
orchestra's log of this server).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from contextlib import closing, contextmanager
from http.server import ThreadingHTTPServer
from typing import Any, Callable, Dict, FrozenSet, Generator, Iterator, List, Optional, Tuple, Union, cast

from .. import procs
from ..httpjson import JsonHandler
from . import openai_api
from .openai_api import ApiError, ChatRequest, CompletionRequest

MAX_TOKENS = 256
MAX_BODY = 1 << 20
DEFAULT_MAX_TOKENS = 16
FORMATS = ("auto", "hf", "tinylm")
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"

Request = Union[CompletionRequest, ChatRequest]
Gone = Optional[Callable[[], bool]]


class BadRequest(ValueError):
    """What the client sent cannot be answered: 400 with the message."""


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


class Terminated(BaseException):
    """SIGTERM or SIGINT arrived: unwind whatever runs and stop."""


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


class Engine:
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


def _not_ready(model: Engine) -> Tuple[int, Dict[str, Any]]:
    message = f"{model.name} is {model.state}: poll /health until it answers 200"
    return 503, openai_api.error_doc(message, "service_unavailable", code=model.state)


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
    """auto: cuda:0 (the first GPU CUDA_VISIBLE_DEVICES leaves) where torch sees one, else cpu."""
    if wanted == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if wanted.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"--device {wanted} asked for, but torch {torch.__version__} sees no GPU here")
        return "cuda:0" if wanted == "cuda" else wanted
    return wanted


def detect_format(model_dir: str) -> str:
    """The folder's format from its config.json: "tinylm" for labctl's own (vocab and max_seq; its
    model_type says tinylm too), "hf" for a Hugging Face one (any other model_type), else ValueError."""
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    if isinstance(config, dict):
        if config.get("model_type") == "tinylm" or ("vocab" in config and "max_seq" in config):
            return "tinylm"
        if isinstance(config.get("model_type"), str):
            return "hf"
    raise ValueError(
        f"{path} is neither a Hugging Face config (model_type) nor a tinylm one (vocab, max_seq)"
    )


def open_model(name: str, model_dir: str, device: str = "auto", fmt: str = "auto") -> Engine:
    """The engine for the folder's format (read from config.json when `fmt` is auto); nothing loaded yet."""
    if fmt == "auto":
        fmt = detect_format(model_dir)
    if fmt == "hf":
        from .hf_model import HFModel

        return HFModel(name, model_dir, device)
    if fmt == "tinylm":
        from .tinylm_model import Model

        return Model(name, model_dir, device)
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")


class Handler(JsonHandler):
    server_version = "labctl-orchestra/1"
    max_body = MAX_BODY

    @property
    def model(self) -> Engine:
        return cast(Server, self.server).model

    def do_GET(self) -> None:
        route = self.path.split("?", 1)[0]
        model = self.model
        if route == "/health":
            self._send(*model.health())
        elif route == "/v1/models":
            if model.state != "ready":
                self._send(*_not_ready(model))
            else:
                self._send(200, openai_api.models_doc(model.name, model.created, model.max_len))
        elif route.startswith("/v1/"):
            self._send(404, ApiError(404, f"no such endpoint: GET {route}; try /v1/models").doc())
        else:
            self._send(404, {"error": f"no such endpoint: GET {self.path}; try /health"})

    def do_POST(self) -> None:
        route = self.path.split("?", 1)[0]
        if route.startswith("/v1/"):
            self._openai(route)
            return
        model = self.model
        answer = {"/generate": model.generate, "/score": model.score}.get(route)
        if answer is None:
            self._send(404, {"error": f"no such endpoint: POST {self.path}; try /generate or /score"})
            return
        if model.state != "ready":
            self._send(503, {"state": model.state, "name": model.name})
            return
        with model.serving():
            self._answer(route, answer)

    def _answer(self, route: str, answer: Callable[[Dict[str, Any]], Dict[str, Any]]) -> None:
        body, unreadable = self._body()
        if unreadable:
            self._send(unreadable[0], {"error": unreadable[1]})
            return
        try:
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            self._send(200, answer(body))
        except (BadRequest, ValueError) as exc:
            self._send(400, {"error": str(exc)})
        except Exception as exc:  # the client gets an answer; the log gets the reason
            _event("error", route=route, error=f"{type(exc).__name__}: {exc}")
            self._send(500, {"error": f"{type(exc).__name__}: {exc}"})

    def _openai(self, route: str) -> None:
        """POST /v1/...: answers and errors in the API's shapes, so an SDK raises its own errors."""
        model = self.model
        parsers: Dict[str, Callable[[Any, str, int], Request]] = {
            COMPLETIONS: openai_api.parse_completion,
            CHAT: openai_api.parse_chat,
        }
        parse = parsers.get(route)
        if parse is None:
            message = f"no such endpoint: POST {route}; try {COMPLETIONS} or {CHAT}"
            self._send(404, ApiError(404, message).doc())
            return
        if model.state != "ready":
            self._send(*_not_ready(model))
            return
        with model.serving():
            self._complete(route, parse)

    def _complete(self, route: str, parse: Callable[[Any, str, int], Request]) -> None:
        model = self.model
        body, unreadable = self._body()
        if unreadable:
            self._send(unreadable[0], ApiError(*unreadable).doc())
            return
        gone = lambda: peer_closed(self.connection)  # noqa: E731
        try:
            request = parse(body, model.name, MAX_TOKENS)
            if not request.stream:
                self._send(200, model.complete(request, gone))
                return
            chunks = model.stream(request, gone)
        except ClientGone:
            _event("abandoned", route=route, note="the client hung up before the answer; work stopped")
            self.close_connection = True
            return
        except ApiError as exc:
            self._send(exc.status, exc.doc())
            return
        except Exception as exc:
            _event("error", route=route, error=f"{type(exc).__name__}: {exc}")
            self._send(500, openai_api.error_doc(f"{type(exc).__name__}: {exc}", "server_error"))
            return
        self._stream(route, chunks)

    def _stream(self, route: str, chunks: Generator[Dict[str, Any], None, None]) -> None:
        """Server-sent events, one per chunk, then `data: [DONE]`. The answer has no length: it
        ends when the connection closes. A client that hangs up stops the generation (a write
        fails, or the next token finds the peer gone); an error after the first event can only
        be told as an event, in the API's error shape."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self.close_connection = True
        try:
            with closing(chunks):
                for doc in chunks:
                    self._write(openai_api.sse(doc))
            self._write(openai_api.DONE)
        except ClientGone:
            _event("abandoned", route=route, note="the client hung up mid-stream; work stopped")
        except Exception as exc:
            _event("error", route=route, error=f"{type(exc).__name__}: {exc}")
            try:
                self._write(
                    openai_api.sse(openai_api.error_doc(f"{type(exc).__name__}: {exc}", "server_error"))
                )
            except ClientGone:
                pass

    def _write(self, data: bytes) -> None:
        try:
            self.wfile.write(data)
        except OSError:  # a reset, a broken pipe, or a client that stopped reading (the timeout)
            raise ClientGone() from None


class Server(ThreadingHTTPServer):
    """Binds when made (port 0: any free one); serves `model` once serve_forever runs."""

    # Graceful stop: server_close() waits for the requests in flight (non-daemon threads).
    daemon_threads = False

    def __init__(self, port: int, model: Engine, address: str = "0.0.0.0") -> None:
        self.model = model
        super().__init__((address, port), Handler)


STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
# Who asked the server to stop, set by the signal watcher before it interrupts the main thread.
_stop_cause: Dict[str, Any] = {}


def _sender(pid: int) -> str:
    if pid <= 0:
        return "outside this host's PID namespace"
    return procs.cmdline(pid) or "a process already gone"


def _watch_stop_signals(main_thread: int) -> None:
    """Takes SIGTERM/SIGINT with the sender's pid (a plain handler cannot see it), records who
    sent it, then interrupts the main thread: a server stopped by surprise says by whom."""
    info = signal.sigwaitinfo(STOP_SIGNALS)
    _stop_cause.update(
        signal=signal.Signals(info.si_signo).name,
        sender_pid=info.si_pid,
        sender=_sender(info.si_pid),
    )
    signal.pthread_kill(main_thread, signal.SIGUSR1)


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated(str(_stop_cause.get("signal") or signal.Signals(signum).name))


def _one_line(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return " ".join(str(text).split())


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labctl.agent.orchestra.server", description=__doc__)
    parser.add_argument(
        "--model-dir",
        required=True,
        help="a model folder: a Hugging Face causal LM, or a tinylm checkpoint (*.safetensors + config.json)",
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", required=True, help="the model's name in the orchestra")
    parser.add_argument(
        "--device", default="auto", help="auto (cuda:0 where torch sees a GPU), cpu, cuda, cuda:N"
    )
    parser.add_argument("--host", default="0.0.0.0", help="the address to listen on (default: every one)")
    parser.add_argument(
        "--format", default="auto", choices=FORMATS, help="the folder's format (auto: read from config.json)"
    )
    args = parser.parse_args(argv)
    # Blocked in every thread (those made later inherit it): only the watcher takes them.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        model = open_model(args.name, args.model_dir, args.device, args.format)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"orchestra server {args.name}: cannot load {args.model_dir}: {_one_line(exc)}\n")
        return 1
    try:
        httpd = Server(args.port, model, args.host)
    except OSError as exc:
        sys.stderr.write(
            f"orchestra server {args.name}: cannot listen on port {args.port}: {_one_line(exc)}\n"
        )
        return 1
    # Started before the handlers go in: shutdown() below waits for serve_forever to have run.
    # A short poll: shutdown() waits up to one poll interval, and a rotation waits for that.
    serve = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="http", daemon=True
    )
    serve.start()
    rc = 0
    try:
        signal.signal(signal.SIGUSR1, _terminate)
        threading.Thread(
            target=_watch_stop_signals, args=(threading.get_ident(),), name="signals", daemon=True
        ).start()
        _event("listening", name=args.name, port=httpd.server_address[1], pid=os.getpid())
        try:
            model.check()
            model.load()
            _event("loaded", name=args.name, device=model.device, load_s=round(model.load_s, 4))
            model.warm()
        except Exception as exc:
            sys.stderr.write(
                f"orchestra server {args.name}: cannot load {args.model_dir}: {_one_line(exc)}\n"
            )
            rc = 1
        else:
            _event("ready", **{k: v for k, v in model.health()[1].items() if k != "state"})
            while True:
                time.sleep(3600)
    except Terminated as exc:
        # Requests in flight finish (server_close below waits for them); /health and any new
        # request say "draining" until the port closes.
        model.state = "draining"
        _event(
            "stopping",
            name=args.name,
            signal=str(exc),
            sender_pid=_stop_cause.get("sender_pid"),
            sender=_stop_cause.get("sender"),
        )
    finally:
        # A second signal while stopping stays blocked (the watcher took only the first), so it
        # cannot cut the stop short.
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        httpd.shutdown()
        httpd.server_close()
    if rc == 0:
        _event("stopped", name=args.name)
    return rc


def __getattr__(name: str) -> Any:
    # The tinylm engine moved to tinylm_model.py, which builds on this module; callers that
    # import `Model` from here still find it (lazily: an import at the top would be a cycle).
    if name == "Model":
        from .tinylm_model import Model

        return Model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    # Run as the package's module, not as __main__: the engines import it by that name, and one
    # copy of it keeps its exceptions (ClientGone) and classes one.
    from labctl.agent.orchestra import server

    sys.exit(server.main())
