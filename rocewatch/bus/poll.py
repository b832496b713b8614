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
  thrown away: one more rebalance, and under load one after another.

``poll_group`` never waits longer than the caller's timeout (a service polls several consumers
in one loop, and its idle and watermark clocks assume short polls). Before and after each poll
it collects a join task that has finished, the way kafka-python does when it awaits one: the
member becomes STABLE, heartbeats resume, and the assignment and the rebalance listener are
applied. A join still in flight is marked as needed, so the next poll goes on waiting for it.
"""

from __future__ import annotations

import logging
from typing import Any

from kafka.structs import MemberState

log = logging.getLogger(__name__)


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


def collect_finished_join(consumer: Any) -> bool:
    """If a join task has finished without being collected, collect it now (see the module
    doc); True when a join completed here. A failed one is dropped and the next poll joins
    again. Does nothing on a kafka-python without join tasks (2.x)."""
    coord: Any = getattr(consumer, "_coordinator", None)
    task = getattr(coord, "_join_task", None)
    if task is None or not task.is_done:
        return False
    coord._join_task = None
    if task.failed():
        log.debug("a group join left over by a timed-out poll failed (%s)", task.exception)
        coord.request_rejoin()
        return False
    gen = coord._generation
    with coord._lock:
        coord.rejoining = False
        coord.rejoin_needed = False
        coord.state = MemberState.STABLE
        coord._enable_heartbeat()
    log.debug("collected a group join left over by a timed-out poll (%s)", gen)
    coord._net.run(
        coord._on_join_complete_async, gen.generation_id, gen.member_id, gen.protocol, task.value
    )
    return True


def poll_group(consumer: Any, timeout_ms: int, pauses: bool = False) -> dict[Any, list[Any]]:
    """``consumer.poll(timeout_ms)`` for a group member that never strands it mid-join.

    ``pauses``: the caller pauses and resumes partitions (see ``unpark_resumed``)."""
    if pauses:
        unpark_resumed(consumer)
    collect_finished_join(consumer)
    recs: dict[Any, list[Any]] = consumer.poll(timeout_ms=timeout_ms)
    coord: Any = getattr(consumer, "_coordinator", None)
    if getattr(coord, "_join_task", None) is not None and not collect_finished_join(consumer):
        coord.request_rejoin()  # still in flight: the next poll waits for it again
    return recs
