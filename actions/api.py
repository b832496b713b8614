"""A small authenticated HTTP API for operators, served by the detect service (aiohttp).

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

The API runs in the detector's process, so a bad client must cost it little: one event-loop
thread and a few worker threads for the store, whatever the clients do. A connection that
sends no complete request within ``idle_timeout_s`` (after connecting or after its last
answer) is closed; at most ``max_connections`` are kept open, and past that a new connection
closes the longest-idle one that has no request in progress (so a flood of idle connections
never locks out an operator; with TLS, a connection still in its handshake is closed by the
handshake timeout, also ``idle_timeout_s``). A body is at most ``max_body_bytes`` (413 beyond,
also when the declared ``Content-Length`` is larger; a malformed or negative one is 400) and
must arrive within ``body_timeout_s`` (408).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from actions.operator import COMMANDS, CommandQueue, pending_approvals
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import Action

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class ApiConfig:
    listen: str | None = None  # host:port; None: no API
    token: str | None = field(default=None, repr=False)
    tls_cert: str | None = None
    tls_key: str | None = None
    idle_timeout_s: float = 15.0  # a connection without a complete request is closed after it
    body_timeout_s: float = 10.0  # a request body must arrive within this (else 408)
    max_connections: int = 256  # open connections kept; the longest idle goes first past it
    max_body_bytes: int = 65536  # a larger body (or declared Content-Length) answers 413
    workers: int = 4  # threads that run store reads and command writes
    # the API's address as operators reach it, for links in notifications (generatorURL);
    # default: from listen (a wildcard address becomes this host's name)
    public_url: str | None = None

    def incident_url(self) -> str:
        """Where incident pages are served ('' without an API)."""
        if self.public_url:
            return self.public_url.rstrip("/")
        if not self.listen:
            return ""
        host, _, port = self.listen.rpartition(":")
        if host.strip("[]") in ("0.0.0.0", "::", ""):
            host = socket.getfqdn()
        return f"{'https' if self.tls_cert else 'http'}://{host}:{port}"

    def validate(self) -> None:
        if self.public_url is not None and not self.public_url.startswith(("http://", "https://")):
            raise ConfigError(f"api.public_url {self.public_url!r} must be an http(s) URL")
        if self.listen is None:
            return
        host, _, port = self.listen.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"api.listen {self.listen!r} must be host:port")
        if not self.token or len(self.token) < 16:
            raise ConfigError("api.token must be set (16+ characters) when api.listen is set")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("api.tls_cert and api.tls_key go together")
        if self.idle_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ConfigError("api.idle_timeout_s and api.body_timeout_s must be positive")
        if self.max_connections < 2 or self.max_body_bytes < 1024 or self.workers < 1:
            raise ConfigError(
                "api.max_connections must be 2 or more, api.max_body_bytes 1024 or more, "
                "api.workers 1 or more"
            )


class _QuietBadRequests(logging.Filter):
    """aiohttp logs each malformed request at ERROR with a traceback: a client could fill the
    detector's log with them. One line at INFO without the traceback says enough."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args, record.exc_info = "api: bad request: %s", (exc.message,), None
            record.exc_text = None
        return True


_http_log = logging.getLogger(__name__ + ".http")
_QUIET = _QuietBadRequests()


