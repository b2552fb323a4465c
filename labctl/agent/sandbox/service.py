"""The sandbox service: `labctl sandbox serve`'s process on the sandbox host.

    python -m labctl.agent.sandbox.service --config FILE

An HTTP server on the lab network that keeps the warm pools open between requests, so a
training host sends hundreds of programs per step without an SSH session or a cold pool:

    POST /v1/batch   {"programs": [{"lang", "source" | "source_b64", "timeout"?,
                                    "tests": [{"stdin" | "stdin_b64", "expect"?}]}]}
                  -> {"results": [...one per program, in order...], "took_ms"}
    GET  /health  -> {"state": "warming" | "ready" | "draining", "langs", "served"}

Every request but /health carries `Authorization: Bearer TOKEN`, compared in constant time
with the token file (0600) the config names; without it the answer is 401 and nothing runs.
Each program runs in its own container, all its tests in it (batch.py). A program that
cannot run (no image for its language, Docker failing) gets {"error"} in its place; the
batch's other programs still run. Standard library only, Python 3.8.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import ThreadingHTTPServer
from typing import Any, Dict, List, Optional, cast

from ..core.errors import AgentError
from ..core.httpjson import JsonHandler
from .batch import MAX_TESTS, run_tests
from .docker import Client, DockerError
from .runner import _Pools

MAX_BODY = 32 * 1024 * 1024
MAX_PROGRAMS = 512
MAX_TIMEOUT_S = 60.0


class BadBatch(ValueError):
    pass


def _text_or_b64(d: Dict[str, Any], key: str, where: str) -> None:
    for k in (key, key + "_b64"):
        if d.get(k) is not None and not isinstance(d[k], str):
            raise BadBatch(f"{where}.{k} must be text")


def check_batch(doc: Any, langs: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The batch's programs, or BadBatch naming the first field to fix."""
    if not isinstance(doc, dict) or not isinstance(doc.get("programs"), list):
        raise BadBatch('the body must be {"programs": [...]}')
    programs = doc["programs"]
    if len(programs) > MAX_PROGRAMS:
        raise BadBatch(f"{len(programs)} programs in one batch; send at most {MAX_PROGRAMS}")
    for i, p in enumerate(programs):
        where = f"programs[{i}]"
        if not isinstance(p, dict):
            raise BadBatch(f"{where} must be an object")
        if p.get("lang") not in langs:
            raise BadBatch(
                f"{where}.lang {p.get('lang')!r} is not served here; served: {', '.join(sorted(langs))}"
            )
        if p.get("source") is None and p.get("source_b64") is None:
            raise BadBatch(f"{where} needs its source (or source_b64)")
        _text_or_b64(p, "source", where)
        tests = p.get("tests")
        if not isinstance(tests, list) or not 1 <= len(tests) <= MAX_TESTS:
            raise BadBatch(f"{where}.tests must be a list of 1 to {MAX_TESTS} tests")
        for j, t in enumerate(tests):
            if not isinstance(t, dict):
                raise BadBatch(f"{where}.tests[{j}] must be an object")
            _text_or_b64(t, "stdin", f"{where}.tests[{j}]")
            if t.get("expect") is not None and not isinstance(t["expect"], str):
                raise BadBatch(f"{where}.tests[{j}].expect must be text")
        timeout = p.get("timeout")
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not 0 < timeout <= MAX_TIMEOUT_S
        ):
            raise BadBatch(f"{where}.timeout must be seconds, more than 0 and at most {MAX_TIMEOUT_S:g}")
    return programs


class Service:
    """The pools and the workers that outlive a request."""

    def __init__(
        self,
        langs: Dict[str, Dict[str, Any]],
        limits: Dict[str, Any],
        token: bytes,
        pool: int = 4,
        concurrency: int = 8,
        client: Optional[Client] = None,
        *,
        lab: str,
    ) -> None:
        self.langs = langs
        self.limits = limits
        self.token = token
        self.client = client or Client()
        self.pools = _Pools(self.client, langs, pool, lab)
        self.workers = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="sandbox")
        self.state = "warming"
        self.lang_state: Dict[str, str] = {lang: "warming" for lang in langs}
        self.served = {"batches": 0, "programs": 0, "tests": 0}
        self.lock = threading.Lock()

    def warm(self) -> None:
        """Open every language's pool; a language whose pool cannot open is named in /health
        and its programs get the reason, the others are served."""
        if not self.client.available():
            raise AgentError(f"no Docker socket at {self.client.path}: is dockerd running?", "no_docker")
        for lang in sorted(self.langs):
            image = str(self.langs[lang]["config"]["Image"])
            try:
                if self.client.request("GET", f"/images/{image}/json") is None:
                    raise DockerError(404, f"no such image: {image}")
                self.pools.get(lang)
                self.lang_state[lang] = "ready"
            except (DockerError, OSError) as e:
                self.lang_state[lang] = _reason(e)
        self.state = "ready"

    def authorized(self, header: Optional[str]) -> bool:
        scheme, _, given = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token)

    def _one(self, prog: Dict[str, Any]) -> Dict[str, Any]:
        lang = prog["lang"]
        if self.lang_state.get(lang) not in ("ready", "warming"):
            return _not_run(prog, self.lang_state[lang])
        try:
            return run_tests(self.client, self.pools.get(lang), self.langs[lang], prog, self.limits)
        except (AgentError, DockerError, OSError) as e:
            return _not_run(prog, _reason(e))

    def batch(self, programs: List[Dict[str, Any]]) -> Dict[str, Any]:
        t0 = time.monotonic()
        results = list(self.workers.map(self._one, programs))
        with self.lock:
            self.served["batches"] += 1
            self.served["programs"] += len(programs)
            self.served["tests"] += sum(len(p["tests"]) for p in programs)
        return {"results": results, "took_ms": round((time.monotonic() - t0) * 1000, 2)}

    def health(self) -> Dict[str, Any]:
        with self.lock:
            served = dict(self.served)
        return {"state": self.state, "langs": dict(self.lang_state), "served": served, "pid": os.getpid()}

    def close(self) -> None:
        self.workers.shutdown(wait=True)
        self.pools.wait()


