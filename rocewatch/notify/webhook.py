"""The webhook sink: Alertmanager's version 4 webhook payload, signed with HMAC-SHA256.

One request per alertname (the group), at most ``max_alerts`` alerts each, so anything that
accepts Alertmanager's webhooks accepts rocewatch's. Headers: ``X-Rocewatch-Timestamp``,
``X-Rocewatch-Signature`` (see ``rocewatch.notify.signing``) and ``X-Rocewatch-Delivery``, a
stable id of the request's events a receiver may use to drop a re-sent request after a crash.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import orjson

from rocewatch.notify.base import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WebhookConfig,
)
from rocewatch.notify.http import post_json
from rocewatch.notify.signing import sign


def _common(maps: list[dict[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    first = maps[0]
    return {k: v for k, v in first.items() if all(m.get(k) == v for m in maps[1:])}


def group_key(labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return "{}:{" + inner + "}"


def payload(alerts: list[dict[str, Any]], receiver: str, external_url: str) -> dict[str, Any]:
    """Alertmanager's webhook body (version 4) for alerts of one group."""
    groups = {"alertname": alerts[0]["labels"]["alertname"]} if alerts else {}
    return {
        "version": "4",
        "groupKey": group_key(groups),
        "truncatedAlerts": 0,
        "status": "firing" if any(a["status"] == "firing" for a in alerts) else "resolved",
        "receiver": receiver,
        "groupLabels": groups,
        "commonLabels": _common([a["labels"] for a in alerts]),
        "commonAnnotations": _common([a.get("annotations", {}) for a in alerts]),
        "externalURL": external_url,
        "alerts": alerts,
    }


def delivery_id(alerts: list[dict[str, Any]]) -> str:
    h = hashlib.sha256()
    for a in alerts:
        h.update(f"{a['fingerprint']}|{a['startsAt']}|{a['status']}\n".encode())
    return h.hexdigest()[:32]


class WebhookNotifier:
    collapse_resolved = False
    refresh_s: float | None = None

    def __init__(self, cfg: WebhookConfig, clock: Callable[[], float] = time.time) -> None:
        cfg.validate()
        self.cfg = cfg
        self.name = cfg.name
        self.max_alerts = cfg.max_alerts
        self.timeout_s = cfg.timeout_s
        self._secret = (cfg.secret or "").encode()
        self._clock = clock

    def batches(self, alerts: list[dict[str, Any]]) -> list[list[int]]:
        by_name: dict[str, list[int]] = {}
        for i, a in enumerate(alerts):
            by_name.setdefault(a["labels"].get("alertname", ""), []).append(i)
        out: list[list[int]] = []
        for idx in by_name.values():
            out += [idx[i : i + self.max_alerts] for i in range(0, len(idx), self.max_alerts)]
        return out

    def body(self, alerts: list[dict[str, Any]]) -> bytes:
        return orjson.dumps(payload(alerts, self.cfg.receiver, self.cfg.external_url))

    def send(self, alerts: list[dict[str, Any]]) -> None:
        body = self.body(alerts)
        ts, sig = sign(self._secret, body, self._clock())
        headers = {
            TIMESTAMP_HEADER: ts,
            SIGNATURE_HEADER: sig,
            DELIVERY_HEADER: delivery_id(alerts),
        }
        post_json(self.cfg.url, body, headers, self.cfg.timeout_s, self.cfg.tls)
