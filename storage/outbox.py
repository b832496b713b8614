"""The notification outbox: alert events kept in SQL until each sink has delivered them.

Events are enqueued and committed before any delivery is tried (the detector service does it
before it checkpoints, so its restart re-derives nothing it lost); a
dispatcher (``rocewatch.notify.dispatcher``) claims due rows, sends them and records the outcome.
A row is claimed by moving its ``next_attempt_at`` past the send's timeout (a lease), so a second
dispatcher on the same database skips it, and a dispatcher killed mid-send leaves a row that is
tried again after the lease: delivery is at least once across crashes, exactly once otherwise.

>>> from storage.store import Store
>>> s = Store("sqlite://"); s.create_schema()
>>> ob = Outbox(s, clock=lambda: 1000.0)
>>> ob.enqueue([Alert({"alertname": "FlakyLink", "severity": "warning"}, {}, 10**18)], ["ops"])
1
>>> [i.alert["status"] for i in ob.claim("ops", 10, lease_s=30)]
['firing']
>>> ob.claim("ops", 10, lease_s=30)  # leased: not handed out twice
[]
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table, and_, func, or_, select, update
from sqlalchemy.orm import aliased

from rocewatch.core.model import Alert
from storage.models import OutboxRow, ns_to_datetime
from storage.store import Store

OUTBOX: Table = OutboxRow.__table__  # type: ignore[assignment]


def _resolution_queued() -> Any:
    """True for an outbox row whose alert's resolved event is queued for the same sink."""
    sib = aliased(OUTBOX)
    return (
        select(sib.c.id)
        .where(
            sib.c.sink == OUTBOX.c.sink,
            sib.c.fingerprint == OUTBOX.c.fingerprint,
            sib.c.starts_at == OUTBOX.c.starts_at,
            sib.c.status == "resolved",
        )
        .exists()
    )


@dataclass(frozen=True)
class OutboxItem:
    id: int
    sink: str
    alert: dict[str, Any]  # the Alertmanager alert object (docs/formats.md section 6)
    attempts: int
    refresh: bool  # a re-send of an already delivered firing event


def incident_link(base: str, a: Alert) -> str:
    """The incident page of an alert event: the API redirects it to the incident the store
    filed the event under (the link is known before the event is stored)."""
    return f"{base.rstrip('/')}/incidents/alert/{a.fingerprint}/{a.starts_at}"


def _utc(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC)


