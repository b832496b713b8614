"""Self-metrics on a Prometheus /metrics endpoint for long-running processes.

The detector service (`rocewatch detect`) and the notification sender (`rocewatch notify`)
serve them on ``metrics_port``. What they export:

* ingest: ``rocewatch_samples_ingested_total`` (rate() is the ingest rate),
  ``rocewatch_checkpoint_rejected_total`` (state files and state-topic records refused),
  ``rocewatch_state_mac_rejected_total`` (of those, state-topic records without a valid MAC),
  ``rocewatch_consumer_lag_records{partition}``, ``rocewatch_input_skipped{reason}``
  (malformed or skipped input, counted by reason);
* detection: ``rocewatch_detector_batch_seconds`` (histogram of detector CPU time per consumed
  batch), ``rocewatch_detector_cpu_seconds``, ``rocewatch_alerts_firing``;
* delivery: ``rocewatch_notify_sent_total{sink}``, ``rocewatch_notify_failures_total{sink}``
  (failed requests, e.g. webhook failures), ``rocewatch_notify_dead_total{sink}`` (events a
  receiver refused for good), ``rocewatch_notify_outbox_depth{sink}`` (events waiting).

Each detect instance reports the lag of the telemetry partitions it aggregates and
``rocewatch_steps_lag_records`` (its detect stage's). The sink (in ``detect``'s process by
default, on the same port, or ``rocewatch sink``) serves ``rocewatch_sink_written_rows{kind}``,
``rocewatch_sink_held_events``, ``rocewatch_sink_storage_retries``,
``rocewatch_sink_lag_records{topic,partition}`` and, with notify, the delivery metrics.

The collectors that are not Kafka consumers serve theirs through :class:`ReadingsEndpoint`,
read at scrape time: ``rocewatch agent`` (``rocewatch_agent_*``: snapshots taken and sent, spool
depth in snapshots and bytes, snapshots dropped from a full spool, send failures) and
``rocewatch int-listen`` (``rocewatch_int_*``: datagrams, reports, samples emitted), both with
``rocewatch_input_skipped{reason}``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from rocewatch.core.stats import Stats

BATCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServiceMetrics:
    def __init__(self, port: int, addr: str = "0.0.0.0", depth_every_s: float = 2.0) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.samples = Counter("rocewatch_samples_ingested_total", "samples ingested", registry=r)
        self.skipped = Gauge(
            "rocewatch_input_skipped",
            "inputs counted and skipped, by reason",
            ["reason"],
            registry=r,
        )
        self.lag = Gauge(
            "rocewatch_consumer_lag_records",
            "records behind the log end",
            ["partition"],
            registry=r,
        )
        self.detector_s = Gauge(
            "rocewatch_detector_cpu_seconds", "CPU seconds in detectors", registry=r
        )
        self.batch_s = Histogram(
            "rocewatch_detector_batch_seconds",
            "detector CPU seconds per consumed batch",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.firing = Gauge("rocewatch_alerts_firing", "alerts firing now", registry=r)
        # state files and state-topic records refused (rocewatch.core.checkpoint): each one is a
        # restart from committed offsets, and a forged one is someone writing to the topic
        self.ckpt_rejected = Counter(
            "rocewatch_checkpoint_rejected_total",
            "checkpoints (state file, state-topic records) refused as damaged or foreign",
            registry=r,
        )
        self._ckpt_seen = 0
        # of those, state-topic records whose MAC is missing or wrong (rocewatch.bus.signing):
        # a forgery, or instances that do not share a key
        self.mac_rejected = Counter(
            "rocewatch_state_mac_rejected_total",
            "state-topic records refused for a missing or wrong MAC",
            registry=r,
        )
        self._mac_seen = 0
        self.sent = Counter(
            "rocewatch_notify_sent_total", "alert events delivered", ["sink"], registry=r
        )
        self.failures = Counter(
            "rocewatch_notify_failures_total",
            "notification requests that failed (retried later unless refused)",
            ["sink"],
            registry=r,
        )
        self.dead = Counter(
            "rocewatch_notify_dead_total",
            "alert events a receiver refused for good",
            ["sink"],
            registry=r,
        )
        self.depth = Gauge(
            "rocewatch_notify_outbox_depth",
            "alert events waiting in the outbox",
            ["sink"],
            registry=r,
        )
        self.lag_total = Gauge(
            "rocewatch_consumer_lag_records_total",
            "records behind the log end, all assigned partitions together",
            registry=r,
        )
        # rocewatch sink: rows written (alerts, actions, rollups), events held while the
        # database is away, lag per topic and partition
        self.sink_written = Gauge(
            "rocewatch_sink_written_rows", "rows the sink wrote, by kind", ["kind"], registry=r
        )
        self.sink_held = Gauge(
            "rocewatch_sink_held_events",
            "events read and not yet written (the database is away while this stays up)",
            registry=r,
        )
        self.sink_retries = Gauge(
            "rocewatch_sink_storage_retries",
            "writes to the database that failed and were retried later",
            registry=r,
        )
        self.sink_lag = Gauge(
            "rocewatch_sink_lag_records",
            "records the sink has not read, by topic and partition",
            ["topic", "partition"],
            registry=r,
        )
        # scale-out only: how far the detect stage is behind the steps topic (-1: another
        # instance runs it)
        self.steps_lag = Gauge(
            "rocewatch_steps_lag_records",
            "scale-out: steps messages the detect stage has not read (-1: not this instance)",
            registry=r,
        )
        self._samples_seen = 0
        self._detector_seen = 0.0
        self._notify_seen: dict[tuple[str, str], int] = {}
        self._depth_every_s = depth_every_s
        self._depth_at = 0.0
        self.server, self._thread = start_http_server(port, addr=addr, registry=r)
        self.port = int(self.server.server_port)

    def _count(self, samples: int, *stats: Stats) -> None:
        """Samples ingested so far (a running total) and the skipped-input counts."""
        if samples > self._samples_seen:
            self.samples.inc(samples - self._samples_seen)
            self._samples_seen = samples
        merged = Stats.merged(*stats)
        for k, v in merged.counts.items():
            self.skipped.labels(reason=k).set(v)
        rejected = merged.counts.get("checkpoint_rejected", 0)
        if rejected > self._ckpt_seen:
            self.ckpt_rejected.inc(rejected - self._ckpt_seen)
            self._ckpt_seen = rejected
        mac = merged.counts.get("state_mac_rejected", 0)
        if mac > self._mac_seen:
            self.mac_rejected.inc(mac - self._mac_seen)
            self._mac_seen = mac

    def update_scaleout(self, svc: Any) -> None:
        """Refresh from a DetectService, in its aggregate stage's thread: lag on the
        telemetry partitions this instance aggregates (partitions it no longer owns drop out)
        and the counts of both stages (``update_detect_stage`` does the rest)."""
        from kafka.structs import TopicPartition

        agg, det = svc.agg, svc.det
        self._count(agg.samples, agg.stats, *det.all_stats())
        self.lag.clear()
        total = 0
        topic = svc.cfg.kafka.topics.telemetry
        for p, part in list(agg.parts.items()):
            hw = agg.consumer.highwater(TopicPartition(topic, p))
            if hw is not None and part.offset is not None:
                self.lag.labels(partition=str(p)).set(max(0, hw - part.offset))
                total += max(0, hw - part.offset)
        self.lag_total.set(total)

    def update_detect_stage(self, stage: Any) -> None:
        """Refresh from a scale-out DetectStage, in its own thread: the lag on the steps
        partitions (fabric domains) this instance evaluates and their detectors' figures,
        summed over them (-1 and 0 while it evaluates none)."""
        held = [d for d in stage.shards if d.active and d.state is not None]
        if not held:
            self.steps_lag.set(-1)
            self.firing.set(0)
            return
        lag = 0
        seconds = 0.0
        firing = 0
        for det in held:
            hw = det.consumer.highwater(det.tp)
            lag += max(0, hw - det.state.offset) if hw is not None else 0
            seconds += det.state.pipeline.detector_seconds
            firing += len(det.state.pipeline.lifecycle.firing)
        self.steps_lag.set(lag)
        spent = seconds - self._detector_seen
        if spent > 0:
            self.batch_s.observe(spent)
        self._detector_seen = seconds
        self.detector_s.set(seconds)
        self.firing.set(firing)

    def update_sink(self, sink: Any) -> None:
        """Refresh from an EventSink: rows written by kind, events held while the database is
        away, its lag per topic and partition, skipped input (and delivery, with notify)."""
        for kind in ("alerts", "actions", "rollups"):
            self.sink_written.labels(kind=kind).set(getattr(sink, f"{kind}_written"))
        held = sink.pending
        self.sink_held.set(len(held.alerts) + len(held.actions) + len(held.rollups))
        self.sink_retries.set(sink.storage_retries)
        self._count(0, sink.stats)
        self.sink_lag.clear()
        for tp in sink.consumer.assignment():
            hw = sink.consumer.highwater(tp)
            pos = sink.positions.get(tp)
            if hw is not None and pos is not None:
                lag = max(0, hw - pos)
                self.sink_lag.labels(topic=tp.topic, partition=str(tp.partition)).set(lag)
        if sink.notifier is not None:
            self.update_notify(sink.notifier)

    def update_notify(self, d: Any, depth: dict[str, int] | None = None) -> None:
        """Refresh from a notify Dispatcher; the outbox depth is read at most every few
        seconds (it is a query) unless given."""
        for kind, counts, metric in (
            ("sent", d.sent, self.sent),
            ("failures", d.failures, self.failures),
            ("dead", d.dead, self.dead),
        ):
            for sink, n in counts.items():
                seen = self._notify_seen.get((kind, sink), 0)
                if n > seen:
                    metric.labels(sink=sink).inc(n - seen)
                    self._notify_seen[(kind, sink)] = n
        now = time.monotonic()
        if depth is None and now - self._depth_at >= self._depth_every_s:
            depth = d.outbox.depth()
        if depth is not None:
            self._depth_at = now
            for sink in d.sink_names:
                self.depth.labels(sink=sink).set(depth.get(sink, 0))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# A metric read at scrape time: (name, "counter" | "gauge", help, labels, value). Counter names
# end in ``_total``.
Reading = tuple[str, str, str, dict[str, str], float]


class ReadOnScrape:
    """A prometheus collector that asks ``read`` for the current numbers on every scrape, so a
    process keeps plain counters and pays nothing between scrapes."""

    def __init__(self, read: Callable[[], Iterable[Reading]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        families: dict[str, Any] = {}
        for name, kind, doc, labels, value in self.read():
            fam = families.get(name)
            if fam is None:
                if kind == "counter":
                    fam = CounterMetricFamily(name.removesuffix("_total"), doc, labels=list(labels))
                else:
                    fam = GaugeMetricFamily(name, doc, labels=list(labels))
                families[name] = fam
            fam.add_metric(list(labels.values()), value)
        yield from families.values()


def skipped_readings(stats: Stats) -> list[Reading]:
    """A Stats object's skip counters, as ``rocewatch_input_skipped{reason}`` (the name the
    detector service uses)."""
    doc = "inputs counted and skipped, by reason"
    return [
        ("rocewatch_input_skipped", "gauge", doc, {"reason": k}, float(v))
        for k, v in sorted(stats.counts.items())
    ]


class ReadingsEndpoint:
    """/metrics for a collector process (agent, int-listen): ``read`` is called per scrape."""

    def __init__(
        self, port: int, read: Callable[[], Iterable[Reading]], addr: str = "0.0.0.0"
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(ReadOnScrape(read))  # type: ignore[arg-type]
        self.server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        self.port = int(self.server.server_port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
