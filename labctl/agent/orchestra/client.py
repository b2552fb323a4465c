"""The trainer's client for the orchestra: ask every model at once, get one answer per model.

    from labctl.agent.orchestra.client import Endpoint, ask_all
    answers = ask_all([Endpoint("demo-a", "http://10.0.0.5:8101/v1"), ...], "def add(a, b):")
    for a in answers:
        print(a.name, a.ok, a.latency_s, a.text if a.ok else a.error)

Every model speaks the OpenAI-compatible API (labctl's own servers, vLLM, llama.cpp's server,
a hosted tier); each endpoint says which of its two requests it is asked with (`api`): a
completion continues the prompt (labctl's own models, base models), a chat takes it as the
user's message (instruct models; a hosted tier may serve nothing else). Standard library only,
Python 3.8: the module ships in labctl's agent zipapp, and a torchrun worker imports it without
labctl installed.

Nothing here raises for a model that fails: each answer carries its text or its error, and its
latency. The requests run in parallel, so a cycle costs the slowest model's latency, not the sum.
A request the model could not take (refused connection, reset, a 503 while it loads or drains,
a 404 for a model its port no longer holds: the marks of a rotation) or did not answer in its
timeout is asked again once of another model that answered; `answered_by` then names that
model, `latency_s` is that model's and `waited_s` the time lost first. Any other 4xx is the
model's own answer and is not retried.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from ..core.paths import ORCHESTRA_ENDPOINTS

# What marks a model that cannot take requests now (gone, starting, draining): worth another model.
# "moved": the port answers for another model now (a rotation gave it to a newcomer). "timeout":
# a cycle waits on its slowest model, and one stuck (swapping, overloaded) would cost an answer.
RETRYABLE = ("refused", "reset", "unavailable", "moved", "timeout")
APIS = ("completions", "chat")
MAX_STOPS = 4  # the API's own limit on stop sequences
# A wrong model's 404 as vLLM words it ("The model `x` does not exist.") and llama.cpp's router.
_NO_SUCH_MODEL = re.compile(r"\bmodel\b.*\b(does not exist|not found)", re.I | re.S)
# Tokens a chat template adds around the user's message (roles, a default system prompt):
# counted by check_budget, since the trainer estimates the prompt's own tokens only.
CHAT_TEMPLATE_TOKENS = 64


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
    """One model behind the OpenAI-compatible API. `model` defaults to `name` (labctl's servers
    hold one model under the orchestra's name); `api_key` goes out as a bearer token. At most
    `concurrency` requests to one API and model are in flight from this process (the first
    Endpoint made for them sets it); `price_per_mtok` ({input, output} dollars per million
    tokens) gives each answer its cost. `api`: "completions" or "chat", the request it is asked
    with. What the trainer checks its budget against (check_budget): `max_tokens`, the most one
    request may ask (None: up to the context), `context`, the tokens it serves (None: not
    known), and `engine`, the server that says so (labctl, llama.cpp, vllm; None: a remote tier).
    A remote tier (`remote`) is asked for its `share` of phase 3's tries and, with a
    `budget_per_month` in dollars, no more once this host spent it (spend.RemoteUse)."""

    def __init__(
        self,
        name: str,
        base_url: str,
        model: Optional[str] = None,
        api_key: Optional[str] = None,
        timeout_s: float = 60.0,
        concurrency: int = 4,
        price_per_mtok: Optional[Mapping[str, float]] = None,
        api: str = "completions",
        max_tokens: Optional[int] = None,
        context: Optional[int] = None,
        engine: Optional[str] = None,
        share: float = 1.0,
        budget_per_month: Optional[float] = None,
        remote: bool = False,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"{name}: {base_url!r} is not an http(s) URL such as http://10.0.0.5:8101/v1")
        if concurrency < 1:
            raise ValueError(f"{name}: concurrency must be 1 or more, got {concurrency}")
        if api not in APIS:
            raise ValueError(f"{name}: api must be one of {', '.join(APIS)}, got {api!r}")
        if not 0.0 < share <= 1.0:
            raise ValueError(f"{name}: share must be above 0 and at most 1, got {share!r}")
        if budget_per_month is not None and not budget_per_month > 0:
            raise ValueError(f"{name}: budget_per_month must be above 0 dollars, got {budget_per_month!r}")
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.model = model or name
        self.api_key = api_key
        self.timeout_s = float(timeout_s)
        self.price_per_mtok = dict(price_per_mtok or {})
        self.api = api
        self.max_tokens = max_tokens
        self.context = context
        self.engine = engine
        self.share = float(share)
        self.budget_per_month = None if budget_per_month is None else float(budget_per_month)
        self.remote = remote
        self.gate = _gate(self.base_url, self.model, int(concurrency))
        self._https = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port
        self._path = url.path.rstrip("/")

    def __repr__(self) -> str:  # never the key
        return f"Endpoint({self.name!r}, {self.base_url!r}, model={self.model!r}, api={self.api!r})"

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
    `environ` (a tier without its key would only collect 401s). A field the document lacks (one
    an older labctl wrote) takes the orchestra file's default: completions for a warm model,
    chat for a remote tier, every try (share 1) and no budget for a remote tier. ValueError for
    a share or budget out of its range."""
    out = [
        Endpoint(
            str(m["name"]),
            str(m["base_url"]),
            str(m.get("model") or m["name"]),
            timeout_s=float(m.get("timeout_s") or 60),
            api=str(m.get("api") or "completions"),
            max_tokens=_count(m.get("max_tokens")),
            context=_count(m.get("context")),
            engine=m.get("engine"),
        )
        for m in doc["models"]
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
                api=str(r.get("api") or "chat"),
                max_tokens=_count(r.get("max_tokens")),
                context=_count(r.get("context")),
                share=_fraction(r.get("share"), str(r["name"])),
                budget_per_month=_dollars(r.get("budget_per_month"), str(r["name"])),
                remote=True,
            )
        )
    return out


