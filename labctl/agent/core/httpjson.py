"""The JSON-over-HTTP handler the agent's servers share (the orchestra's model server, the
sandbox service): answers as JSON with their length, bodies read with a cap, no access log.
Every request gets an answer, in the shape its server's `_error_doc` gives: a body nested too
deeply to parse is a 400, an error no handler caught a 500 (its reason logged), and the server
goes on. Standard library only, Python 3.8.
"""

from __future__ import annotations

import json
import socket
import sys
from http.server import BaseHTTPRequestHandler
from typing import Any, Dict, Optional, Tuple


class JsonHandler(BaseHTTPRequestHandler):
    timeout = 30  # a client that connects and says nothing must not hold a thread for ever
    max_body = 1 << 20
    _dispatched = False  # the request was parsed and handed to its do_ method
    _answering = False  # a status line was sent: too late to answer with another

    def _error_doc(self, status: int, message: str) -> Dict[str, Any]:
        """An error in the shape of the endpoint asked (self.path); servers with another shape
        override it."""
        return {"error": message}

    def parse_request(self) -> bool:
        self._dispatched = super().parse_request()
        return self._dispatched

    def send_response(self, code: int, message: Optional[str] = None) -> None:
        self._answering = True
        super().send_response(code, message)

    def handle_one_request(self) -> None:
        # Without this a handler's exception ends the connection with no answer at all and a
        # traceback on stderr; the client is told, and the log gets one line like every event.
        self._dispatched = self._answering = False
        try:
            super().handle_one_request()
        except Exception as exc:
            self.close_connection = True
            reason = f"{type(exc).__name__}: {exc}"
            if not self._dispatched or isinstance(exc, (ConnectionError, socket.timeout)):
                return  # the request never arrived whole, or its client is gone: nobody to tell
            line = {"event": "error", "route": self.path.split("?", 1)[0], "error": reason}
            sys.stderr.write(json.dumps(line, sort_keys=True) + "\n")
            sys.stderr.flush()
            if self._answering:
                return  # half an answer went out; closing the connection is all that is left
            try:
                self._send(500, self._error_doc(500, reason))
            except OSError:
                pass

    def _send(self, code: int, doc: Dict[str, Any], headers: Optional[Dict[str, str]] = None) -> None:
        data = json.dumps(doc, sort_keys=True).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Tuple[Optional[Any], Optional[Tuple[int, str]]]:
        """(the JSON body, None) or (None, (status, why it cannot be read)); an empty body is {}."""
        try:
            length = int(self.headers.get("Content-Length") or "-1")
        except ValueError:
            length = -1
        if not 0 <= length <= self.max_body:
            return None, (411 if length < 0 else 413, f"send a JSON body of at most {self.max_body} bytes")
        try:
            return json.loads(self.rfile.read(length).decode("utf-8") or "{}"), None
        except ValueError as exc:
            return None, (400, f"the body is not JSON: {exc}")
        except RecursionError:
            return None, (400, "the body is nested too deeply to parse as JSON; send fewer levels")

    def log_message(self, format: str, *args: Any) -> None:
        # Health is polled many times a second: the logs keep events, not request lines.
        pass