def _not_run(prog: Dict[str, Any], error: str) -> Dict[str, Any]:
    """A program whose tests did not run: one result in the batch, the others go on."""
    return {"lang": prog["lang"], "error": error, "tests": [], "passed": 0, "total": len(prog["tests"])}


def _reason(e: BaseException) -> str:
    if isinstance(e, DockerError) and e.status == 404 and "image" in e.message.lower():
        return f"no image: {e.message}"
    return getattr(e, "message", None) or str(e) or type(e).__name__


class Handler(JsonHandler):
    server_version = "labctl-sandbox/1"
    max_body = MAX_BODY

    @property
    def service(self) -> Service:
        return cast(Server, self.server).service

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] == "/health":
            self._send(200, self.service.health())
        else:
            self._send(404, {"error": f"no such endpoint: GET {self.path}; try /health"})

    def do_POST(self) -> None:
        service = self.service
        route = self.path.split("?", 1)[0]
        # The token before anything else: a caller without it learns nothing, not even the routes.
        if not service.authorized(self.headers.get("Authorization")):
            self.close_connection = True
            why = "send Authorization: Bearer TOKEN, the token file labctl put on this lab's training hosts"
            self._send(401, {"error": why}, {"WWW-Authenticate": 'Bearer realm="labctl-sandbox"'})
            return
        if route != "/v1/batch":
            self._send(404, {"error": f"no such endpoint: POST {route}; try /v1/batch"})
            return
        if service.state != "ready":
            self._send(503, {"error": f"the sandbox service is {service.state}", "state": service.state})
            return
        body, unreadable = self._body()
        if unreadable:
            self._send(unreadable[0], {"error": unreadable[1]})
            return
        try:
            programs = check_batch(body, service.langs)
        except BadBatch as exc:
            self._send(400, {"error": str(exc)})
            return
        try:
            self._send(200, service.batch(programs))
        except Exception as exc:  # the client gets an answer; the log gets the reason
            _event("error", error=f"{type(exc).__name__}: {exc}")
            self._send(500, {"error": f"{type(exc).__name__}: {exc}"})


class Server(ThreadingHTTPServer):
    daemon_threads = False  # a graceful stop waits for the batches in flight

    def __init__(self, address: str, port: int, service: Service) -> None:
        self.service = service
        super().__init__((address, port), Handler)


def _event(name: str, **fields: Any) -> None:
    sys.stderr.write(json.dumps(dict(fields, event=name), sort_keys=True) + "\n")
    sys.stderr.flush()


def read_token(path: str) -> bytes:
    """The token, refused when others could read its file."""
    st = os.stat(path)
    if st.st_mode & 0o077:
        raise AgentError(
            f"{path} is readable by others (mode {st.st_mode & 0o777:o}); it must be 0600", "token"
        )
    with open(path, "rb") as f:
        token = f.read().strip()
    if len(token) < 16:
        raise AgentError(f"{path} holds no token", "token")
    return token


class _Stop(Exception):
    pass


def _stop(signum: int, frame: Any) -> None:
    raise _Stop(signal.Signals(signum).name)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labctl.agent.sandbox.service", description=__doc__)
    parser.add_argument(
        "--config", required=True, help="JSON: lab, bind, port, token_file, langs, limits, pool, concurrency"
    )
    args = parser.parse_args(argv)
    with open(args.config) as f:
        cfg = json.load(f)
    try:
        token = read_token(cfg["token_file"])
    except (AgentError, OSError) as exc:
        sys.stderr.write(f"sandbox service: {getattr(exc, 'message', None) or exc}\n")
        return 1
    try:
        service = Service(
            cfg["langs"],
            cfg["limits"],
            token,
            int(cfg.get("pool", 4)),
            int(cfg.get("concurrency", 8)),
            lab=cfg.get("lab"),
        )
    except AgentError as exc:
        sys.stderr.write(f"sandbox service: {args.config}: {exc.message}\n")
        return 1
    try:
        httpd = Server(cfg.get("bind") or "0.0.0.0", int(cfg["port"]), service)
    except OSError as exc:
        sys.stderr.write(
            f"sandbox service: cannot listen on {cfg.get('bind')}:{cfg['port']}: {exc.strerror or exc}\n"
        )
        return 1
    serve = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    serve.start()
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    rc = 0
    try:
        _event("listening", bind=httpd.server_address[0], port=httpd.server_address[1], pid=os.getpid())
        try:
            service.warm()
        except AgentError as exc:
            sys.stderr.write(f"sandbox service: {exc.message}\n")
            rc = 1
        else:
            _event("ready", langs=service.lang_state)
            while True:
                time.sleep(3600)
    except _Stop as exc:
        service.state = "draining"
        _event("stopping", signal=str(exc))
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        httpd.shutdown()
        httpd.server_close()  # waits for the batches in flight
        service.close()
    if rc == 0:
        _event("stopped")
    return rc


if __name__ == "__main__":
    sys.exit(main())
