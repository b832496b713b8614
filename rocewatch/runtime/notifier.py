"""Wiring for processes: the outbox's database, the sinks, and the long-running sender."""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

from rocewatch.config import Config
from rocewatch.core.errors import ConfigError
from rocewatch.notify.dispatcher import Dispatcher, build_notifiers
from storage.outbox import Outbox
from storage.store import Store

log = logging.getLogger(__name__)


def outbox_url(cfg: Config) -> str:
    """Where the outbox lives: notify.outbox_url, else storage.url, else state_dir/outbox.db."""
    if cfg.notify.outbox_url:
        return cfg.notify.outbox_url
    if cfg.storage_url:
        return cfg.storage_url
    return f"sqlite:///{Path(cfg.state_dir) / 'outbox.db'}"


def open_dispatcher(cfg: Config, store: Store | None = None) -> Dispatcher | None:
    """A dispatcher for the configured sinks (None when none is configured).

    ``store``: an open Store on the storage database, reused when the outbox lives there.
    """
    if not cfg.notify.enabled:
        return None
    url = outbox_url(cfg)
    if store is None or url != cfg.storage_url:
        if url.startswith("sqlite:///"):
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        store = Store(url)
        store.create_schema()
    sinks = build_notifiers(cfg.notify)
    log.info("notify: delivering to %s", ", ".join(s.name for s in sinks))
    n = cfg.notify
    # each notification links its incident page (generatorURL) when the API serves pages
    outbox = Outbox(store, incident_url=cfg.api.incident_url())
    return Dispatcher(outbox, sinks, n.retry, poll_s=n.poll_s, seed=n.seed)


def run_notify(cfg: Config, max_idle_s: float = 0.0) -> int:
    """`rocewatch notify`: deliver the outbox until stopped (or idle and empty for max_idle_s).

    Serves /metrics on ``metrics_port`` when it is set."""
    d = open_dispatcher(cfg)
    if d is None:
        raise ConfigError("notify: no webhooks or alertmanagers configured")
    metrics: Any = None
    if cfg.metrics_port:
        from rocewatch.core.metrics import ServiceMetrics

        metrics = ServiceMetrics(cfg.metrics_port)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    idle_since = time.monotonic()
    try:
        while not stop.is_set():
            d.run_once()
            by_sink = d.outbox.depth()
            depth = sum(by_sink.values())
            if metrics is not None:
                metrics.update_notify(d, by_sink)
            now = time.monotonic()
            if depth:
                idle_since = now
            elif max_idle_s and now - idle_since >= max_idle_s:
                break
            stop.wait(cfg.notify.poll_s)
    finally:
        d.outbox.store.close()
        if metrics is not None:
            metrics.close()
    log.info("notify: stopped; %s", d.stats())
    return 0
