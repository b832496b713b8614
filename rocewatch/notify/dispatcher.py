"""Moves alert events from the outbox to the sinks: claim, send, record, back off.

Sinks are independent: one receiver being down delays only its own events. A failed request's
events are retried after a capped exponential backoff (or after the receiver's ``Retry-After``,
up to the cap); a refused one (4xx) is marked dead and counted, never retried.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from rocewatch.core.errors import PermanentError, RetryableError
from rocewatch.core.model import Alert
from rocewatch.notify.base import Notifier, NotifyConfig, RetryConfig
from rocewatch.notify.http import RetryLater
from rocewatch.notify.registry import SINKS
from storage.outbox import Outbox, OutboxItem

log = logging.getLogger(__name__)


def build_notifiers(cfg: NotifyConfig) -> list[Notifier]:
    """One notifier per configured sink, of every kind the registry has."""
    return [entry.notifier(c) for key, entry in SINKS.items() for c in cfg.sinks.get(key, ())]


class Dispatcher:
    """Delivers queued events; ``run_once`` is one pass, ``start``/``stop`` a background thread."""

    def __init__(
        self,
        outbox: Outbox,
        sinks: Sequence[Notifier],
        retry: RetryConfig | None = None,
        poll_s: float = 0.5,
        seed: int = 0,
    ) -> None:
        self.outbox = outbox
        self.sinks = list(sinks)
        self.retry = retry or RetryConfig()
        self.poll_s = poll_s
        self.rand = random.Random(seed)
        self.sent: Counter[str] = Counter()  # events delivered, per sink
        self.failures: Counter[str] = Counter()  # failed requests, per sink
        self.dead: Counter[str] = Counter()  # events refused for good, per sink
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def sink_names(self) -> list[str]:
        return [s.name for s in self.sinks]

    def enqueue(self, alerts: Sequence[Alert]) -> int:
        """Queue alert events for every sink (durably) and wake the sender."""
        n = self.outbox.enqueue(alerts, self.sink_names)
        if n:
            self._wake.set()
        return n

    def run_once(self) -> int:
        """One pass over every sink's due events; returns the events delivered."""
        done = 0
        for sink in self.sinks:
            try:
                done += self._pass(sink)
            except RetryableError as e:  # the outbox's own database
                log.warning("notify: %s: outbox unavailable: %s", sink.name, e)
        return done

    def _pass(self, sink: Notifier) -> int:
        done = 0
        while not self._stop.is_set():
            lease = sink.timeout_s * 2 + 5
            items = self.outbox.claim(sink.name, max(sink.max_alerts, 1) * 4, lease)
            if not items:
                return done
            if sink.collapse_resolved:
                items = self._collapse(items)
            alerts = [i.alert for i in items]
            handled: set[int] = set()
            for idx in sink.batches(alerts):
                batch = [items[i] for i in idx]
                try:
                    sink.send([alerts[i] for i in idx])
                except RetryableError as e:
                    self.failures[sink.name] += 1
                    # the rest of this claim waits too: the receiver is down
                    pending = [it for it in items if it.id not in handled]
                    attempts = min(it.attempts for it in batch) + 1
                    delay = self.retry.delay(attempts, self.rand.random())
                    if isinstance(e, RetryLater):
                        # the receiver said when: not sooner (it would refuse again), but no
                        # later than the backoff's cap (a day's Retry-After must not park events)
                        delay = max(delay, min(e.retry_after_s, self.retry.max_s))
                    self.outbox.failed(pending, str(e), delay)
                    log.warning(
                        "notify: %s: %d events not delivered (%s); retry in %.1f s",
                        sink.name,
                        len(pending),
                        e,
                        delay,
                    )
                    return done
                except PermanentError as e:
                    self.failures[sink.name] += 1
                    self.dead[sink.name] += len(batch)
                    self.outbox.dead(batch, str(e))
                    log.error("notify: %s refused %d events: %s", sink.name, len(batch), e)
                else:
                    self.outbox.delivered(batch, sink.refresh_s)
                    fresh = sum(1 for it in batch if not it.refresh)
                    self.sent[sink.name] += fresh
                    done += fresh
                handled.update(it.id for it in batch)
        return done

    def _collapse(self, items: list[OutboxItem]) -> list[OutboxItem]:
        """Drop firing events whose resolution is in the same claim: mark them delivered."""
        resolved = {
            (i.alert["fingerprint"], i.alert["startsAt"])
            for i in items
            if i.alert["status"] == "resolved"
        }
        keep: list[OutboxItem] = []
        drop: list[OutboxItem] = []
        for i in items:
            key = (i.alert["fingerprint"], i.alert["startsAt"])
            (drop if i.alert["status"] == "firing" and key in resolved else keep).append(i)
        if drop:
            self.outbox.delivered(drop, None)
        return keep

    def depth(self) -> int:
        return sum(self.outbox.depth().values())

    def drain(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> bool:
        """Deliver until nothing is pending or ``timeout_s`` passed; True when all went out.

        Called after ``stop`` (a replay's last events, enqueued as the stream ended), it still
        delivers: the stop flag only ends the background sender's loop."""
        if self._thread is None:
            self._stop.clear()
        end = clock() + timeout_s
        while True:
            self.run_once()
            if self.depth() == 0:
                return True
            if clock() >= end:
                return False
            self._stop.wait(min(self.poll_s, max(0.0, end - clock())))

    # --- background thread -----------------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="rocewatch-notify", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # never let the sender die silently; the outbox keeps the events
                log.exception("notify: dispatcher pass failed")
            self._wake.wait(self.poll_s)
            self._wake.clear()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None

    def stats(self) -> dict[str, Any]:
        return {
            "sent": dict(self.sent),
            "failures": dict(self.failures),
            "dead": dict(self.dead),
        }
