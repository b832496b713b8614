"""The gNMI collector: a Subscribe stream per target over grpcio, decoded into columnar batches.

Each target is a task on one asyncio event loop (grpc.aio) with its own channel: it subscribes
and decodes every response straight into the column lists of the collector's one
``NotificationDecoder``, which hands a SAMPLE_SCHEMA frame of every target's samples to the sink
every ``batch_updates`` samples or ``batch_interval_s``. (A decoder per target made a frame per
target every interval: a hundred rows each at 64 ports sampled every second, and building a
frame costs as much as decoding a few hundred updates.) A
stream that fails or ends is re-subscribed after a capped exponential backoff with jitter (delay
drawn from [d/2, d], d = min(max, initial x 2^attempt)); the attempt count resets once a
response arrives.
Errors are reported once per distinct cause, naming the target (TLS problems say which setting
to check). Per-target health (state, last error, updates, rate, reconnects) is kept in
``TargetHealth`` and, when a Prometheus registry is given, exported as metrics.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import polars as pl
from pygnmi.spec.v080 import gnmi_pb2 as pb

from collector.gnmi.config import GnmiConfig, SubscriptionConfig, TargetConfig, TlsConfig
from collector.gnmi.decode import LldpTable, NotificationDecoder, notification_events
from collector.gnmi.paths import to_path
from collector.mapping import GnmiMapper
from rocewatch.core.errors import ConfigError
from rocewatch.core.stats import Stats

log = logging.getLogger(__name__)

_MAX_MSG = 64 << 20
_STREAM_MODE = {
    "sample": pb.SAMPLE,
    "on_change": pb.ON_CHANGE,
    "target_defined": pb.TARGET_DEFINED,
}
_ENCODING = {"proto": pb.PROTO, "json_ietf": pb.JSON_IETF, "json": pb.JSON}
_LIST_MODE = {
    "stream": pb.SubscriptionList.STREAM,
    "once": pb.SubscriptionList.ONCE,
    "poll": pb.SubscriptionList.POLL,
}

SendFrame = Callable[[pl.DataFrame], None]  # an output (collector.output) or a test's list
EventSink = Callable[[list[dict[str, Any]]], None]


@dataclass
class TargetHealth:
    """What one target is doing: ``state`` is connecting, up, backoff, done or stopped."""

    name: str
    address: str
    state: str = "connecting"
    last_error: str = ""
    updates: int = 0
    notifications: int = 0
    subscribes: int = 0  # streams that delivered at least one response
    reconnects: int = 0  # streams that failed or ended and were tried again
    synced: bool = False
    last_update_mono: float = 0.0
    subscribed_mono: float = 0.0
    rate: float = 0.0  # updates per second, exponentially smoothed
    _rate_t: float = field(default=0.0, repr=False)
    _rate_n: int = field(default=0, repr=False)

    def tick_rate(self, now: float) -> None:
        if self._rate_t == 0.0:
            self._rate_t, self._rate_n = now, self.updates
            return
        dt = now - self._rate_t
        if dt >= 1.0:
            r = (self.updates - self._rate_n) / dt
            self.rate = r if self.rate == 0.0 else 0.7 * self.rate + 0.3 * r
            self._rate_t, self._rate_n = now, self.updates


class _Metrics:
    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Gauge

        r = registry
        self.updates = Counter(
            "rocewatch_gnmi_updates_total", "gNMI updates received", ["target"], registry=r
        )
        self.reconnects = Counter(
            "rocewatch_gnmi_reconnects_total", "streams re-subscribed", ["target"], registry=r
        )
        self.up = Gauge("rocewatch_gnmi_target_up", "1 while streaming", ["target"], registry=r)
        self.rate = Gauge(
            "rocewatch_gnmi_updates_per_second", "smoothed update rate", ["target"], registry=r
        )
        self.unknown = Gauge(
            "rocewatch_gnmi_unknown_path_updates",
            "updates on paths the mapping table does not know",
            ["path"],
            registry=r,
        )


# --- channels ------------------------------------------------------------------------------------


def _read(path: str | None, what: str, target: str) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"gnmi target {target}: cannot read tls {what} {path}: {e}") from e


def _presented_cert(address: str, timeout: float = 5.0) -> bytes:
    """The PEM certificate a TLS server presents, unverified (for ``skip_verify``)."""
    host, _, port = address.rpartition(":")
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock,
        ctx.wrap_socket(sock, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    if der is None:
        raise OSError("the target presented no certificate")
    return ssl.DER_cert_to_PEM_cert(der).encode()


def _cert_name(pem: bytes) -> str | None:
    """A DNS name or IP the certificate is issued to (to override the checked name)."""
    try:
        from cryptography import x509
    except ImportError:  # pragma: no cover - cryptography ships with grpcio-tools' deps here
        return None
    cert = x509.load_pem_x509_certificate(pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = san.get_values_for_type(x509.DNSName)
        if names:
            return str(names[0])
        ips = san.get_values_for_type(x509.IPAddress)
        if ips:
            return str(ips[0])
    except x509.ExtensionNotFound:
        pass
    cn = cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)
    return str(cn[0].value) if cn else None


def make_channel(t: TargetConfig) -> grpc.Channel:
    """A grpc channel to ``t`` with its TLS settings (insecure when TLS is off)."""
    opts, creds = _channel_args(t)
    if creds is None:
        return grpc.insecure_channel(t.address, options=opts)
    return grpc.secure_channel(t.address, creds, options=opts)


def _channel_args(t: TargetConfig) -> tuple[list[tuple[str, Any]], grpc.ChannelCredentials | None]:
    opts: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", _MAX_MSG),
        # gRPC servers (Go's included) refuse pings more often than every 5 minutes by default
        # and answer with GOAWAY "too_many_pings"; a dead peer still shows as a failed stream
        ("grpc.keepalive_time_ms", 330_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        # reconnect pacing is ours (capped backoff with jitter), not the channel's
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        ("grpc.enable_retries", 0),
    ]
    tls = t.tls or TlsConfig()
    if not tls.on:
        return opts, None
    root = _read(tls.ca_file, "ca_file", t.name)
    name = tls.server_name
    if tls.skip_verify:
        root = _presented_cert(t.address)
        name = name or _cert_name(root)
    if name:
        opts.append(("grpc.ssl_target_name_override", name))
    creds = grpc.ssl_channel_credentials(
        root_certificates=root,
        private_key=_read(tls.key_file, "key_file", t.name),
        certificate_chain=_read(tls.cert_file, "cert_file", t.name),
    )
    return opts, creds


async def make_aio_channel(t: TargetConfig) -> grpc.aio.Channel:
    """``make_channel`` for grpc.aio (the collector's streams)."""
    opts, creds = await asyncio.to_thread(_channel_args, t)
    if creds is None:
        return grpc.aio.insecure_channel(t.address, options=opts)
    return grpc.aio.secure_channel(t.address, creds, options=opts)


def explain(t: TargetConfig, err: BaseException) -> str:
    """A one-line reason naming the target, with a hint for TLS and authentication problems."""
    where = f"gNMI target {t.name} ({t.address})"
    if isinstance(err, grpc.RpcError):
        code = err.code() if hasattr(err, "code") else None
        details = (err.details() if hasattr(err, "details") else "") or ""
        low = details.lower()
        tls = t.tls or TlsConfig()
        if "certificate_verify_failed" in low or "certificate verify failed" in low:
            return (
                f"{where}: TLS certificate not trusted (check tls.ca_file / server_name): {details}"
            )
        if "ssl" in low or "handshake" in low or "tls" in low:
            side = "TLS" if tls.on else "plaintext (TLS is off for this target)"
            return f"{where}: TLS handshake failed using {side}: {details}"
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return f"{where}: authentication refused (check username/password): {details}"
        name = code.name if code is not None else "ERROR"
        return f"{where}: {name}: {details}"
    return f"{where}: {type(err).__name__}: {err}"


def subscribe_request(sub: SubscriptionConfig, target: str | None) -> Any:
    mode = _STREAM_MODE[sub.stream_mode]
    subs = [
        pb.Subscription(
            path=to_path(p),
            mode=mode,
            sample_interval=int(sub.sample_interval_s * 1e9) if mode == pb.SAMPLE else 0,
            suppress_redundant=sub.suppress_redundant,
            heartbeat_interval=int(sub.heartbeat_interval_s * 1e9),
        )
        for p in sub.paths
    ]
    sl = pb.SubscriptionList(
        prefix=pb.Path(target=sub.target or target or ""),
        subscription=subs,
        mode=_LIST_MODE[sub.mode],
        encoding=_ENCODING[sub.encoding],
        updates_only=sub.updates_only,
    )
    return pb.SubscribeRequest(subscribe=sl)


def backoff_delay(attempt: int, initial: float, cap: float, rng: random.Random) -> float:
    """Capped exponential backoff with jitter: a delay in [d/2, d], d = min(cap, initial*2^n)."""
    d = min(cap, initial * (2 ** min(attempt, 30)))
    return d / 2 + rng.random() * d / 2


# --- one target ----------------------------------------------------------------------------------


class _StreamEnded(Exception):
    pass


class _Session:
    """One target's subscription, re-subscribed forever; a task on the collector's event loop."""

    def __init__(self, owner: Collector, t: TargetConfig, seed: int) -> None:
        self.owner = owner
        self.t = t
        self.sub = t.subscription or SubscriptionConfig()
        self.health = TargetHealth(t.name, t.address)
        self.decoder = owner.decoder  # shared: one batch of every target's samples
        self.rng = random.Random(seed)
        self.last_rate = 0.0
        self.finished = threading.Event()
        self.task: asyncio.Task[None] | None = None
        self._errors_logged: set[str] = set()
        self.source = f"{t.name}:{t.address.rpartition(':')[2]}"

    async def _requests(self, done: asyncio.Event) -> AsyncIterator[Any]:
        yield subscribe_request(self.sub, self.t.target)
        if self.sub.mode == "once":
            return
        while not done.is_set():
            if self.sub.mode != "poll":
                await done.wait()
                return
            try:
                await asyncio.wait_for(done.wait(), self.sub.poll_interval_s)
                return
            except TimeoutError:
                pass
            if self.health.synced:
                yield pb.SubscribeRequest(poll=pb.Poll())

    def flush(self) -> None:
        """Hand what is decoded so far (every target's) to the sink."""
        self.owner.flush()

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self.flush()
            self.health.state = "done" if self.health.state == "done" else "stopped"
            if self.owner.metrics:
                self.owner.metrics.up.labels(target=self.health.name).set(0)
            self.finished.set()

    async def _run(self) -> None:
        attempt = 0
        h = self.health
        o = self.owner
        cfg = o.config
        metrics = o.metrics
        md: tuple[tuple[str, str], ...] | None = None
        if self.t.username is not None:
            md = (("username", self.t.username), ("password", self.t.password or ""))
        while True:
            h.state = "connecting"
            h.synced = False
            done = asyncio.Event()
            got_any = False
            try:
                channel = await make_aio_channel(self.t)
                try:
                    call = channel.stream_stream(
                        "/gnmi.gNMI/Subscribe",
                        request_serializer=pb.SubscribeRequest.SerializeToString,
                        response_deserializer=pb.SubscribeResponse.FromString,
                    )(self._requests(done), metadata=md)
                    decoder = self.decoder
                    async for resp in call:
                        now = time.monotonic()
                        if not got_any:
                            got_any = True
                            attempt = 0
                            h.state = "up"
                            h.subscribes += 1
                            h.subscribed_mono = now
                            h.last_error = ""
                            if metrics:
                                metrics.up.labels(target=h.name).set(1)
                            log.info("gNMI target %s: subscribed", h.name)
                        kind = resp.WhichOneof("response")
                        if kind == "update":
                            n = decoder.add_notification(h.name, resp.update, time.time_ns())
                            h.updates += n
                            h.notifications += 1
                            h.last_update_mono = now
                            if metrics:
                                metrics.updates.labels(target=h.name).inc(n)
                            if o.event_sink is not None:
                                o._emit_events(
                                    o.make_events(
                                        self.source, self.sub.name, resp.update, time.time_ns()
                                    )
                                )
                        elif kind == "sync_response":
                            h.synced = True
                            self.flush()
                        elif kind == "error":
                            self._report(f"gNMI target {h.name}: error response: {resp.error}")
                        if (
                            decoder.pending() >= cfg.batch_updates
                            or now - o.last_flush >= cfg.batch_interval_s
                        ):
                            self.flush()
                        if now - self.last_rate >= cfg.batch_interval_s:
                            self.last_rate = now
                            h.tick_rate(now)
                            if metrics:
                                metrics.rate.labels(target=h.name).set(h.rate)
                    self.flush()
                    if self.sub.mode == "once":
                        h.state = "done"
                        return
                    raise _StreamEnded("the target ended the stream")
                finally:
                    done.set()
                    await channel.close(grace=None)
            except (grpc.RpcError, OSError, _StreamEnded, ValueError) as e:
                self.flush()
                self._report(explain(self.t, e))
            except ConfigError as e:
                self._report(str(e))
                return
            if metrics:
                metrics.up.labels(target=h.name).set(0)
                metrics.reconnects.labels(target=h.name).inc()
            h.reconnects += 1
            delay = backoff_delay(attempt, cfg.backoff_initial_s, cfg.backoff_max_s, self.rng)
            attempt += 1
            h.state = "backoff"
            await asyncio.sleep(delay)

    def _report(self, msg: str) -> None:
        self.health.last_error = msg
        self.owner.stats.inc("gnmi_stream_errors")
        key = msg.split(": ", 2)[1] if msg.count(": ") >= 2 else msg
        if key not in self._errors_logged and len(self._errors_logged) < 100:
            self._errors_logged.add(key)
            log.warning("%s", msg)


# --- many targets --------------------------------------------------------------------------------


class Collector:
    """Subscribes to many gNMI targets at once and hands decoded batches to ``sink``.

    All streams run on one asyncio event loop (grpc.aio) in a background thread: one thread
    decodes everything, so nothing contends for the interpreter. ``sink`` receives
    SAMPLE_SCHEMA frames on that thread; ``event_sink``, if given, receives gnmic "event"
    objects of every notification (file output). ``lldp`` collects the neighbours the targets
    report.

    >>> c = Collector(GnmiConfig(), sink=lambda df: None)
    >>> c.health()
    {}
    """

    def __init__(
        self,
        config: GnmiConfig,
        sink: SendFrame,
        targets: list[TargetConfig] | None = None,
        *,
        stats: Stats | None = None,
        mapper: GnmiMapper | None = None,
        event_sink: EventSink | None = None,
        registry: Any = None,
    ) -> None:
        self.config = config
        self.sink = sink
        self.event_sink = event_sink
        # a notification -> the gnmic events ``event_sink`` gets (the configuration
        # collector's flatten JSON values: collector/gnmi/config_events.py)
        self.make_events: Callable[[str, str, Any, int], list[dict[str, Any]]] = notification_events
        self.stats = stats or Stats()
        self.mapper = mapper
        self.lldp = LldpTable()
        self.decoder = NotificationDecoder(self.stats, mapper, self.lldp)
        self.last_flush = time.monotonic()
        self.metrics = _Metrics(registry) if registry is not None else None
        if registry is not None:
            # what the decoder counted and skipped (non-numeric values, counters scaled past 64
            # bits, updates with no interface, deletes, unknown paths), read at each scrape
            from rocewatch.core.metrics import ReadOnScrape, skipped_readings

            stats = self.stats
            registry.register(ReadOnScrape(lambda: skipped_readings(Stats.merged(stats))))
        self._sessions: dict[str, _Session] = {}
        self._seed = config.seed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._flusher: asyncio.Task[None] | None = None
        for t in targets if targets is not None else config.all_targets():
            self.add_target(t)

    def add_target(self, t: TargetConfig, start: bool = False) -> None:
        t = self.config.resolved(t)
        t.validate()
        if t.name in self._sessions:
            raise ConfigError(f"gnmi target {t.name}: already collected")
        s = _Session(self, t, seed=hash((self._seed, t.name)) & 0xFFFFFFFF)
        self._sessions[t.name] = s
        if start or self._loop is not None:
            self._spawn(s)

    def remove_target(self, name: str) -> None:
        s = self._sessions.pop(name, None)
        if s is not None and self._loop is not None and s.task is not None:
            self._loop.call_soon_threadsafe(s.task.cancel)
            s.finished.wait(5)

    def targets(self) -> list[str]:
        return list(self._sessions)

    def _spawn(self, s: _Session) -> None:
        if self._loop is None:
            self.start()
            return
        loop = self._loop

        def create() -> None:
            s.task = loop.create_task(s.run())

        loop.call_soon_threadsafe(create)

    def start(self) -> None:
        if self._loop is not None:
            return
        loop = asyncio.new_event_loop()
        self._loop = loop
        ready = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(loop)
            for s in self._sessions.values():
                s.task = loop.create_task(s.run())
            self._flusher = loop.create_task(self._flush_loop())
            loop.call_soon(ready.set)
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=main, name="gnmi-collector", daemon=True)
        self._thread.start()
        ready.wait(10)

    async def _flush_loop(self) -> None:
        iv = self.config.batch_interval_s
        while True:
            await asyncio.sleep(iv)
            if time.monotonic() - self.last_flush >= iv:
                self.flush()

    def flush(self) -> None:
        """Hand every target's samples decoded so far to the sink, as one frame (on the
        collector's thread, or once it has stopped)."""
        self.last_flush = time.monotonic()
        if self.decoder.pending():
            self._emit(self.decoder.take())

    def stop(self, timeout: float = 5.0, flush_timeout: float = 120.0) -> bool:
        """End every stream and hand what was received to the outputs before returning.

        Each session's last batch goes to ``sink`` as its stream ends (events went to
        ``event_sink`` as they came), and this waits for that, up to ``flush_timeout`` (a slow
        output, a loaded machine), then up to ``timeout`` for the event loop to close. Once it
        returns True nothing calls the outputs again: the caller may close them. False (logged)
        when the collector did not finish in time.
        """
        loop = self._loop
        thread = self._thread
        if loop is None or thread is None:
            return True
        flushed = threading.Event()

        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            # each session flushes its decoder as its task ends (``_Session.run``)
            await asyncio.gather(*tasks, return_exceptions=True)
            flushed.set()
            loop.stop()

        if loop.is_running():
            asyncio.run_coroutine_threadsafe(shutdown(), loop)
            done = flushed.wait(flush_timeout)
        else:
            done = True  # the loop has ended on its own: its sessions flushed as they ended
        thread.join(timeout if done else 0.0)
        self._loop = None
        self._thread = None
        if not done or thread.is_alive():
            pending = self.decoder.pending()
            log.error(
                "gNMI collector did not stop within %.0f s: %d received samples may not have "
                "reached the outputs",
                flush_timeout + timeout,
                pending,
            )
            return False
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for every session to end (ONCE subscriptions); True if all ended."""
        end = None if timeout is None else time.monotonic() + timeout
        for s in self._sessions.values():
            left = None if end is None else max(0.0, end - time.monotonic())
            s.finished.wait(left)
        return all(s.finished.is_set() for s in self._sessions.values())

    def health(self) -> dict[str, TargetHealth]:
        now = time.monotonic()
        for s in self._sessions.values():
            s.health.tick_rate(now)
        return {n: s.health for n, s in self._sessions.items()}

    def export_unknown_paths(self) -> None:
        if self.metrics is None:
            return
        for path, n in self.stats.detail.get("gnmi_unknown_paths", {}).items():
            self.metrics.unknown.labels(path=path).set(n)

    def _emit(self, df: pl.DataFrame) -> None:
        if df.height:
            self.sink(df)

    def _emit_events(self, events: list[dict[str, Any]]) -> None:
        if self.event_sink is not None and events:
            self.event_sink(events)

    def __enter__(self) -> Collector:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
