"""labctl's own model server: one tinylm checkpoint behind a small HTTP API.

    python -m labctl.agent.orchestra.server --model-dir DIR --port N --name NAME [--device D]

The port is bound at once; GET /health answers 503 {"state": "loading" | "warming"} until the
weights are loaded (labctl's loader, the RAM-cache path) and one forward pass ran, then 200
{"state": "ready", "name", "device", "params", "load_s", "warmup_s", "memory_bytes"}.
POST /generate {"prompt", "max_tokens"} continues the prompt greedily; POST /score {"text"}
gives the text's mean log-probability. Tokens are the text's UTF-8 bytes modulo the model's
vocabulary: these models are random, so what matters is that the answers are real forward
passes and deterministic. The same model answers the OpenAI-compatible GET /v1/models and POST
/v1/completions (openai_api.py), which the trainer's client and any OpenAI SDK speak. SIGTERM (or SIGINT) stops it gracefully, exit 0; a model that
cannot be loaded or a port that cannot be bound ends it with exit 1 and one line on stderr.
Progress goes to stderr as JSON lines (the orchestra's log of this server).
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
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, cast

from .. import procs
from ..httpjson import JsonHandler
from . import openai_api
from .openai_api import ApiError, CompletionRequest

MAX_TOKENS = 256
MAX_BODY = 1 << 20
WARMUP_TOKENS = 128
DEFAULT_MAX_TOKENS = 16


class BadRequest(ValueError):
    """What the client sent cannot be answered: 400 with the message."""


class Terminated(BaseException):
    """SIGTERM or SIGINT arrived: unwind whatever runs and stop."""


def _event(event: str, **fields: Any) -> None:
    fields["event"] = event
    sys.stderr.write(json.dumps(fields, sort_keys=True) + "\n")
    sys.stderr.flush()


class Model:
    """The model this server holds, from files to ready, and what it answers."""

    def __init__(self, name: str, model_dir: str, device: str = "auto") -> None:
        self.name = name
        self.model_dir = model_dir
        self.device_arg = device
        self.state = "loading"
        self.config: Dict[str, Any] = {}
        self.device = ""
        self.load_s = 0.0
        self.warmup_s = 0.0
        self.params = 0
        self.memory_bytes = 0
        self.created = int(time.time())
        self._tensors: Optional[Dict[str, Any]] = None
        self._model: Any = None
        # One forward pass at a time: concurrent requests would each hold activations.
        self._lock = threading.Lock()
        # Requests past the state check and not yet answered: a drain finishes these (/health says
        # how many, so a caller can see that a stop has work left, and a test can stop mid-request).
        self.in_flight = 0
        self._counting = threading.Lock()

    def check(self) -> None:
        """What can be checked without torch (config, file headers): a bad folder fails in ms."""
        from ..modelload.loader import model_files, read_header
        from ..tinylm import check_config

        with open(os.path.join(self.model_dir, "config.json")) as f:
            config = json.load(f)
        if not isinstance(config, dict):
            raise ValueError("config.json is not a JSON object")
        check_config(config)
        for path in model_files(self.model_dir):
            read_header(path)
        self.config = config

    def load(self) -> None:
        """The weights onto the device; then the state is "warming"."""
        if not self.config:
            self.check()
        try:
            import torch
        except ImportError:
            raise RuntimeError(f"torch is not installed for {sys.executable}") from None
        from ..modelload.loader import load_model_dir

        self.device = _pick_device(torch, self.device_arg)
        start = time.perf_counter()
        self._tensors = load_model_dir(self.model_dir, device=self.device)
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)
        self.load_s = time.perf_counter() - start
        self.state = "warming"

    def warm(self) -> None:
        """Build the model around the loaded weights and run its first forward pass: "ready"."""
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
        if self.device.startswith("cuda"):
            # What the GPU holds for this process (weights, activations, the allocator's cache).
            self.memory_bytes = int(torch.cuda.memory_reserved(self.device))
        else:
            self.memory_bytes = sum(p.numel() * p.element_size() for p in params)
        self.state = "ready"

    def health(self) -> Tuple[int, Dict[str, Any]]:
        if self.state != "ready":
            return 503, {"state": self.state, "name": self.name}
        return 200, {
            "state": "ready",
            "name": self.name,
            "device": self.device,
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

    def _encode(self, text: Any, field: str) -> List[int]:
        if not isinstance(text, str):
            raise BadRequest(f"{field} must be a string")
        vocab = int(self.config["vocab"])
        ids = [b % vocab for b in text.encode("utf-8")]
        if len(ids) > int(self.config["max_seq"]):
            raise BadRequest(
                f"{field} is {len(ids)} tokens (bytes); this model takes at most max_seq={self.config['max_seq']}"
            )
        return ids

    def generate(self, body: Dict[str, Any]) -> Dict[str, Any]:
        ids = self._encode(body.get("prompt"), "prompt")
        if not ids:
            raise BadRequest("prompt is empty: give at least one character to continue")
        n = body.get("max_tokens", DEFAULT_MAX_TOKENS)
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_TOKENS:
            raise BadRequest(f"max_tokens must be an integer from 0 to {MAX_TOKENS}, got {n!r}")
        start = time.perf_counter()
        with self._lock:
            out, _, _ = self._extend(ids, n)
        return {
            "name": self.name,
            "tokens": out,
            "text": _text(out),
            "seconds": round(time.perf_counter() - start, 4),
        }

    def _extend(
        self,
        ids: List[int],
        n: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        generator: Any = None,
        stops: Optional[List[str]] = None,
        gone: Optional[Callable[[], bool]] = None,
    ) -> Tuple[List[int], List[float], str]:
        """`ids` continued by up to `n` tokens: (tokens, their log-probabilities, finish_reason).
        Temperature 0 is greedy (the first of equal maxima: deterministic); above it, a sample
        from `generator` among the smallest set of tokens whose probability reaches top_p. A
        stop sequence ends it early, left out of the tokens returned. Hold self._lock."""
        import torch

        max_seq = int(self.config["max_seq"])
        out: List[int] = []
        logprobs: List[float] = []
        with torch.no_grad():
            seq = torch.tensor([ids], dtype=torch.long, device=self.device)
            for _ in range(n):
                if gone is not None and gone():
                    raise ClientGone()
                logits = self._model(seq[:, -max_seq:])[0, -1].float()
                logp = torch.log_softmax(logits, dim=-1)
                if temperature == 0:
                    nxt = int(torch.argmax(logits))
                else:
                    nxt = _sample(torch, logits, temperature, top_p, generator)
                out.append(nxt)
                logprobs.append(float(logp[nxt]))
                if stops:
                    kept = openai_api.cut_at_stop(_text(out), stops)
                    if kept is not None:
                        keep = len(kept.encode("utf-8"))
                        return out[:keep], logprobs[:keep], "stop"
                seq = torch.cat([seq, torch.tensor([[nxt]], dtype=torch.long, device=self.device)], dim=1)
        return out, logprobs, "length"

    def _prompt_logprobs(self, ids: List[int]) -> List[float]:
        """Each token's log-probability given those before it (the first has none: len - 1)."""
        import torch
        from torch.nn import functional as F

        with torch.no_grad():
            seq = torch.tensor([ids], dtype=torch.long, device=self.device)
            logp = F.log_softmax(self._model(seq)[0, :-1].float(), dim=-1)
            return [float(x) for x in logp.gather(1, seq[0, 1:].unsqueeze(1)).squeeze(1)]

    def score(self, body: Dict[str, Any]) -> Dict[str, Any]:
        ids = self._encode(body.get("text"), "text")
        if len(ids) < 2:
            raise BadRequest(
                "text must be at least 2 tokens (bytes): each one is scored given those before it"
            )
        start = time.perf_counter()
        with self._lock:
            picked = self._prompt_logprobs(ids)
        return {
            "name": self.name,
            "mean_logprob": sum(picked) / len(picked),
            "tokens": len(ids) - 1,
            "seconds": round(time.perf_counter() - start, 4),
        }

    def complete(self, req: CompletionRequest, gone: Optional[Callable[[], bool]] = None) -> Dict[str, Any]:
        """/v1/completions: n choices per prompt, in the API's order (prompt by prompt). `gone`
        says the client hung up (it timed out): the work stops there, ClientGone, instead of
        holding the model for an answer nobody reads while live requests queue behind it."""
        import torch

        try:
            encoded = [self._encode(p, "prompt") for p in req.prompts]
        except BadRequest as exc:
            raise ApiError(400, str(exc), "prompt") from None
        generator = None
        if req.temperature > 0:
            generator = torch.Generator()
            if req.seed is not None:
                generator.manual_seed(req.seed)
            else:
                generator.seed()
        choices: List[Dict[str, Any]] = []
        with self._lock:
            for i, ids in enumerate(encoded):  # not zip(strict=): Python 3.8
                prompt = req.prompts[i]
                echoed = self._prompt_logprobs(ids) if req.echo and req.logprobs is not None and ids else []
                for _ in range(req.n):
                    out, logprobs, finish = self._extend(
                        ids, req.max_tokens, req.temperature, req.top_p, generator, req.stop, gone
                    )
                    choice: Dict[str, Any] = {
                        "text": (prompt if req.echo else "") + _text(out),
                        "finish_reason": finish,
                        "tokens": len(out),
                    }
                    if req.logprobs is not None:
                        shown = (ids if req.echo else []) + out
                        values: List[Optional[float]] = (
                            [None, *echoed, *logprobs] if req.echo else [*logprobs]
                        )
                        choice["logprobs"] = {
                            "tokens": [chr(t % 256) for t in shown],
                            "token_logprobs": values,
                            "top_logprobs": None,
                            "text_offset": list(range(len(shown))),
                        }
                    choices.append(choice)
        return openai_api.completion_doc(self.name, choices, sum(len(i) for i in encoded))


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


