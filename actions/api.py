"""A small authenticated HTTP JSON API for operators, served by the detect service.

Every request needs ``Authorization: Bearer <token>`` (the token from ``api.token`` in the
config, best given as ``${ROCEWATCH_API_TOKEN}``; it is compared in constant time and never
logged). TLS when ``tls_cert`` and ``tls_key`` are set.

=====  ==========================  ==============================================================
GET    /api/v1/alerts              stored alert events (``?status=firing|resolved``); needs a store
GET    /api/v1/actions             stored actions (``?node=``); needs a store
GET    /api/v1/pending             drains waiting for approval
POST   /api/v1/approve             ``{"node": "gpu-017"}``: approve a waiting drain
POST   /api/v1/reject              ``{"node": ...}``: reject it
POST   /api/v1/undrain             ``{"node": ...}``: return a node rocewatch drained to service
GET    /api/v1/commands/<id>       what became of a command
=====  ==========================  ==============================================================

Commands answer 202 with the queued command; the service applies it within a poll.
"""

from __future__ import annotations

import hmac
import json
import logging
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from actions.operator import COMMANDS, CommandQueue, pending_approvals
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import Action

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ApiConfig:
    listen: str | None = None  # host:port; None: no API
    token: str | None = field(default=None, repr=False)
    tls_cert: str | None = None
    tls_key: str | None = None

    def validate(self) -> None:
        if self.listen is None:
            return
        host, _, port = self.listen.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"api.listen {self.listen!r} must be host:port")
        if not self.token or len(self.token) < 16:
            raise ConfigError("api.token must be set (16+ characters) when api.listen is set")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("api.tls_cert and api.tls_key go together")


class OperatorApi:
    """Serves the API in a thread. ``store`` may be None (then alerts/actions answer 503)."""

    def __init__(
        self,
        config: ApiConfig,
        queue: CommandQueue,
        store: Any = None,
        pending: Callable[[], list[str]] | None = None,
    ) -> None:
        config.validate()
        if config.listen is None:
            raise ConfigError("api.listen is not set")
        self.config = config
        self.queue = queue
        self.store = store
        self._pending = pending
        host, _, port = config.listen.rpartition(":")
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, fmt: str, *args: Any) -> None:
                pass  # request lines go through log below, never headers

            def do_GET(self) -> None:
                api._serve(self, "GET")

            def do_POST(self) -> None:
                api._serve(self, "POST")

        self.server = ThreadingHTTPServer((host, int(port)), Handler)
        self.scheme = "http"
        if config.tls_cert and config.tls_key:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            try:
                ctx.load_cert_chain(config.tls_cert, config.tls_key)
            except (OSError, ssl.SSLError) as e:
                raise ConfigError(f"api: cannot load TLS certificate: {e}") from e
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host = self.config.listen.rpartition(":")[0] if self.config.listen else "127.0.0.1"
        return f"{self.scheme}://{host}:{self.port}"

    def start(self) -> OperatorApi:
        self._thread.start()
        log.info("operator API on %s", self.url)
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)

    # --- requests ------------------------------------------------------------------------------
    def _serve(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urlparse(h.path)
        try:
            if not self._authorized(h.headers.get("Authorization") or ""):
                log.warning(
                    "api: unauthorized %s %s from %s", method, url.path, h.client_address[0]
                )
                code, body = 401, {"error": "unauthorized"}
            else:
                code, body = self._route(h, method, url.path, parse_qs(url.query))
        except Exception as e:  # one bad request must not stop the API
            log.exception("api: %s %s failed", method, url.path)
            code, body = 500, {"error": f"{type(e).__name__}: {e}"}
        data = json.dumps(body).encode()
        h.send_response(code)
        if code == 401:
            h.send_header("WWW-Authenticate", 'Bearer realm="rocewatch"')
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _authorized(self, header: str) -> bool:
        scheme, _, token = header.partition(" ")
        want = self.config.token or ""
        return (
            scheme == "Bearer" and bool(want) and hmac.compare_digest(token.encode(), want.encode())
        )

    def _route(
        self, h: BaseHTTPRequestHandler, method: str, path: str, q: dict[str, list[str]]
    ) -> tuple[int, Any]:
        if method == "GET" and path in ("/api/v1/alerts", "/api/v1/actions"):
            if self.store is None:
                return 503, {"error": "no store configured (storage.url)"}
            if path.endswith("alerts"):
                status = q["status"][0] if q.get("status") else None
                return 200, [a.to_json() for a in self.store.alerts(status=status)]
            want = q["node"][0] if q.get("node") else None
            acts: list[Action] = self.store.actions()
            return 200, [a.to_json() for a in acts if want is None or a.node == want]
        if method == "GET" and path == "/api/v1/pending":
            if self._pending is not None:
                return 200, {"nodes": self._pending()}
            if self.store is None:
                return 503, {"error": "no store configured (storage.url)"}
            return 200, {"nodes": [a.node for a in pending_approvals(self.store.actions())]}
        if method == "GET" and path.startswith("/api/v1/commands/"):
            tail = path.rsplit("/", 1)[1]
            if not tail.isdigit():
                return 404, {"error": "no such command"}
            rows = self.queue.commands(ids=[int(tail)])
            return (200, rows[0]) if rows else (404, {"error": "no such command"})
        if method == "POST" and path.startswith("/api/v1/"):
            command = path.removeprefix("/api/v1/")
            if command not in COMMANDS:
                return 404, {"error": f"no such endpoint {path}"}
            n = int(h.headers.get("Content-Length") or 0)
            try:
                body = json.loads(h.rfile.read(n) or b"{}")
            except ValueError:
                return 400, {"error": "the body must be JSON"}
            if not isinstance(body, dict):
                return 400, {"error": 'the body must be {"node": "<node name>"}'}
            node = body.get("node")
            if not isinstance(node, str) or not node or len(node) > 128:
                return 400, {"error": 'the body must be {"node": "<node name>"}'}
            by = str(body.get("by") or f"api@{h.client_address[0]}")[:128]
            cid = self.queue.add_command(command, node, by)
            log.warning("api: %s %s queued as command %d by %s", command, node, cid, by)
            return 202, self.queue.commands(ids=[cid])[0]
        return 404, {"error": f"no such endpoint {method} {path}"}