def _count(value: Any) -> Optional[int]:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _fraction(value: Any, name: str) -> float:
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: share is {value!r}, not a number")
    return float(value)


def _dollars(value: Any, name: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: budget_per_month is {value!r}, not a number of dollars")
    return float(value)


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
    """One answer from one model, asked with its endpoint's api: a completion of `prompt`, or a
    chat whose one user message is `prompt`. Never raises for the model's failure; ValueError
    for more than MAX_STOPS stop sequences or an empty one (the API refuses them)."""
    stops = _stops(stop)
    answer = Answer(endpoint.name)
    chat = endpoint.api == "chat"
    body: Dict[str, Any] = {"model": endpoint.model}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body.update(max_tokens=max_tokens, temperature=temperature)
    if seed is not None:
        body["seed"] = seed
    if stops:
        body["stop"] = stops
    with endpoint.gate:  # the wait for a free slot is not the model's latency
        start = time.perf_counter()
        try:
            status, doc = endpoint.post("/chat/completions" if chat else "/completions", body)
        except (OSError, http.client.HTTPException) as exc:
            answer.latency_s = time.perf_counter() - start
            return _fail(answer, *_transport_kind(exc))
        answer.latency_s = time.perf_counter() - start
    if status != 200:
        return _fail(answer, *_http_kind(status, doc))
    try:
        choice = doc["choices"][0]
        if chat:
            content = choice["message"]["content"]
            # None: the model wrote no content (a refusal, or cut off while it reasoned).
            answer.text = "" if content is None else str(content)
        else:
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
        what = "a chat completion (no choices[0].message)" if chat else "a completion (no choices[0].text)"
        return _fail(answer, "bad_answer", f"the answer is not {what}")
    return answer


def _stops(stop: Optional[Sequence[str]]) -> List[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise ValueError(f"stop takes at most {MAX_STOPS} non-empty texts (the API's limit), got {stops!r}")
    return stops


def _http_kind(status: int, doc: Mapping[str, Any]) -> Tuple[str, str]:
    """(kind, error) of an answer that is not a 200. A 404 naming the model is a rotation's mark
    (its port holds another model now): labctl's server says code model_not_found, vLLM "The
    model `x` does not exist." with type NotFoundError, in {"error": {...}} or, before 0.6, at
    the top of the document."""
    err = doc.get("error")
    fields = err if isinstance(err, dict) else doc if err is None else {"message": err}
    message = fields.get("message") or doc.get("detail") or json.dumps(doc)[:200]
    if status == 503:
        return "unavailable", f"HTTP {status}: {message}"
    if status == 404 and (
        fields.get("code") == "model_not_found" or _NO_SUCH_MODEL.search(str(message)) is not None
    ):
        return "moved", f"HTTP {status}: {message}"
    return "http", f"HTTP {status}: {message}"


def ask_all(
    endpoints: Sequence[Endpoint],
    prompt: str,
    max_tokens: int = 128,
    temperature: float = 0.0,
    seed: Optional[int] = None,
    stop: Optional[Sequence[str]] = None,
    retry: bool = True,
) -> List[Answer]:
    """Every endpoint's answer to `prompt`, asked at once, in the order of `endpoints`, each with
    its own api (complete's); `stop`: at most MAX_STOPS texts the answers end before.

    Each request is bounded by its endpoint's timeout_s, and so is the whole call (a server that
    trickles bytes is given up on too). A request a model could not take, or did not answer in
    time, is asked again once of another model that answered (round robin), so a rotation
    mid-cycle costs one answer's latency, not an answer."""
    _stops(stop)  # a bad list is the caller's, said once before any request

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
            # latency_s stays the stand-in's own: the time a model takes to answer is its figure,
            # and the time lost on the first is waited_s.
            second.name, second.answered_by, second.retried = first.name, stand_in.name, True
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


_SERVERS = {"labctl": "labctl's server", "llama.cpp": "llama.cpp's server", "vllm": "vLLM"}


def check_budget(endpoints: Sequence[Endpoint], prompt_tokens_estimate: int, answer_tokens: int) -> List[str]:
    """What phase 3's budget asks of a model that it cannot give, one line each, naming the
    model and the fix: answer_tokens above a server's cap on one request (labctl's server
    refuses more than its MAX_TOKENS with a 400 per request), or the prompt and answer together
    beyond the context the model is served with (a chat counts CHAT_TEMPLATE_TOKENS more for
    its template). A model whose figures the endpoints file does not give is not checked. Pure:
    the trainer's preflight calls it with the endpoints it read."""
    problems: List[str] = []
    for ep in endpoints:
        server = _SERVERS.get(ep.engine or "", ep.engine or "a remote tier")
        longer = _longer_context(ep)
        cap = ep.max_tokens
        if cap is not None and answer_tokens > cap:
            problems.append(
                f"rl.answer_tokens {answer_tokens} is above {ep.name}'s cap {cap} ({server}): "
                f"set rl.answer_tokens <= {cap}"
            )
        if ep.context is None:
            continue
        prompt = prompt_tokens_estimate + (CHAT_TEMPLATE_TOKENS if ep.api == "chat" else 0)
        room = ep.context - prompt
        if room < 1:
            problems.append(
                f"the prompt (about {prompt} tokens) fills {ep.name}'s context of {ep.context} ({server}): "
                f"shorten it (fewer rl.context_tokens), {longer}"
            )
        elif prompt + answer_tokens > ep.context:
            problems.append(
                f"the prompt (about {prompt} tokens) and rl.answer_tokens {answer_tokens} are above "
                f"{ep.name}'s context of {ep.context} ({server}): set rl.answer_tokens <= {room}, {longer}"
            )
    return problems


def _longer_context(ep: Endpoint) -> str:
    if ep.engine is None:
        return f"or take {ep.name} out of the orchestra file's remote tiers"
    if ep.engine == "labctl":
        # labctl's server takes no context setting: it serves what the model was made with.
        return (
            f"or take {ep.name} out of the orchestra file's models (it serves the context it was made with)"
        )
    return f"or give {ep.name} a longer context: in the orchestra file (up to what it was trained for)"