def peer_closed(sock: socket.socket) -> bool:
    """Whether the other end closed `sock` (readable with nothing to read). A client that sent
    more (a pipelined request) is still there."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _not_ready(model: Model) -> Tuple[int, Dict[str, Any]]:
    message = f"{model.name} is {model.state}: poll /health until it answers 200"
    return 503, openai_api.error_doc(message, "service_unavailable", code=model.state)


def _text(tokens: List[int]) -> str:
    return bytes(t % 256 for t in tokens).decode("utf-8", "replace")


def _sample(torch: Any, logits: Any, temperature: float, top_p: float, generator: Any) -> int:
    """One token from softmax(logits / temperature), kept to the top_p nucleus; drawn on the CPU
    so that a seed gives the same tokens on every device."""
    probs = torch.softmax(logits.cpu() / temperature, dim=-1)
    if top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        # Keep each token whose predecessors sum below top_p: the first one always stays.
        keep = torch.cumsum(ordered, dim=0) - ordered < top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], ordered[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


def _pick_device(torch: Any, wanted: str) -> str:
    """auto: cuda:0 (the first GPU CUDA_VISIBLE_DEVICES leaves) where torch sees one, else cpu."""
    if wanted == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if wanted.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"--device {wanted} asked for, but torch {torch.__version__} sees no GPU here")
        return "cuda:0" if wanted == "cuda" else wanted
    return wanted


class Handler(JsonHandler):
    server_version = "labctl-orchestra/1"
    max_body = MAX_BODY

    @property
    def model(self) -> Model:
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
                self._send(
                    200, openai_api.models_doc(model.name, model.created, int(model.config["max_seq"]))
                )
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
        if route != "/v1/completions":
            self._send(404, ApiError(404, f"no such endpoint: POST {route}; try /v1/completions").doc())
            return
        if model.state != "ready":
            self._send(*_not_ready(model))
            return
        with model.serving():
            self._complete(route)

    def _complete(self, route: str) -> None:
        model = self.model
        body, unreadable = self._body()
        if unreadable:
            self._send(unreadable[0], ApiError(*unreadable).doc())
            return
        try:
            request = openai_api.parse_completion(body, model.name, MAX_TOKENS)
            self._send(200, model.complete(request, lambda: peer_closed(self.connection)))
        except ClientGone:
            _event("abandoned", route=route, note="the client hung up before the answer; work stopped")
            self.close_connection = True
        except ApiError as exc:
            self._send(exc.status, exc.doc())
        except Exception as exc:
            _event("error", route=route, error=f"{type(exc).__name__}: {exc}")
            self._send(500, openai_api.error_doc(f"{type(exc).__name__}: {exc}", "server_error"))


class Server(ThreadingHTTPServer):
    """Binds when made (port 0: any free one); serves `model` once serve_forever runs."""

    # Graceful stop: server_close() waits for the requests in flight (non-daemon threads).
    daemon_threads = False

    def __init__(self, port: int, model: Model, address: str = "0.0.0.0") -> None:
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
    parser.add_argument("--model-dir", required=True, help="a tinylm checkpoint: *.safetensors + config.json")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", required=True, help="the model's name in the orchestra")
    parser.add_argument(
        "--device", default="auto", help="auto (cuda:0 where torch sees a GPU), cpu, cuda, cuda:N"
    )
    args = parser.parse_args(argv)
    # Blocked in every thread (those made later inherit it): only the watcher takes them.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    model = Model(args.name, args.model_dir, args.device)
    try:
        httpd = Server(args.port, model)
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


if __name__ == "__main__":
    sys.exit(main())
