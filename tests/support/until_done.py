"""Run a detect service in a thread and stop it the moment it has done its work.

``DetectService.run(max_idle_s=...)`` stops once every partition it owns has been reported
idle, every detect stage it holds has evaluated to the end of the telemetry, and no record has
come for ``max_idle_s``. The last condition is a guess for a service that cannot tell a quiet
stream from a finished one; a test can: it knows how many samples it published. Waiting it out
cost every test ``max_idle_s`` (4 to 15 s) after the work was done. Here the test stops the
service (its own graceful stop: the final checkpoint and transaction, the embedded sink's
finish) as soon as the other conditions hold, so what a test asserts afterwards is what an idle
stop would have left. ``max_idle_s`` stays a safety net, never reached while the test runs.
"""

from __future__ import annotations

import threading
import time
from typing import Any


def run_service(svc: Any, max_idle_s: float) -> tuple[threading.Thread, list[BaseException]]:
    """Run ``svc`` in a thread until it has been idle ``max_idle_s`` or is stopped; its
    exceptions land in the list returned with the thread."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            svc.run(max_idle_s=max_idle_s)
        except BaseException as e:
            errors.append(e)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    return worker, errors


def telemetry_ends(svc: Any) -> dict[int, int]:
    """The end offset of every partition of ``svc``'s telemetry topic, as the broker has it now."""
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition

    k = svc.cfg.kafka
    c = KafkaConsumer(**k.client_kwargs(), group_id=None)
    try:
        parts = c.partitions_for_topic(k.topics.telemetry) or set()
        tps = [TopicPartition(k.topics.telemetry, p) for p in sorted(parts)]
        return {tp.partition: int(end) for tp, end in c.end_offsets(tps).items()}
    finally:
        c.close()


def done(svc: Any, ends: dict[int, int]) -> bool:
    """What an idle stop of ``svc`` waits for, less the idle time: every telemetry partition
    read to ``ends`` and reported idle (its last steps closed and sent: a lone instance owns
    them all), and every domain's detect stage active here and evaluated to where the
    telemetry ends (its last alerts and drains decided; the stop's final transaction
    publishes them)."""
    parts = svc.agg.parts
    for p, end in ends.items():
        part = parts.get(p)
        if part is None or (end > 0 and (part.offset is None or part.offset < end)):
            return False
    return svc.agg.all_idle() and all(d.active for d in svc.det.shards) and svc.det.caught_up()


def stop_when_done(svc: Any, worker: threading.Thread, timeout: float = 240.0) -> None:
    """Call once the whole stream is on the broker (the publisher has returned). When
    ``done`` holds (twice, a poll apart: the two stages run in threads of their own), stop
    ``svc`` gracefully and wait for ``worker`` to end. A service that stopped by itself (an
    error, its own idle stop) is simply waited for."""
    ends = telemetry_ends(svc)
    assert sum(ends.values()) > 0, "nothing was published"
    deadline = time.monotonic() + timeout
    streak = 0
    while worker.is_alive() and streak < 2:
        streak = streak + 1 if done(svc, ends) else 0
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the service is not done after {timeout:.0f} s: {svc.summary()['stats']}"
            )
        time.sleep(0.1)
    svc.stop_event.set()
    worker.join(120)
    assert not worker.is_alive(), "the service did not stop"
