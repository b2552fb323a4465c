"""The JSON-over-HTTP handler the agent's servers share (the orchestra's model server, the
sandbox service): answers as JSON with their length, bodies read with a cap, no access log.
Standard library only, Python 3.8.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any, Dict, Optional, Tuple


class JsonHandler(BaseHTTPRequestHandler):
    timeout = 30  # a client that connects and says nothing must not hold a thread for ever
    max_body = 1 << 20

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

    def log_message(self, format: str, *args: Any) -> None:
        # Health is polled many times a second: the logs keep events, not request lines.
        pass
