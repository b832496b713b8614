"""Polling a kafka-python group consumer without stranding it in a rebalance.

kafka-python 3.0 runs a group join (JoinGroup, then SyncGroup) as a task on its IO thread and
lets ``poll(timeout_ms)`` return when the timeout passes, leaving the task in flight. The next
poll picks the task up only while the coordinator still says it needs to rejoin. Two things go
wrong when the join finishes after the poll gave up:

- the leader's assignment step, run inside the task, refreshes the metadata snapshot that made
  the member rejoin, so "needs to rejoin" turns false and the finished join is never collected:
  the member stays REBALANCING with heartbeats off, the broker expires it a session later, and
  it reads nothing more (seen in CI: a detector assigned nothing for a minute);
- a finished task found on the next poll is replaced by a new JoinGroup, and its assignment is
  thrown away: one more rebalance for nothing.

``poll_group`` polls as usual and then, if a join task is left over, asks for the rejoin and
waits for the join to finish in one call, so kafka-python's own completion path runs: the
assignment is applied, the rebalance listener runs, heartbeats resume. A join waits for every
member of the group, up to a dead member's session timeout, so ``join_timeout_ms`` should be
longer than that; a join still unfinished then is picked up by the next call.
"""

from __future__ import annotations

import logging
from typing import Any

from kafka.errors import KafkaTimeoutError

log = logging.getLogger(__name__)

DEFAULT_JOIN_TIMEOUT_MS = 15_000


def unpark_resumed(consumer: Any) -> None:
    """Work around kafka-python 3.0's fetcher losing a resumed partition.

    Records fetched for a partition that is then paused are parked; they come back after
    ``resume`` only when the fetcher's in-line slot is empty (None), but a consumed slot keeps
    its drained record set, and a partition with parked records is never fetched again: the
    partition stalls for good. Emptying a drained slot before each poll lets them back in.
    Call before ``poll`` on a consumer that pauses partitions.
    """
    fetcher = getattr(consumer, "_fetcher", None)
    slot = getattr(fetcher, "_next_partition_records", None)
    if slot is not None and not slot and getattr(fetcher, "_paused_partition_records", None):
        fetcher._next_partition_records = None  # type: ignore[union-attr]


def join_left_over(consumer: Any) -> bool:
    """True when a group join started by an earlier poll has not been collected yet."""
    coord = getattr(consumer, "_coordinator", None)
    return getattr(coord, "_join_task", None) is not None


def finish_join(consumer: Any, timeout_ms: int = DEFAULT_JOIN_TIMEOUT_MS) -> bool:
    """Collect a left-over group join (see the module doc). True when the member is joined."""
    coord = consumer._coordinator
    log.debug("finishing a group join left over by a timed-out poll")
    coord.request_rejoin()
    try:
        return bool(coord.ensure_active_group(timeout_ms=timeout_ms))
    except KafkaTimeoutError:  # the coordinator is out of reach: the next poll goes on
        return False


def poll_group(
    consumer: Any,
    timeout_ms: int,
    join_timeout_ms: int = DEFAULT_JOIN_TIMEOUT_MS,
    pauses: bool = False,
) -> dict[Any, list[Any]]:
    """``consumer.poll(timeout_ms)`` for a group member, then finish any join it left over.

    ``pauses``: the caller pauses and resumes partitions (see ``unpark_resumed``)."""
    if pauses:
        unpark_resumed(consumer)
    recs: dict[Any, list[Any]] = consumer.poll(timeout_ms=timeout_ms)
    if join_left_over(consumer):
        finish_join(consumer, join_timeout_ms)
    return recs
