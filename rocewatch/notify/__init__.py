"""Alert delivery: signed Alertmanager-format webhooks and a real Alertmanager, from an outbox."""

from rocewatch.notify.base import (
    AlertmanagerConfig,
    NotifyConfig,
    RetryConfig,
    Sink,
    WebhookConfig,
)

__all__ = ["AlertmanagerConfig", "NotifyConfig", "RetryConfig", "Sink", "WebhookConfig"]
