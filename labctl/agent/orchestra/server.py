"""labctl's own model server: one model folder behind a small HTTP API.

    python -m labctl.agent.orchestra.server --model-dir DIR --port N --name NAME [--device D]
        [--host ADDR] [--format auto|hf|tinylm]

Two formats, one server: a Hugging Face causal LM (config.json with `model_type`, safetensors,
tokenizer.json, a chat template; hf_model.py, through `transformers`) and labctl's tinylm
(config.json with `vocab` and `max_seq`, byte tokens; tinylm_model.py). `--format auto` tells
them apart by config.json. This module is what does not depend on the format: the HTTP side,
the lifecycle, and the requests (`ServedModel`), which each format answers with the same primitives
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
import signal
import sys
import threading
import time
from contextlib import closing
from http.server import ThreadingHTTPServer
from typing import Any, Callable, Dict, Generator, List, Optional, Tuple, cast

from ..core import procs
from ..core.httpjson import JsonHandler
from . import openai_api
from .backend import (
    MAX_TOKENS,
    BadRequest,
    ClientGone,
    Request,
    ServedModel,
    _event,
    peer_closed,
)
from .openai_api import ApiError
from .tinylm_model import Model

__all__ = ["MAX_TOKENS", "Model", "ServedModel", "Server", "main", "open_model"]

MAX_BODY = 1 << 20
FORMATS = ("auto", "hf", "tinylm")
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


class Terminated(BaseException):
    """SIGTERM or SIGINT arrived: unwind whatever runs and stop."""


def _not_ready(model: ServedModel) -> Tuple[int, Dict[str, Any]]:
    message = f"{model.name} is {model.state}: poll /health until it answers 200"
    return 503, openai_api.error_doc(message, "service_unavailable", code=model.state)


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


def open_model(name: str, model_dir: str, device: str = "auto", fmt: str = "auto") -> ServedModel:
    """The engine for the folder's format (read from config.json when `fmt` is auto); nothing loaded yet."""
    if fmt == "auto":
        fmt = detect_format(model_dir)
    if fmt == "hf":
        from .hf_model import HFModel

        return HFModel(name, model_dir, device)
    if fmt == "tinylm":
        return Model(name, model_dir, device)
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")


class Handler(JsonHandler):
    server_version = "labctl-orchestra/1"
    max_body = MAX_BODY

    @property
    def model(self) -> ServedModel:
        return cast(Server, self.server).model

    def _error_doc(self, status: int, message: str) -> Dict[str, Any]:
        if not self.path.startswith("/v1/"):
            return {"error": message}
        if status >= 500:
            return openai_api.error_doc(message, "server_error")
        return ApiError(status, message).doc()

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

    def __init__(self, port: int, model: ServedModel, address: str = "0.0.0.0") -> None:
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


if __name__ == "__main__":
    sys.exit(main())
