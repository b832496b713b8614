"""Notification sinks by their config key: ``notify.<key>`` is a list of that sink's config
mappings (``notify.webhooks: [{name, url, secret}, ...]``). A sink is one file (its frozen
config dataclass, validated at start, and its ``Notifier``) plus one entry here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rocewatch.notify.alertmanager import AlertmanagerNotifier
from rocewatch.notify.base import AlertmanagerConfig, WebhookConfig
from rocewatch.notify.webhook import WebhookNotifier


@dataclass(frozen=True)
class SinkEntry:
    config: type[Any]  # one sink's settings (an item of the ``notify.<key>`` list)
    notifier: type[Any]  # built from one config: ``notifier(config)``
    help: str  # what the list holds, for the configuration reference


SINKS: dict[str, SinkEntry] = {
    "webhooks": SinkEntry(WebhookConfig, WebhookNotifier, "webhook receivers"),
    "alertmanagers": SinkEntry(AlertmanagerConfig, AlertmanagerNotifier, "Alertmanagers"),
}