class _Refused(asyncio.Protocol):
    """The protocol of a connection over the limit while every other one is busy."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.abort()


@dataclass
class _Conn:
    last: float  # when it connected, or last finished a request
    made: bool = False  # the framework has taken it (after the TLS handshake, if any)


class OperatorApi:
    """Serves the API and the incident pages (actions/incident_page.py) in a thread of its own
    (an asyncio loop). ``store`` may be None (then alerts, actions and pages answer 503)."""

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
        host = host.strip("[]")
        self.ssl: ssl.SSLContext | None = None
        self.scheme = "http"
        if config.tls_cert and config.tls_key:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            try:
                ctx.load_cert_chain(config.tls_cert, config.tls_key)
            except (OSError, ssl.SSLError) as e:
                raise ConfigError(f"api: cannot load TLS certificate: {e}") from e
            self.ssl = ctx
            self.scheme = "https"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # bound here, so the port (also an ephemeral one) is known and in use before start()
        self.sock = socket.create_server((host, int(port)), family=family, backlog=128)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        _http_log.addFilter(_QUIET)  # (once: a logger keeps one of each filter)
        self.executor = ThreadPoolExecutor(config.workers, thread_name_prefix="rocewatch-api")
        self.app = web.Application(middlewares=[self._guard], client_max_size=config.max_body_bytes)
        self.app.router.add_get("/api/v1/alerts", self._alerts)
        self.app.router.add_get("/api/v1/actions", self._actions)
        self.app.router.add_get("/api/v1/pending", self._pending_route)
        self.app.router.add_get("/api/v1/commands/{id}", self._command)
        self.app.router.add_post("/api/v1/{command}", self._post_command)
        self.public: set[str] = set()  # paths served without a token (the login form)
        self.cookie_ok: Callable[[web.Request], bool] = lambda r: False
        self.login_path: str | None = None  # where a browser without a session is sent
        from actions import incident_page

        incident_page.install(self, self.app)
        self._busy: set[RequestHandler] = set()  # connections with a request in progress
        self._conns: dict[RequestHandler, _Conn] = {}
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._run, name="rocewatch-api", daemon=True)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.refused = 0  # connections refused or evicted over max_connections
        self.timed_out = 0  # connections closed for idling

    @property
    def url(self) -> str:
        host = self.config.listen.rpartition(":")[0] if self.config.listen else "127.0.0.1"
        return f"{self.scheme}://{host}:{self.port}"

    def start(self) -> OperatorApi:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise ConfigError(f"api: cannot start: {self._error}") from self._error
        log.info("operator API on %s", self.url)
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        else:  # never started
            self.sock.close()
            if not self._loop.is_closed():
                self._loop.close()
        self.executor.shutdown(wait=False, cancel_futures=True)

    def run_blocking(self, fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        """Run a blocking call (the store, the command queue) on the API's worker threads."""
        return self._loop.run_in_executor(self.executor, fn, *args)

    def authorized(self, request: web.Request) -> bool:
        """The request carries the bearer token (or, for the pages, their session cookie)."""
        scheme, _, token = (request.headers.get("Authorization") or "").partition(" ")
        want = self.config.token or ""
        if scheme == "Bearer" and want:
            return hmac.compare_digest(token.encode(), want.encode())
        return self.cookie_ok(request)

    # --- the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except BaseException as e:
            self._error = e
            self._ready.set()
            self.sock.close()
            return
        self._ready.set()
        sweeper = self._loop.create_task(self._sweep())
        try:
            self._loop.run_forever()
        finally:
            sweeper.cancel()
            self._loop.run_until_complete(self._stop())
            self._loop.close()

    async def _start(self) -> None:
        c = self.config
        self._runner = web.AppRunner(
            self.app,
            handle_signals=False,
            access_log=None,
            logger=_http_log,
            # the sweeper closes idle connections (_sweep); the framework's own timer, where
            # its version has one for a connection's first request, is the backstop
            keepalive_timeout=2 * c.idle_timeout_s,
            lingering_time=0,
            max_line_size=8190,
            max_field_size=8190,
        )
        await self._runner.setup()
        self._server = await self._loop.create_server(
            self._protocol,
            sock=self.sock,
            ssl=self.ssl,
            ssl_handshake_timeout=c.idle_timeout_s if self.ssl else None,
        )

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            await self._runner.cleanup()
        self.sock.close()

    def _protocol(self) -> RequestHandler | _Refused:
        """A new connection: over the limit, the longest-idle connection makes room."""
        assert self._runner is not None and self._runner.server is not None
        live = [h for h in self._runner.server.connections if h.transport is not None]
        now = self._loop.time()
        if len(live) >= self.config.max_connections:
            idle = [h for h in live if h not in self._busy]
            self.refused += 1
            if not idle:
                return _Refused()
            victim = min(idle, key=lambda h: self._conns[h].last if h in self._conns else 0.0)
            self._forget(victim)
            victim.force_close()
        h = self._runner.server()
        self._conns[h] = _Conn(now)
        return h

    def _forget(self, h: RequestHandler) -> None:
        self._conns.pop(h, None)
        self._busy.discard(h)

    async def _sweep(self) -> None:
        """Close connections that sent no complete request within the idle timeout, whatever
        the framework's version does about them (a slow request line or headers included)."""
        limit = self.config.idle_timeout_s
        while True:
            await asyncio.sleep(min(1.0, limit / 4))
            assert self._runner is not None and self._runner.server is not None
            now = self._loop.time()
            live = set(self._runner.server.connections)
            for h, c in list(self._conns.items()):
                if h in live:
                    c.made = True
                elif c.made or now - c.last > 2 * limit:
                    self._forget(h)  # closed (a TLS handshake that never ended times out)
                    continue
                if h not in self._busy and now - c.last > limit and h.transport is not None:
                    self._forget(h)
                    self.timed_out += 1
                    h.force_close()

    # --- every request -------------------------------------------------------------------------
    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = request.protocol
        self._busy.add(conn)
        try:
            resp = await self._answer(request, handler)
        finally:
            self._busy.discard(conn)
            if conn in self._conns:
                self._conns[conn].last = self._loop.time()
        if request.can_read_body:  # body left unread (refused): the connection cannot go on
            resp.force_close()
        return resp

    async def _answer(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if request.path not in self.public and not self.authorized(request):
                log.warning(
                    "api: unauthorized %s %s from %s", request.method, request.path, request.remote
                )
                if (
                    self.login_path
                    and request.method == "GET"
                    and request.path != "/"
                    and not (request.path.startswith("/api/"))
                ):
                    raise web.HTTPSeeOther(f"{self.login_path}?next={quote(request.path_qs)}")
                return _json(
                    401, {"error": "unauthorized"}, {"WWW-Authenticate": 'Bearer realm="rocewatch"'}
                )
            n = request.content_length
            if n is not None and n > self.config.max_body_bytes:
                return _json(413, {"error": f"body over {self.config.max_body_bytes} bytes"})
            return await handler(request)
        except web.HTTPException as e:
            if e.status < 400:
                raise  # redirects
            return _json(e.status, {"error": e.reason})
        except Exception as e:  # one bad request must not stop the API
            log.exception("api: %s %s failed", request.method, request.path)
            return _json(500, {"error": f"{type(e).__name__}: {e}"})

    async def read_body(self, request: web.Request) -> bytes:
        """The request's body, bounded in size and time (413 / 408 as HTTP errors)."""
        try:
            async with asyncio.timeout(self.config.body_timeout_s):
                return await request.read()
        except TimeoutError:
            raise web.HTTPRequestTimeout(reason="the body did not arrive in time") from None

    # --- routes --------------------------------------------------------------------------------
    async def _alerts(self, request: web.Request) -> web.StreamResponse:
        if self.store is None:
            return _json(503, {"error": "no store configured (storage.url)"})
        status = request.query.get("status") or None
        alerts = await self.run_blocking(lambda: self.store.alerts(status=status))
        return _json(200, [a.to_json() for a in alerts])

    async def _actions(self, request: web.Request) -> web.StreamResponse:
        if self.store is None:
            return _json(503, {"error": "no store configured (storage.url)"})
        want = request.query.get("node") or None
        acts: list[Action] = await self.run_blocking(self.store.actions)
        return _json(200, [a.to_json() for a in acts if want is None or a.node == want])

    async def _pending_route(self, request: web.Request) -> web.StreamResponse:
        return _json(200, {"nodes": await self.pending_nodes()})

    async def pending_nodes(self) -> list[str]:
        """Nodes whose drain waits for approval (raises 503 without a source for them)."""
        if self._pending is not None:
            return list(await self.run_blocking(self._pending))
        if self.store is None:
            raise web.HTTPServiceUnavailable(reason="no store configured (storage.url)")
        acts = await self.run_blocking(self.store.actions)
        return [a.node for a in pending_approvals(acts)]

    async def _command(self, request: web.Request) -> web.StreamResponse:
        tail = request.match_info["id"]
        if not tail.isdigit():
            return _json(404, {"error": "no such command"})
        rows = await self.run_blocking(lambda: self.queue.commands(ids=[int(tail)]))
        return _json(200, rows[0]) if rows else _json(404, {"error": "no such command"})

    async def _post_command(self, request: web.Request) -> web.StreamResponse:
        command = request.match_info["command"]
        if command not in COMMANDS:
            return _json(404, {"error": f"no such endpoint {request.path}"})
        raw = await self.read_body(request)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return _json(400, {"error": "the body must be JSON"})
        node = body.get("node") if isinstance(body, dict) else None
        if not isinstance(node, str) or not node or len(node) > 128:
            return _json(400, {"error": 'the body must be {"node": "<node name>"}'})
        by = str(body.get("by") or f"api@{request.remote}")[:128]
        row = await self.queue_command(command, node, by)
        return _json(202, row)

    async def queue_command(self, command: str, node: str, by: str) -> dict[str, Any]:
        """Queue an operator command (the one path of the API, the pages and the CLI)."""

        def add() -> dict[str, Any]:
            cid = self.queue.add_command(command, node, by)
            return self.queue.commands(ids=[cid])[0]

        row: dict[str, Any] = await self.run_blocking(add)
        log.warning("api: %s %s queued as command %d by %s", command, node, row["id"], by)
        return row


def _json(code: int, body: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=code, body=json.dumps(body).encode(), content_type="application/json",
        headers=headers,
    )  # fmt: skip
