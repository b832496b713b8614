"""What the HTTP stand-ins share: a threaded server on 127.0.0.1 that hands every request to
``serve(handler, method)``, started and stopped as a context manager, and a JSON reply."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


class HttpStandIn:
    """Subclasses implement ``serve``; ``url`` is the base URL once constructed."""

    def __init__(self) -> None:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

        for method in METHODS:
            setattr(Handler, f"do_{method}", lambda h, m=method: stand_in.serve(h, m))
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def serve(self, h: BaseHTTPRequestHandler, method: str) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


def read_body(h: BaseHTTPRequestHandler) -> bytes:
    n = int(h.headers.get("Content-Length") or 0)
    return h.rfile.read(n) if n else b""


def reply_json(h: BaseHTTPRequestHandler, code: int, doc: Any) -> None:
    data = json.dumps(doc).encode()
    h.send_response(code)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)
