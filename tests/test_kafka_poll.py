"""Group members polled with short timeouts stay in their group (rocewatch.bus.poll).

kafka-python 3.0 lets a poll return while the group join it started is still in flight; a join
that finishes after that may never be collected, and the member then sits in REBALANCING with
heartbeats off until the broker expires it, reading nothing. The detectors poll every 20 to
200 ms, so on a loaded machine a join often outlasts a poll. Real broker, real groups.
"""

from __future__ import annotations

import threading
import time

from kafka import KafkaConsumer, KafkaProducer

from rocewatch.bus.poll import poll_group

SESSION_MS = 6000  # the broker's smallest allowed session: the shortest test
MEMBERS = 4  # independent groups, each its own chance of a late join
FIRST, LATER = 400, 40


def _member(bootstrap: str, topic: str, out: dict[str, object]) -> None:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=topic + ".group",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=SESSION_MS // 4,
    )
    try:
        deadline = time.monotonic() + 30
        while not consumer.partitions_for_topic(topic) and time.monotonic() < deadline:
            time.sleep(0.1)
        consumer.subscribe([topic])
        got = 0
        # 1 ms polls: nearly every join outlasts one. Keep going past a session timeout, so a
        # stranded member would have been expired by the broker.
        until = time.monotonic() + SESSION_MS / 1000 + 3
        while time.monotonic() < until:
            got += sum(len(v) for v in poll_group(consumer, 1).values())
        out["first"] = got
        out["ready"] = True
        while not out.get("sent"):
            time.sleep(0.05)
        deadline = time.monotonic() + 20
        while got < FIRST + LATER and time.monotonic() < deadline:
            got += sum(len(v) for v in poll_group(consumer, 50).values())
        out["total"] = got
        consumer.commit()  # refused (CommitFailedError) for a member its group has dropped
        out["committed"] = True
    except Exception as e:  # reported by the test
        out["error"] = repr(e)
    finally:
        consumer.close()


def test_members_polled_with_short_timeouts_stay_joined_and_keep_reading(
    kafka_bootstrap, kafka_topics
):
    topics = [kafka_topics.create(f"m{i}", partitions=4) for i in range(MEMBERS)]
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for topic in topics:
        for i in range(FIRST):
            producer.send(topic, b"x", partition=i % 4)
    producer.flush()
    results: list[dict[str, object]] = [{} for _ in topics]
    threads = [
        threading.Thread(target=_member, args=(kafka_bootstrap, t, r), daemon=True)
        for t, r in zip(topics, results, strict=True)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while not all(r.get("ready") or r.get("error") for r in results):
        assert time.monotonic() < deadline, f"members never got going: {results}"
        time.sleep(0.1)
    for topic in topics:  # records sent after a session timeout: only a live member reads them
        for i in range(LATER):
            producer.send(topic, b"y", partition=i % 4)
    producer.flush()
    producer.close()
    for r in results:
        r["sent"] = True
    for t in threads:
        t.join(60)

    for topic, r in zip(topics, results, strict=True):
        assert "error" not in r, f"{topic}: {r['error']}"
        assert r["first"] == FIRST, f"{topic}: {r}"
        assert r["total"] == FIRST + LATER, f"{topic}: {r}"
        assert r["committed"] is True
