"""Alert delivery: signed Alertmanager-format webhooks and a real Alertmanager, from an outbox."""

from rocewatch.notify.base import (
    AlertmanagerConfig,
    Notifier,
    NotifyConfig,
    RetryConfig,
    WebhookConfig,
)

__all__ = ["AlertmanagerConfig", "Notifier", "NotifyConfig", "RetryConfig", "WebhookConfig"]
