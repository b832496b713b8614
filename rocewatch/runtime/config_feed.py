"""The configuration topic (``kafka.topics.config``) read by a domain's detect stage: the RoCE
configuration records the agents (``nic_config.jsonl`` snapshots) and the gNMI collector
(``switch_config.jsonl`` events, as gnmic writes them) publish, in CONTRACTS.md section 5's
layout, each handed to the pipeline of its fabric domain (``Pipeline.ingest_config``), which
applies it on telemetry time as the steps close (rocewatch/roce/watch.py).

The topic is read whole, without a consumer group: every domain's stage needs every record of
its devices, whichever instance runs it. Where a stage has read to is part of its state record
(``DetectState.config_offsets``), taken with the pipeline's state (the records read but not yet
applied are in it): a restart from the state reads on from there, so a record is neither lost
nor applied twice. A record that is not JSON, or neither a NIC snapshot nor a gnmic event, is
counted (``config_record_skipped``) and skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import orjson
from kafka import KafkaConsumer
from kafka.errors import KafkaError
from kafka.structs import TopicPartition

from rocewatch.bus.config import KafkaConfig
from rocewatch.core.topology import Topology
from rocewatch.pipeline import Pipeline

log = logging.getLogger(__name__)

NIC = "nic"
SWITCH = "switch"
PARTITIONS_RECHECK_S = 30.0  # how often partitions added to the topic are looked for
OPEN_TIMEOUT_MS = 10_000  # a consumer's wait for its first broker
RETRY_S = 10.0  # after a consumer could not be opened


def classify(doc: Any) -> str | None:
    """``nic`` for a ``nic_config.jsonl`` snapshot, ``switch`` for a gnmic event (or a list of
    them) of ``switch_config.jsonl``, None for anything else."""
    if isinstance(doc, dict):
        if isinstance(doc.get("node"), str) and isinstance(doc.get("nic"), str):
            return NIC
        if isinstance(doc.get("tags"), dict):
            return SWITCH
        return None
    if isinstance(doc, list) and doc and all(isinstance(e, dict) for e in doc):
        return SWITCH if isinstance(doc[0].get("tags"), dict) else None
    return None


class ConfigFeed:
    """One domain's reader of the configuration topic (``domain`` None: the only domain, which
    takes every record). ``poll`` hands the records read to the pipeline and advances the
    offsets it is given (the stage's state's)."""

    def __init__(self, k: KafkaConfig, topology: Topology, domain: str | None) -> None:
        self.k = k
        self.topic = k.topics.config
        self.topology = topology
        self.domain = domain
        # a device's records go to its own domain and to the domains facing it across a cable
        # (the checks compare both ends of each link)
        self.facing: dict[str, set[str]] = {}
        if domain is not None:
            for (dev, _), doms in topology.cross_domain_ends().items():
                self.facing.setdefault(dev, set()).update(doms)
        self.consumer: Any = None
        self.lock = threading.Lock()  # the consumer is handed over from the opening thread
        self.gen = 0  # a consumer opened for an earlier start (closed since) is not used
        self.started = False
        self.opening = False
        self.failed_at: float | None = None
        self.assigned: set[int] = set()
        self.checked = 0.0
        self.records = 0  # records handed to the pipeline since the start

    def start(self) -> None:
        """Open the consumer, on a thread of its own: the stage does not wait for the broker
        (a consumer's first connection waits for it). Each partition is read from the
        offsets ``poll`` is given (none: its beginning)."""
        self.close()
        with self.lock:
            self.started = True
            self.opening = True
            gen = self.gen
        threading.Thread(
            target=self._open, args=(gen,), name="config-feed-open", daemon=True
        ).start()

    def _open(self, gen: int) -> None:
        try:
            consumer = KafkaConsumer(
                **self.k.client_kwargs(),
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                max_poll_records=500,
                bootstrap_timeout_ms=OPEN_TIMEOUT_MS,
            )
        except Exception as e:  # a broker away, a certificate missing: tried again later
            log.warning("configuration topic: no consumer (%s); trying again", e)
            with self.lock:
                self.opening = False
                self.failed_at = time.monotonic()
            return
        with self.lock:
            self.opening = False
            stale = gen != self.gen  # closed (or started again) meanwhile
            if not stale:
                self.consumer = consumer
                self.assigned = set()
                self.checked = 0.0
        if stale:
            consumer.close()

    def _assign(self, offsets: dict[int, int]) -> None:
        now = time.monotonic()
        if self.assigned and now - self.checked < PARTITIONS_RECHECK_S:
            return
        self.checked = now
        parts = self.consumer.partitions_for_topic(self.topic) or set()
        if not parts or set(parts) <= self.assigned:
            return
        self.assigned = set(parts)
        tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
        self.consumer.assign(tps)
        for tp in tps:
            if tp.partition in offsets:
                self.consumer.seek(tp, offsets[tp.partition])
            else:
                self.consumer.seek_to_beginning(tp)
        log.info(
            "reading configuration from %s partitions %s",
            self.topic,
            sorted(self.assigned),
        )

    def wants(self, device: str | None) -> bool:
        """Whether a record of ``device`` goes to this domain's pipeline."""
        if self.domain is None:
            return True
        if device is None:  # the pipeline counts it as a record of no known source
            return self.topology.domain_of("") == self.domain
        return self.topology.domain_of(device) == self.domain or self.domain in self.facing.get(
            device, ()
        )

    def poll(self, pipe: Pipeline, offsets: dict[int, int]) -> int:
        """Hand the records fetched since the last poll (waiting for none) to ``pipe`` and
        advance ``offsets``; returns the records handed over."""
        if self.consumer is None:
            with self.lock:
                retry = (
                    self.started
                    and not self.opening
                    and self.failed_at is not None
                    and time.monotonic() - self.failed_at >= RETRY_S
                )
            if retry:
                pipe.stats.inc("config_consumer_retries")
                self.start()
            return 0
        try:
            self._assign(offsets)
            if not self.assigned:
                return 0
            batches = self.consumer.poll(timeout_ms=0)
        except KafkaError as e:  # the broker away: the records wait there
            pipe.stats.inc("config_topic_unreachable")
            log.debug("configuration topic: %s", e)
            return 0
        n = 0
        for tp, msgs in sorted(batches.items(), key=lambda kv: kv[0].partition):
            for m in msgs:
                offsets[tp.partition] = m.offset + 1
                n += self._take(pipe, m.value)
        self.records += n
        return n

    def _take(self, pipe: Pipeline, value: bytes | None) -> int:
        try:
            doc = orjson.loads(value or b"")
        except orjson.JSONDecodeError:
            pipe.stats.inc("config_record_skipped", detail="not JSON")
            return 0
        kind = classify(doc)
        if kind is None:
            pipe.stats.inc("config_record_skipped", detail="neither a NIC snapshot nor an event")
            return 0
        if kind == NIC:
            device: str | None = doc["node"]
        else:
            first = doc[0] if isinstance(doc, list) else doc
            device = pipe.roce.reader._device(first["tags"])
        if not self.wants(device):
            return 0
        pipe.ingest_config(kind, [doc])
        return 1

    def close(self) -> None:
        with self.lock:
            self.gen += 1
            self.started = False
            self.failed_at = None
            consumer, self.consumer = self.consumer, None
        if consumer is not None:
            try:
                consumer.close()
            except Exception:  # closing only: nothing is lost
                log.debug("closing the configuration consumer failed", exc_info=True)