class Outbox:
    """Durable per-sink queue of alert events on a ``Store``'s database.

    ``clock`` gives wall-clock seconds (retries and leases run on wall time, not telemetry time).
    ``incident_url``: where the operator API serves incident pages (``https://host:9465``);
    each queued alert then carries the link to its incident as ``generatorURL``.
    """

    def __init__(
        self, store: Store, clock: Callable[[], float] = time.time, incident_url: str = ""
    ) -> None:
        self.store = store
        self.clock = clock
        self.incident_url = incident_url.rstrip("/")

    def _alert_json(self, a: Alert) -> dict[str, Any]:
        d = a.to_json()
        if self.incident_url:
            d["generatorURL"] = incident_link(self.incident_url, a)
        return d

    def enqueue(self, alerts: Sequence[Alert], sinks: Sequence[str]) -> int:
        """Add each alert event for each sink; an event already queued is ignored. Returns the
        rows offered. A resolved event stops the refreshes of its firing event."""
        if not alerts or not sinks:
            return 0
        now = _utc(self.clock())
        rows: dict[tuple[str, str, dt.datetime, str], dict[str, Any]] = {}
        for a in alerts:
            for sink in sinks:
                starts = ns_to_datetime(a.starts_at)
                rows[(sink, a.fingerprint, starts, a.status)] = {
                    "sink": sink,
                    "fingerprint": a.fingerprint,
                    "starts_at": starts,
                    "status": a.status,
                    "alert": self._alert_json(a),
                    "created_at": now,
                    "next_attempt_at": now,
                    "attempts": 0,
                }
        stmt = self.store._insert(OUTBOX).on_conflict_do_nothing(
            index_elements=["sink", "fingerprint", "starts_at", "status"]
        )
        resolved = [k for k in rows if k[3] == "resolved"]
        with self.store._errors("enqueue notifications"), self.store.engine.begin() as conn:
            values = list(rows.values())
            for i in range(0, len(values), self.store.batch_size):
                conn.execute(stmt, values[i : i + self.store.batch_size])
            for sink, fp, starts, _ in resolved:
                conn.execute(
                    update(OUTBOX)
                    .where(
                        OUTBOX.c.sink == sink,
                        OUTBOX.c.fingerprint == fp,
                        OUTBOX.c.starts_at == starts,
                        OUTBOX.c.status == "firing",
                    )
                    .values(refresh_at=None)
                )
        return len(rows)

    def claim(self, sink: str, limit: int, lease_s: float) -> list[OutboxItem]:
        """Due events of one sink, oldest first, leased for ``lease_s`` seconds.

        Due: never delivered and not dead with ``next_attempt_at`` reached, or a delivered
        firing event whose refresh time has come and whose resolution is not queued.
        """
        now = _utc(self.clock())
        lease = _utc(self.clock() + lease_s)
        resolved_queued = _resolution_queued()
        pending = and_(
            OUTBOX.c.delivered_at.is_(None),
            OUTBOX.c.dead_at.is_(None),
            OUTBOX.c.next_attempt_at <= now,
        )
        refresh = and_(
            OUTBOX.c.delivered_at.is_not(None),
            OUTBOX.c.refresh_at.is_not(None),
            OUTBOX.c.refresh_at <= now,
            ~resolved_queued,
        )
        q = (
            select(
                OUTBOX.c.id,
                OUTBOX.c.alert,
                OUTBOX.c.attempts,
                OUTBOX.c.delivered_at,
                OUTBOX.c.next_attempt_at,
                OUTBOX.c.refresh_at,
            )
            .where(OUTBOX.c.sink == sink, or_(pending, refresh))
            .order_by(OUTBOX.c.id)
            .limit(limit)
        )
        out: list[OutboxItem] = []
        with self.store._errors("claim notifications"), self.store.engine.begin() as conn:
            for r in conn.execute(q).mappings().all():
                is_refresh = r["delivered_at"] is not None
                # Optimistic lease: only the dispatcher whose update matched owns the row.
                col = OUTBOX.c.refresh_at if is_refresh else OUTBOX.c.next_attempt_at
                old = r["refresh_at"] if is_refresh else r["next_attempt_at"]
                n = conn.execute(
                    update(OUTBOX).where(OUTBOX.c.id == r["id"], col == old).values({col: lease})
                ).rowcount
                if n == 1:
                    out.append(
                        OutboxItem(r["id"], sink, dict(r["alert"]), r["attempts"], is_refresh)
                    )
        return out

    def delivered(self, items: Sequence[OutboxItem], refresh_s: float | None = None) -> None:
        """Record a 2xx answer; firing events of a refreshing sink come due again later."""
        if not items:
            return
        now = _utc(self.clock())
        nxt = _utc(self.clock() + refresh_s) if refresh_s else None
        ids = [i.id for i in items]
        with self.store._errors("record delivery"), self.store.engine.begin() as conn:
            conn.execute(
                update(OUTBOX)
                .where(OUTBOX.c.id.in_(ids), OUTBOX.c.delivered_at.is_(None))
                .values(delivered_at=now, attempts=OUTBOX.c.attempts + 1, last_error=None)
            )
            firing = [i.id for i in items if i.alert.get("status") == "firing"]
            if nxt is not None and firing:
                conn.execute(
                    update(OUTBOX)
                    .where(OUTBOX.c.id.in_(firing), ~_resolution_queued())
                    .values(refresh_at=nxt)
                )

    def failed(self, items: Sequence[OutboxItem], error: str, retry_in_s: float) -> None:
        """Record a retryable failure: try the events again after ``retry_in_s``."""
        if not items:
            return
        at = _utc(self.clock() + retry_in_s)
        new = [i.id for i in items if not i.refresh]
        old = [i.id for i in items if i.refresh]
        with self.store._errors("record failure"), self.store.engine.begin() as conn:
            if new:
                conn.execute(
                    update(OUTBOX)
                    .where(OUTBOX.c.id.in_(new))
                    .values(
                        next_attempt_at=at, attempts=OUTBOX.c.attempts + 1, last_error=error[:1000]
                    )
                )
            if old:
                conn.execute(
                    update(OUTBOX)
                    .where(OUTBOX.c.id.in_(old), OUTBOX.c.refresh_at.is_not(None))
                    .values(refresh_at=at, last_error=error[:1000])
                )

    def dead(self, items: Sequence[OutboxItem], error: str) -> None:
        """Record a permanent refusal: the events stay in the table, never sent again."""
        if not items:
            return
        now = _utc(self.clock())
        ids = [i.id for i in items]
        with self.store._errors("record refusal"), self.store.engine.begin() as conn:
            conn.execute(
                update(OUTBOX)
                .where(OUTBOX.c.id.in_(ids))
                .values(
                    dead_at=now,
                    refresh_at=None,
                    attempts=OUTBOX.c.attempts + 1,
                    last_error=error[:1000],
                )
            )

    def depth(self, sink: str | None = None) -> dict[str, int]:
        """Undelivered, not dead events per sink (the ``outbox depth``)."""
        q = (
            select(OUTBOX.c.sink, func.count())
            .where(OUTBOX.c.delivered_at.is_(None), OUTBOX.c.dead_at.is_(None))
            .group_by(OUTBOX.c.sink)
        )
        if sink is not None:
            q = q.where(OUTBOX.c.sink == sink)
        with self.store._errors("read outbox depth"), self.store.engine.connect() as conn:
            return {s: int(n) for s, n in conn.execute(q).all()}

    def dead_count(self) -> int:
        q = select(func.count()).where(OUTBOX.c.dead_at.is_not(None))
        with self.store._errors("read outbox"), self.store.engine.connect() as conn:
            return int(conn.execute(q).scalar_one())

    def prune(self, older_than_s: float) -> int:
        """Delete delivered or dead events created before ``older_than_s`` (wall seconds)."""
        cutoff = _utc(older_than_s)
        with self.store._errors("prune outbox"), self.store.engine.begin() as conn:
            return int(
                conn.execute(
                    OUTBOX.delete().where(
                        OUTBOX.c.created_at < cutoff,
                        or_(OUTBOX.c.delivered_at.is_not(None), OUTBOX.c.dead_at.is_not(None)),
                        OUTBOX.c.refresh_at.is_(None),
                    )
                ).rowcount
            )
