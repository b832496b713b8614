"""Notification settings and the contract every notifier meets.

A notifier turns a batch of alert objects into one request to one receiver. It raises
``RetryableError`` when trying again later may work (connection refused, timeout, 5xx, 429) and
``PermanentError`` when the receiver refused the request for good (other 4xx).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from rocewatch.core.errors import ConfigError

SIGNATURE_HEADER = "X-Rocewatch-Signature"
TIMESTAMP_HEADER = "X-Rocewatch-Timestamp"
DELIVERY_HEADER = "X-Rocewatch-Delivery"


@dataclass(frozen=True)
class TlsConfig:
    """TLS for https receivers: a private CA and/or a client certificate."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure_skip_verify: bool = False

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        if self.insecure_skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx


@dataclass(frozen=True)
class WebhookConfig:
    """One webhook receiver; the payload is Alertmanager's version 4 webhook body."""

    name: str = ""
    url: str = ""
    secret: str | None = field(default=None, repr=False)  # HMAC-SHA256 key; never logged
    timeout_s: float = 10.0
    max_alerts: int = 100  # per request (Alertmanager's max_alerts)
    receiver: str = "rocewatch"  # the payload's "receiver"
    external_url: str = ""  # the payload's "externalURL"
    tls: TlsConfig = field(default_factory=TlsConfig)

    def validate(self) -> None:
        _check_common("webhooks", self.name, self.url, self.timeout_s, self.max_alerts)
        if not self.secret:
            raise ConfigError(
                f"notify.webhooks.{self.name}.secret is required (signs every request); "
                "give it as ${ENV_VAR}"
            )


@dataclass(frozen=True)
class AlertmanagerConfig:
    """One Alertmanager (its base URL); alerts go to POST /api/v2/alerts."""

    name: str = ""
    url: str = ""
    timeout_s: float = 10.0
    max_alerts: int = 500
    # Alertmanager resolves a firing alert not re-sent within its resolve_timeout (5 min by
    # default): firing alerts are re-sent this often until rocewatch resolves them.
    refresh_s: float = 60.0
    tls: TlsConfig = field(default_factory=TlsConfig)

    def validate(self) -> None:
        _check_common("alertmanagers", self.name, self.url, self.timeout_s, self.max_alerts)
        if self.refresh_s <= 0:
            raise ConfigError(f"notify.alertmanagers.{self.name}.refresh_s must be positive")


@dataclass(frozen=True)
class RetryConfig:
    """Capped exponential backoff: initial_s * multiplier**(attempt-1), at most max_s."""

    initial_s: float = 1.0
    max_s: float = 300.0
    multiplier: float = 2.0
    jitter: float = 0.1  # +- this fraction, from the seeded generator

    def validate(self) -> None:
        if self.initial_s <= 0 or self.max_s < self.initial_s or self.multiplier < 1:
            raise ConfigError("notify.retry: need 0 < initial_s <= max_s and multiplier >= 1")
        if not 0 <= self.jitter < 1:
            raise ConfigError("notify.retry.jitter must be in [0, 1)")

    def delay(self, attempts: int, rand: float = 0.5) -> float:
        """Seconds before the next try after ``attempts`` failures; ``rand`` in [0, 1)."""
        base = min(self.max_s, self.initial_s * self.multiplier ** max(0, attempts - 1))
        return base * (1 + self.jitter * (2 * rand - 1))


@dataclass(frozen=True)
class NotifyConfig:
    # notify.<key> -> that kind's sinks (rocewatch/notify/registry.py: webhooks, alertmanagers)
    sinks: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    retry: RetryConfig = field(default_factory=RetryConfig)
    poll_s: float = 0.5  # how often the dispatcher looks for due events
    drain_timeout_s: float = 10.0  # how long replay waits at exit for deliveries
    # the outbox's database when storage.url is not set (an SQLite file under state_dir)
    outbox_url: str | None = None
    seed: int = 0

    @property
    def webhooks(self) -> tuple[WebhookConfig, ...]:
        return self.sinks.get("webhooks", ())

    @property
    def alertmanagers(self) -> tuple[AlertmanagerConfig, ...]:
        return self.sinks.get("alertmanagers", ())

    @property
    def enabled(self) -> bool:
        return any(self.sinks.values())

    def validate(self) -> None:
        names = [s.name for kind in self.sinks.values() for s in kind]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"notify: sink names must be unique: {', '.join(dup)}")
        if self.poll_s <= 0 or self.drain_timeout_s < 0:
            raise ConfigError("notify: poll_s must be positive, drain_timeout_s not negative")


def _check_common(kind: str, name: str, url: str, timeout_s: float, max_alerts: int) -> None:
    if not name:
        raise ConfigError(f"notify.{kind}: every entry needs a name")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"notify.{kind}.{name}.url: need an http(s) URL, got {redact_url(url)}")
    if timeout_s <= 0 or max_alerts < 1:
        raise ConfigError(f"notify.{kind}.{name}: timeout_s > 0 and max_alerts >= 1 required")


def redact_url(url: str) -> str:
    """The URL without user info or query (either may carry a token): safe to log."""
    try:
        p = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    host = p.hostname or ""
    if p.port:
        host = f"{host}:{p.port}"
    return urlunsplit((p.scheme, host, p.path, "", ""))


class Notifier(Protocol):
    """A notification receiver (one per configured entry)."""

    name: str
    max_alerts: int
    timeout_s: float
    refresh_s: float | None  # re-send firing events this often (None: never)
    # drop a firing event from a batch that also carries its resolution (a receiver that keeps
    # state, like Alertmanager, only needs the latter)
    collapse_resolved: bool

    def batches(self, alerts: list[dict[str, Any]]) -> list[list[int]]:
        """Split alerts (by index) into the requests this notifier makes, each sent on its own."""
        ...

    def send(self, alerts: list[dict[str, Any]]) -> None:
        """Deliver one request's alerts or raise RetryableError / PermanentError."""
        ...
