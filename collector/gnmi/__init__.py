"""gNMI collection: subscribe to switches over gRPC, decode into columnar batches.

``Collector`` (client.py) runs the subscriptions, ``NotificationDecoder`` (decode.py) maps
notifications through the vendor mapping table, ``GnmiConfig`` (config.py) describes targets.
"""

from collector.gnmi.client import Collector, TargetHealth, backoff_delay, make_channel
from collector.gnmi.config import (
    GnmiConfig,
    SubscriptionConfig,
    TargetConfig,
    TlsConfig,
    gnmi_config,
)
from collector.gnmi.decode import LldpTable, NotificationDecoder, notification_events

__all__ = [
    "Collector",
    "GnmiConfig",
    "LldpTable",
    "NotificationDecoder",
    "SubscriptionConfig",
    "TargetConfig",
    "TargetHealth",
    "TlsConfig",
    "backoff_delay",
    "gnmi_config",
    "make_channel",
    "notification_events",
]
