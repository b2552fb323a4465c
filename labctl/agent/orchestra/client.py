"""The trainer's client for the orchestra: ask every model at once, get one answer per model.

    from labctl.agent.orchestra.client import Endpoint, ask_all
    answers = ask_all([Endpoint("demo-a", "http://10.0.0.5:8101/v1"), ...], "def add(a, b):")
    for a in answers:
        print(a.name, a.ok, a.latency_s, a.text if a.ok else a.error)

Every model speaks the OpenAI-compatible completions API (labctl's own servers, vLLM,
llama.cpp's server, a hosted tier), so one request shape serves them all. Standard library
only, Python 3.8: the module ships in labctl's agent zipapp, and a torchrun worker imports it
without labctl installed.

Nothing here raises for a model that fails: each answer carries its text or its error, and its
latency. The requests run in parallel, so a cycle costs the slowest model's latency, not the sum.
A request the model could not take (refused connection, reset, a 503 while it loads or drains,
a 404 for a model its port no longer holds: the marks of a rotation) is asked again once of
another model that answered; `answered_by` then
names that model. A timeout or a 4xx is the model's own answer and is not retried.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from ..paths import ORCHESTRA_ENDPOINTS

# What marks a model that cannot take requests now (gone, starting, draining): worth another model.
# "moved": the port answers for another model now (a rotation gave it to a newcomer).
RETRYABLE = ("refused", "reset", "unavailable", "moved")


# One gate per (API, model) in this process: every thread's requests together stay within the
# endpoint's concurrency (a hosted tier's rate limit, a small server's memory).
_GATES: Dict[Tuple[str, str], threading.BoundedSemaphore] = {}
_GATES_LOCK = threading.Lock()


def _gate(base_url: str, model: str, concurrency: int) -> threading.BoundedSemaphore:
    with _GATES_LOCK:
        gate = _GATES.get((base_url, model))
        if gate is None:
            gate = _GATES[(base_url, model)] = threading.BoundedSemaphore(concurrency)
        return gate


class Endpoint:
    """One model behind the completions API. `model` defaults to `name` (labctl's servers hold
    one model under the orchestra's name); `api_key` goes out as a bearer token. At most
    `concurrency` requests to one API and model are in flight from this process (the first
    Endpoint made for them sets it); `price_per_mtok` ({input, output} dollars per million
    tokens) gives each answer its cost."""

    def __init__(
        self,
        name: str,
        base_url: str,
        model: Optional[str] = None,
        api_key: Optional[str] = None,
        timeout_s: float = 60.0,
        concurrency: int = 4,
        price_per_mtok: Optional[Mapping[str, float]] = None,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"{name}: {base_url!r} is not an http(s) URL such as http://10.0.0.5:8101/v1")
        if concurrency < 1:
            raise ValueError(f"{name}: concurrency must be 1 or more, got {concurrency}")
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.model = model or name
        self.api_key = api_key
        self.timeout_s = float(timeout_s)
        self.price_per_mtok = dict(price_per_mtok or {})
        self.gate = _gate(self.base_url, self.model, int(concurrency))
        self._https = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port
        self._path = url.path.rstrip("/")

    def __repr__(self) -> str:  # never the key
        return f"Endpoint({self.name!r}, {self.base_url!r}, model={self.model!r})"

    def post(self, route: str, body: Dict[str, Any]) -> Tuple[int, Dict[str, Any]]:
        return self._request("POST", route, json.dumps(body).encode())

    def get(self, route: str) -> Tuple[int, Dict[str, Any]]:
        return self._request("GET", route, None)

    def _request(self, method: str, route: str, data: Optional[bytes]) -> Tuple[int, Dict[str, Any]]:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self.timeout_s)
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            conn.request(method, self._path + route, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            doc = json.loads(raw.decode("utf-8"))
        except ValueError:
            doc = {"error": {"message": raw[:200].decode("utf-8", "replace")}}
        return resp.status, doc if isinstance(doc, dict) else {"error": {"message": str(doc)[:200]}}


class Answer:
    """One model's answer to one prompt: `text` or `error` (with its `kind`), and the latency."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.answered_by = name
        self.text: Optional[str] = None
        self.error: Optional[str] = None
        self.kind: Optional[str] = None  # refused, reset, unavailable, moved, timeout, http, bad_answer
        self.finish_reason: Optional[str] = None
        self.latency_s = 0.0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cost_usd = 0.0  # from the answering endpoint's price_per_mtok and the usage it reported
        self.retried = False
        self.waited_s = 0.0  # retried: the time lost on the model that could not take it (a rotation)

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_dict(self) -> Dict[str, Any]:
        return dict(vars(self), ok=self.ok)

    def __repr__(self) -> str:
        what = f"text={self.text!r}" if self.ok else f"error={self.error!r}"
        return f"Answer({self.name!r}, {what}, latency_s={self.latency_s:.3f})"


def load_endpoints(path: Optional[str] = None, environ: Optional[Mapping[str, str]] = None) -> List[Endpoint]:
    """The models to ask now, from the endpoints.json every rotation rewrites on the hosts that
    train (default paths.ORCHESTRA_ENDPOINTS, or $LABCTL_ORCHESTRA_ENDPOINTS):
    see `from_doc`. Read it again per batch of calls to follow the rotation. OSError when the
    file cannot be read, ValueError when it is not an endpoints document."""
    env = os.environ if environ is None else environ
    path = path or env.get("LABCTL_ORCHESTRA_ENDPOINTS") or ORCHESTRA_ENDPOINTS
    with open(path, "rb") as f:
        doc = json.loads(f.read().decode("utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), list):
        raise ValueError(f"{path} is not an orchestra endpoints file (no models list)")
    return from_doc(doc, env)


def from_doc(doc: Mapping[str, Any], environ: Mapping[str, str]) -> List[Endpoint]:
    """An endpoints document's warm set, then each remote tier whose key variable is set in
    `environ` (a tier without its key would only collect 401s)."""
    out = [
        Endpoint(str(m["name"]), str(m["base_url"]), str(m.get("model") or m["name"])) for m in doc["models"]
    ]
    for r in doc.get("remote") or []:
        key_env = r.get("api_key_env")
        key = environ.get(key_env) if key_env else None
        if key_env and not key:
            continue
        out.append(
            Endpoint(
                str(r["name"]),
                str(r["base_url"]),
                str(r["model"]),
                key,
                float(r.get("timeout_s") or 60),
                int(r.get("concurrency") or 4),
                r.get("price_per_mtok"),
            )
        )
    return out


def _fail(answer: Answer, kind: str, message: str) -> Answer:
    answer.kind, answer.error = kind, message
    return answer


def _transport_kind(exc: BaseException) -> Tuple[str, str]:
    if isinstance(exc, socket.timeout):
        return "timeout", "no answer before the timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "refused", "connection refused: no server on that port (stopped, or not started)"
    if isinstance(exc, (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected)):
        return "reset", "the connection was cut mid-request (the server stopped or was killed)"
    if isinstance(exc, http.client.IncompleteRead):
        return "reset", "the answer was cut short (the server stopped or was killed)"
    return "refused", f"{type(exc).__name__}: {exc}"


def complete(
    endpoint: Endpoint,
    prompt: str,
    max_tokens: int = 128,
    temperature: float = 0.0,
    seed: Optional[int] = None,
    stop: Optional[Sequence[str]] = None,
) -> Answer:
    """One completion from one model; never raises for the model's failure."""
    answer = Answer(endpoint.name)
    body: Dict[str, Any] = {
        "model": endpoint.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": temperature,
    }
    if seed is not None:
        body["seed"] = seed
    if stop:
        body["stop"] = list(stop)
    with endpoint.gate:  # the wait for a free slot is not the model's latency
        start = time.perf_counter()
        try:
            status, doc = endpoint.post("/completions", body)
        except (OSError, http.client.HTTPException) as exc:
            answer.latency_s = time.perf_counter() - start
            return _fail(answer, *_transport_kind(exc))
        answer.latency_s = time.perf_counter() - start
    if status != 200:
        err = doc.get("error")
        message = err.get("message") if isinstance(err, dict) else err
        code = err.get("code") if isinstance(err, dict) else None
        kind = "unavailable" if status == 503 else "moved" if code == "model_not_found" else "http"
        return _fail(answer, kind, f"HTTP {status}: {message}")
    try:
        choice = doc["choices"][0]
        answer.text = str(choice["text"])
        answer.finish_reason = choice.get("finish_reason")
        usage = doc.get("usage") or {}
        answer.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        answer.completion_tokens = int(usage.get("completion_tokens") or 0)
        price = endpoint.price_per_mtok
        answer.cost_usd = (
            answer.prompt_tokens * float(price.get("input") or 0)
            + answer.completion_tokens * float(price.get("output") or 0)
        ) / 1e6
    except (KeyError, IndexError, TypeError, ValueError):
        return _fail(answer, "bad_answer", "the answer is not a completion (no choices[0].text)")
    return answer


def ask_all(
    endpoints: Sequence[Endpoint],
    prompt: str,
    max_tokens: int = 128,
    temperature: float = 0.0,
    seed: Optional[int] = None,
    stop: Optional[Sequence[str]] = None,
    retry: bool = True,
) -> List[Answer]:
    """Every endpoint's answer to `prompt`, asked at once, in the order of `endpoints`.

    Each request is bounded by its endpoint's timeout_s, and so is the whole call (a server that
    trickles bytes is given up on too). A request a model could not take is asked again once of
    another model that answered (round robin), so a rotation mid-cycle costs one answer's
    latency, not an answer."""

    def one(ep: Endpoint) -> Answer:
        return complete(ep, prompt, max_tokens, temperature, seed, stop)

    answers = _parallel(endpoints, one)
    if not retry:
        return answers
    # Indices, not zip(strict=): Python 3.8.
    healthy = [endpoints[i] for i, a in enumerate(answers) if a.ok]
    again = [i for i, a in enumerate(answers) if a.kind in RETRYABLE]
    if not healthy or not again:
        return answers
    stand_ins = [healthy[n % len(healthy)] for n in range(len(again))]
    retried = _parallel(stand_ins, one)
    for n, i in enumerate(again):
        stand_in, second, first = stand_ins[n], retried[n], answers[i]
        if second.ok:
            second.name, second.answered_by, second.retried = first.name, stand_in.name, True
            second.latency_s += first.latency_s
            second.waited_s = first.latency_s
            answers[i] = second
        else:
            first.error = f"{first.error}; asked {stand_in.name} instead: {second.error}"
    return answers


def _parallel(endpoints: Sequence[Endpoint], call: Any) -> List[Answer]:
    results: List[Optional[Answer]] = [None] * len(endpoints)

    def run(i: int) -> None:
        results[i] = call(endpoints[i])

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(endpoints))]
    start = time.monotonic()
    for t in threads:
        t.start()
    for i, t in enumerate(threads):
        t.join(max(0.0, start + endpoints[i].timeout_s + 1.0 - time.monotonic()))
    out: List[Answer] = []
    for i, ep in enumerate(endpoints):
        got = results[i]
        if got is None:  # still reading: a trickle the socket timeout never ends
            got = _fail(Answer(ep.name), "timeout", f"no whole answer within {ep.timeout_s:g} s")
            got.latency_s = time.monotonic() - start
        out.append(got)
    return out


class Score:
    """A text's mean log-probability under one model (each token given those before it)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.mean_logprob: Optional[float] = None
        self.tokens = 0
        self.latency_s = 0.0
        self.error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.error is None


def score(endpoint: Endpoint, text: str) -> Score:
    """`text` scored by the API's own idiom (echo, logprobs 0, no new tokens), which vLLM and
    labctl's servers answer; never raises for the model's failure."""
    out = Score(endpoint.name)
    body = {"model": endpoint.model, "prompt": text, "max_tokens": 0, "echo": True, "logprobs": 0}
    start = time.perf_counter()
    try:
        status, doc = endpoint.post("/completions", body)
    except (OSError, http.client.HTTPException) as exc:
        out.error = _transport_kind(exc)[1]
        return out
    finally:
        out.latency_s = time.perf_counter() - start
    if status != 200:
        err = doc.get("error")
        out.error = f"HTTP {status}: {err.get('message') if isinstance(err, dict) else err}"
        return out
    try:
        values = [v for v in doc["choices"][0]["logprobs"]["token_logprobs"] if v is not None]
    except (KeyError, IndexError, TypeError):
        out.error = "the answer holds no logprobs.token_logprobs"
        return out
    if not values:
        out.error = "the text is too short to score: give at least 2 tokens"
        return out
    out.mean_logprob = sum(float(v) for v in values) / len(values)
    out.tokens = len(values)
    return out


def models(endpoint: Endpoint) -> List[str]:
    """The model ids the endpoint serves (GET /models); OSError or ValueError when it cannot say."""
    status, doc = endpoint.get("/models")
    if status != 200 or not isinstance(doc.get("data"), list):
        raise ValueError(f"{endpoint.name}: GET {endpoint.base_url}/models answered HTTP {status}")
    return [str(m.get("id")) for m in doc["data"] if isinstance(m, dict)]
