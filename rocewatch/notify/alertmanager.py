"""The Alertmanager sink: POST /api/v2/alerts, so users' routing, grouping and silences apply.

Firing alerts go without ``endsAt`` (Alertmanager then holds them for its resolve_timeout) and
are re-sent every ``refresh_s`` while they fire, as Prometheus does; a resolved alert goes with
its ``endsAt``, which ends it in Alertmanager.
"""

from __future__ import annotations

from typing import Any

import orjson

from rocewatch.core.model import ZERO_TIME
from rocewatch.notify.base import AlertmanagerConfig
from rocewatch.notify.http import post_json


def postable(a: dict[str, Any]) -> dict[str, Any]:
    """An alert object (docs/formats.md section 6) as Alertmanager's API v2 postableAlert."""
    out: dict[str, Any] = {
        "labels": dict(a["labels"]),
        "annotations": dict(a.get("annotations", {})),
        "startsAt": a["startsAt"],
    }
    ends = a.get("endsAt", ZERO_TIME)
    if a.get("status") == "resolved" and ends and not ends.startswith("0001-01-01"):
        out["endsAt"] = ends
    if a.get("generatorURL"):
        out["generatorURL"] = a["generatorURL"]
    return out


class AlertmanagerNotifier:
    collapse_resolved = True

    def __init__(self, cfg: AlertmanagerConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self.name = cfg.name
        self.max_alerts = cfg.max_alerts
        self.timeout_s = cfg.timeout_s
        self.refresh_s: float | None = cfg.refresh_s
        self.endpoint = cfg.url.rstrip("/") + "/api/v2/alerts"

    def batches(self, alerts: list[dict[str, Any]]) -> list[list[int]]:
        idx = list(range(len(alerts)))
        return [idx[i : i + self.max_alerts] for i in range(0, len(idx), self.max_alerts)]

    def send(self, alerts: list[dict[str, Any]]) -> None:
        body = orjson.dumps([postable(a) for a in alerts])
        post_json(self.endpoint, body, {}, self.cfg.timeout_s, self.cfg.tls)
