"""Self-metrics on a Prometheus /metrics endpoint for long-running processes."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class ServiceMetrics:
    def __init__(self, port: int, addr: str = "0.0.0.0") -> None:
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
        self.firing = Gauge("rocewatch_alerts_firing", "alerts firing now", registry=r)
        self.lag_total = Gauge(
            "rocewatch_consumer_lag_records_total",
            "records behind the log end, all assigned partitions together",
            registry=r,
        )
        self._samples_seen = 0
        self._server, _thread = start_http_server(port, addr=addr, registry=r)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def update(self, svc: Any) -> None:
        p = svc.pipeline
        if p.samples_in > self._samples_seen:
            self.samples.inc(p.samples_in - self._samples_seen)
            self._samples_seen = p.samples_in
        for k, v in svc.stats.counts.items():
            self.skipped.labels(reason=k).set(v)
        self.detector_s.set(p.detector_seconds)
        self.firing.set(len(p.lifecycle.firing))
        from kafka.structs import TopicPartition

        total = 0
        for (_topic, part), off in svc.offsets.items():
            # the log end as of the last fetch response: no request to the broker here
            hw = svc.consumer.highwater(TopicPartition(_topic, part))
            if hw is not None:
                self.lag.labels(partition=str(part)).set(max(0, hw - off))
                total += max(0, hw - off)
        self.lag_total.set(total)
