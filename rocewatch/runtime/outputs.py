"""The one writer of a pipeline's outputs to the store and the notify outbox, used by replay,
the demo, the sink (`event_sink`) and the detect stage (its inhibited alerts), so they store
and notify the same things in the same order.

Notified alerts are queued in the outbox first (durable before anything else sees them), then
stored with the inhibited ones (kept, never notified), then the interference between tenants
they name, the actions, the rollups, the NCCL jobs' ranks and the RoCE configuration changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from rocewatch.core.model import Action, Alert
from rocewatch.core.roce import ConfigChange


@dataclass
class Written:
    """What one ``write`` stored and queued."""

    queued: int = 0
    alerts: int = 0
    actions: int = 0
    rollups: int = 0
    interference: int = 0
    ranks: int = 0
    config_changes: int = 0


class OutputWriter:
    """``store`` (storage.store.Store or None) and ``notifier`` (a started dispatcher with
    ``enqueue``, or None). Errors of either propagate (the caller retries or counts them)."""

    def __init__(self, store: Any = None, notifier: Any = None) -> None:
        self.store = store
        self.notifier = notifier

    def write(
        self,
        alerts: Sequence[Alert] = (),
        inhibited: Sequence[Alert] = (),
        actions: Sequence[Action] = (),
        rollups: Sequence[pl.DataFrame] = (),
        ranks: Sequence[Mapping[str, Any]] = (),
        config_changes: Sequence[ConfigChange] = (),
    ) -> Written:
        w = Written()
        if self.notifier is not None and alerts:
            w.queued = int(self.notifier.enqueue(list(alerts)) or 0)
        if self.store is None:
            return w
        if alerts or inhibited:
            w.alerts = int(self.store.write_alerts([*alerts, *inhibited]) or 0)
        if alerts:  # the pause each tenant suffered from others (storage: tenant_interference)
            w.interference = int(self.store.write_interference(list(alerts)) or 0)
        if actions:
            w.actions = int(self.store.write_actions(list(actions)) or 0)
        if rollups:  # in the order given: a complete bucket replaces a provisional one
            w.rollups = int(self.store.write_rollups(pl.concat(list(rollups))) or 0)
        if ranks:  # NCCL jobs' ranks (storage.store.Store.write_ranks): what maps series to jobs
            w.ranks = int(self.store.write_ranks(list(ranks)) or 0)
        if config_changes:
            w.config_changes = int(self.store.write_config_changes(list(config_changes)) or 0)
        return w

    def store_final(self, alerts: Sequence[Alert]) -> Written:
        """Store every alert instance in its final state (the end of a replay or the demo:
        those still firing carry their latest annotations, such as the pause time an
        interference victim suffered so far); nothing is notified."""
        w = Written()
        if self.store is None or not alerts:
            return w
        w.alerts = int(self.store.write_alerts(list(alerts)) or 0)
        w.interference = int(self.store.write_interference(list(alerts)) or 0)
        return w
