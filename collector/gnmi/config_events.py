"""The gNMI collector's switch configuration (``gnmi.config_subscription``): each notification
of the configuration paths as gnmic's event format writes it (``switch_config.jsonl``,
docs/formats/roce_config.md), published on the configuration topic (``kafka.topics.config``)
keyed by switch, which the detect stage reads (rocewatch/runtime/config_feed.py).

As gnmic's event format does: the prefix's target is the tag ``target`` (``CONFIG_DB`` for
SONiC's tables), and a JSON value (SONiC serves a table entry as an object of its fields) is
flattened into one value per leaf (``/PORT_QOS_MAP/Ethernet0/pfc_enable``).

>>> from pygnmi.spec.v080 import gnmi_pb2 as pb
>>> n = pb.Notification(timestamp=5, prefix=pb.Path(target="CONFIG_DB"), update=[pb.Update(
...     path=pb.Path(elem=[pb.PathElem(name="PORT_QOS_MAP"), pb.PathElem(name="Ethernet0")]),
...     val=pb.TypedValue(json_ietf_val=b'{"pfc_enable": "3"}'))])
>>> (ev,) = config_events("leaf-0:8080", "config", n)
>>> ev["tags"]["target"], ev["values"]
('CONFIG_DB', {'/PORT_QOS_MAP/Ethernet0/pfc_enable': '3'})
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import orjson
from kafka.errors import KafkaError

from collector.gnmi.config import GnmiConfig, TargetConfig
from collector.gnmi.decode import notification_events
from rocewatch.bus.config import KafkaConfig
from rocewatch.core.stats import Stats

if TYPE_CHECKING:
    from collector.gnmi.client import Collector

log = logging.getLogger(__name__)


def _flat(path: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flat(f"{path}/{k}", v, out)
    else:
        out[path] = value


def config_events(
    source: str, subscription: str, notif: Any, now_ns: int = 0
) -> list[dict[str, Any]]:
    """gnmic "event" objects of one notification of configuration paths (module doc)."""
    events = notification_events(source, subscription, notif, now_ns)
    target = notif.prefix.target if notif.HasField("prefix") else ""
    for ev in events:
        if target:
            ev["tags"]["target"] = target
        flat: dict[str, Any] = {}
        for path, value in ev["values"].items():
            _flat(path, value, flat)
        ev["values"] = flat
    return events


class ConfigEventsOutput:
    """gnmic events of the switches' configuration -> ``kafka.topics.config``: one record per
    notification (a JSON array of its events, as gnmic's Kafka output writes), keyed by the
    switch (``source`` without its port). The sends are flushed by the caller (``flush``); a
    send that fails is counted (``gnmi_config_unsent``): the subscription's next sample sends
    the whole configuration again."""

    def __init__(self, k: KafkaConfig, stats: Stats | None = None) -> None:
        from rocewatch.bus.publish import make_producer

        self.topic = k.topics.config
        self.stats = stats or Stats()
        self.producer = make_producer(k, linger_ms=50)

    def __call__(self, events: list[dict[str, Any]]) -> None:
        if not events:
            return
        source = str(events[0].get("tags", {}).get("source", ""))
        key = (source.rsplit(":", 1)[0] if source.count(":") == 1 else source).encode()
        try:
            fut = self.producer.send(self.topic, key=key, value=orjson.dumps(events))
            fut.add_errback(lambda e: self.stats.inc("gnmi_config_unsent", detail=str(e)[:80]))
            self.stats.inc("gnmi_config_sent")
        except KafkaError as e:
            self.stats.inc("gnmi_config_unsent", detail=str(e)[:80])
            log.warning("switch configuration not sent: %s", e)

    def close(self) -> None:
        try:
            self.producer.flush(timeout=10)
        except KafkaError as e:
            log.warning("switch configuration not all sent: %s", e)
        self.producer.close(timeout=10)


def config_collector(
    gcfg: GnmiConfig, targets: list[TargetConfig], k: KafkaConfig
) -> tuple[Collector, ConfigEventsOutput]:
    """A collector of ``gcfg.config_subscription`` on ``targets`` whose notifications go, as
    gnmic events, to the configuration topic (its samples nowhere: counters are the other
    subscription's); not started."""
    from collector.gnmi.client import Collector

    sub = gcfg.config_subscription
    if sub is None:
        raise ValueError("no gnmi.config_subscription")
    out = ConfigEventsOutput(k)
    col = Collector(
        gcfg,
        lambda df: None,
        [dataclasses.replace(t, subscription=sub) for t in targets],
        event_sink=out,
    )
    col.make_events = config_events
    return col, out
