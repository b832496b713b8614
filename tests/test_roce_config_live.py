"""RoCE configuration over Kafka (issue 35, the live path): the agents' NIC snapshots and the
switches' configuration events on the configuration topic reach the detect stage, which gives
what replay gives from the same records, across a restart.

Against a real broker: the two-node PFC-storm scenario of tests/test_roce_watch.py (PFC moved
from priority 3 to 4 on the leaf two minutes before the storm; gpu-002's NIC on PCP trust from
1 s to 3 s) published in two halves around a graceful restart of `rocewatch detect` (in
process). The NIC snapshots go out through the agent's own sender (``KafkaConfigOutput``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orjson
from kafka import KafkaProducer

from collector.nic.kafka_output import KafkaConfigOutput
from rocewatch.bus.topics import ensure_topics
from rocewatch.config import Config
from rocewatch.replay import ReplayResult
from rocewatch.runtime.config_feed import classify
from rocewatch.runtime.publish import publish_scenario
from rocewatch.runtime.service import DetectService
from tests.support.until_done import run_service, stop_when_done
from tests.test_kafka_pipeline import comparable, kafka_cfg, read_topic
from tests.test_roce_watch import replayed, scenario  # noqa: F401  (the module's fixtures)

S = 1_000_000_000
T0 = 1795946400_000_000_000  # the simulator's start
SPLIT_S = 2.5  # telemetry and configuration before it, then the restart, then the rest


def _lines(path: Path) -> list[bytes]:
    return [x for x in path.read_bytes().splitlines() if x.strip()]


def _ts(line: bytes) -> int:
    v = orjson.loads(line)
    return int((v[0] if isinstance(v, list) else v)["timestamp"])


def _half(src: Path, out: Path, first: bool) -> Path:
    """The scenario's telemetry and configuration before ``SPLIT_S`` (or from it on)."""
    cut = T0 + int(SPLIT_S * S)
    out.mkdir()
    (out / "topology.yaml").write_bytes((src / "topology.yaml").read_bytes())
    for name in ("switch.jsonl", "nic.jsonl", "nic_config.jsonl", "switch_config.jsonl"):
        keep = [x for x in _lines(src / name) if (_ts(x) < cut) == first]
        (out / name).write_bytes(b"".join(x + b"\n" for x in keep))
    return out


def _publish_config(cfg: Config, part: Path) -> int:
    """The half's NIC snapshots through each node's agent sender, and its switch events as the
    gNMI collector sends them (one record per gnmic event, keyed by switch); plus a record that
    is not JSON and one that is neither kind, which are counted and skipped."""
    k = cfg.kafka
    n = 0
    by_node: dict[str, list[bytes]] = {}
    for line in _lines(part / "nic_config.jsonl"):
        by_node.setdefault(orjson.loads(line)["node"], []).append(line + b"\n")
    for node, lines in by_node.items():
        out = KafkaConfigOutput(k, node)
        out(lines)
        assert out.stats.counts.get("agent_config_sent") == len(lines), out.stats.counts
        out.close()
        n += len(lines)
    prod = KafkaProducer(bootstrap_servers=[k.bootstrap_servers])
    for line in _lines(part / "switch_config.jsonl"):
        ev = orjson.loads(line)
        assert classify(ev) == "switch"
        prod.send(k.topics.config, key=ev["tags"]["source"].encode(), value=line)
        n += 1
    prod.send(k.topics.config, key=b"leaf-r0-p0", value=b"\x00not json")
    prod.send(k.topics.config, key=b"leaf-r0-p0", value=b'{"neither": "kind"}')
    prod.flush()
    prod.close()
    return n


def _run(cfg: Config) -> dict[str, Any]:
    svc = DetectService(cfg)
    worker, errors = run_service(svc, 10.0)
    stop_when_done(svc, worker)
    assert not errors, errors
    (stage,) = svc.det.shards
    st = stage.state
    assert st is not None
    roce = st.pipeline.roce
    return {
        "applied": roce.applied,
        "pending": len(roce.pending),
        "changes": roce.changes,
        "offsets": dict(st.config_offsets),
        "stats": svc.summary()["stats"],
    }


def test_configuration_on_kafka_reaches_the_detect_stage_across_a_restart(
    kafka_bootstrap: str,
    kafka_topics: Any,
    tmp_path: Path,
    scenario: Path,  # noqa: F811
    replayed: ReplayResult,  # noqa: F811
) -> None:
    cfg = kafka_cfg(kafka_bootstrap, kafka_topics, tmp_path, scenario)
    cfg = dataclasses.replace(
        cfg,
        kafka=dataclasses.replace(
            cfg.kafka, topics=dataclasses.replace(cfg.kafka.topics, config=kafka_topics("config"))
        ),
    )
    ensure_topics(cfg.kafka)
    first, second = (_half(scenario, tmp_path / f"part{i}", i == 1) for i in (1, 2))
    records = 0
    for i, part in enumerate((first, second)):
        records += _publish_config(cfg, part)
        publish_scenario(part, cfg)
        got = _run(cfg)
        # every record read once, two bad ones a half counted and skipped: the offsets are
        # where the topic ends, and the records applied or still waiting for their step are
        # exactly those published (none lost at the restart, none applied twice)
        assert got["offsets"] == {0: records + 2 * (i + 1)}
        assert got["applied"] + got["pending"] == records
        # (the pipeline's counters are part of its state: the second run goes on counting)
        assert got["stats"].get("config_record_skipped") == 2 * (i + 1)
    total = sum(len(_lines(scenario / n)) for n in ("nic_config.jsonl", "switch_config.jsonl"))
    assert records == total
    # what replay made of the same records: the same change events, the same alerts
    assert got["changes"] == len(replayed.config_changes) == 5
    events = [orjson.loads(m.value) for m in read_topic(kafka_bootstrap, cfg.kafka.topics.alerts)]
    assert comparable(events) == comparable(replayed.alerts)
    mismatch = [e for e in events if e["labels"]["alertname"] == "RoCEConfigMismatch"]
    assert {e["labels"]["check"] for e in mismatch} >= {"pfc", "trust"}
    (origin,) = {
        e["annotations"]["config_changes"]
        for e in events
        if e["labels"]["alertname"] == "PFCStorm" and e["labels"].get("role") == "origin"
    }
    assert origin == "pfc on leaf-r0-p0/Ethernet1/1 changed 3 -> 4, 2 min before this PFCStorm"


def test_the_agent_sending_to_kafka_sends_its_nic_configuration(
    kafka_bootstrap: str, kafka_topics: Any, tmp_path: Path
) -> None:
    """`rocewatch-agent` sending to Kafka (no --out, no --config-out) also sends each NIC's
    configuration snapshot on the configuration topic, keyed by node, in nic_config.jsonl's
    layout; its telemetry goes on the telemetry topic as before."""
    from rocewatch.agent_cli import main

    telemetry, config = kafka_topics("telemetry"), kafka_topics("config")
    conf = tmp_path / "agent.yaml"
    conf.write_text(
        f"kafka: {{bootstrap_servers: '{kafka_bootstrap}', "
        f"topics: {{telemetry: '{telemetry}', config: '{config}'}}}}\n"
        f"agent: {{ethtool: 'off', mlxlink: 'off', interval_s: 0.5, "
        f"spool_dir: '{tmp_path / 'spool'}'}}\n"
    )
    fix = Path(__file__).parent / "fixtures" / "mlx5" / "sys"
    argv = ["--config", str(conf), "--node", "n1", "--sysfs-root", str(fix), "--duration", "1.2"]
    assert main(argv) == 0
    recs = read_topic(kafka_bootstrap, config)
    assert [(m.key, orjson.loads(m.value)["nic"]) for m in recs] == [
        (b"n1", "mlx5_0"),
        (b"n1", "mlx5_1"),
    ]
    snap = orjson.loads(recs[0].value)
    assert classify(snap) == "nic" and snap["node"] == "n1" and isinstance(snap["timestamp"], int)
    assert read_topic(kafka_bootstrap, telemetry)  # the counters still go out
    # --no-config: nothing more on the configuration topic
    assert main([*argv, "--no-config"]) == 0
    assert len(read_topic(kafka_bootstrap, config)) == 2


def test_the_gnmi_collector_sends_switch_configuration_changes(
    kafka_bootstrap: str, kafka_topics: Any
) -> None:
    """`rocewatch collect` with ``gnmi.config_subscription`` subscribes to a switch's CONFIG_DB
    tables (the simulated SONiC target, STREAM SAMPLE) and publishes each notification as gnmic
    events on the configuration topic, keyed by switch; the detect stage's reader hands them to
    a pipeline, which sees the fabric's correct configuration and then the PFC change made on
    the switch meanwhile: one change event, on that port."""
    import itertools
    import time

    from collector.gnmi.config import TargetConfig, gnmi_config
    from collector.gnmi.config_events import config_collector
    from rocewatch.bus.config import KafkaConfig, TopicsConfig
    from rocewatch.core.topology import Topology
    from rocewatch.pipeline import Pipeline
    from rocewatch.runtime.config_feed import ConfigFeed
    from rocewatch.sim import SimConfig
    from rocewatch.sim.config_target import ConfigDbTarget
    from rocewatch.sim.fabric import Fabric
    from rocewatch.sim.roce_config import config_db

    fab = Fabric(SimConfig(nodes=2, nics_per_node=1, spines=2, naming="sonic"))
    db = config_db(fab, [], 3)["leaf-r0-p0"]
    k = KafkaConfig(bootstrap_servers=kafka_bootstrap, topics=TopicsConfig(config=kafka_topics()))
    gcfg = gnmi_config(
        {
            "config_subscription": {
                "name": "config",
                "target": "CONFIG_DB",
                "encoding": "json_ietf",
                "stream_mode": "sample",
                "sample_interval_s": 0.2,
                "paths": sorted(db),
            }
        }
    )

    def sent_at_least(out: Any, n: int) -> int:
        deadline = time.monotonic() + 30
        while out.stats.counts.get("gnmi_config_sent", 0) < n:
            assert time.monotonic() < deadline, out.stats.counts
            time.sleep(0.05)
        return int(out.stats.counts["gnmi_config_sent"])

    # the switch's notification timestamps a minute apart, as at a real configuration cadence
    # (a switch's events within a second of each other are one snapshot)
    clock = itertools.count(T0, 60 * S).__next__
    with ConfigDbTarget(db, clock=clock) as target:
        col, out = config_collector(
            gcfg, [TargetConfig("leaf-r0-p0", f"127.0.0.1:{target.port}")], k
        )
        col.start()
        try:
            before = sent_at_least(out, 1)
            db["PORT_QOS_MAP"]["Ethernet0"]["pfc_enable"] = "4"  # an operator's edit
            sent_at_least(out, before + 2)  # a whole sample taken after it
        finally:
            col.stop()
            out.close()
    assert not out.stats.counts.get("gnmi_config_unsent"), out.stats.counts
    recs = read_topic(kafka_bootstrap, k.topics.config)
    assert recs and {m.key for m in recs} == {b"leaf-r0-p0"}
    events = orjson.loads(recs[0].value)
    assert classify(events) == "switch"
    assert all(ev["tags"]["target"] == "CONFIG_DB" for ev in events)
    assert events[0]["values"]  # leaves, as gnmic's event format has them
    assert all(p.count("/") >= 3 for ev in events for p in ev["values"])

    pipe = Pipeline(Topology.from_dict(fab.topology_dict()))
    feed = ConfigFeed(k, pipe.topology, None)
    offsets: dict[int, int] = {}
    feed.start()
    try:
        deadline = time.monotonic() + 30
        while sum(offsets.values()) < len(recs):  # (the topic as the broker made it)
            assert time.monotonic() < deadline, offsets
            feed.poll(pipe, offsets)
            time.sleep(0.05)
    finally:
        feed.close()
    changes = pipe.roce.advance(None)
    assert [(c.device, c.port, c.field, c.old, c.new) for c in changes] == [
        ("leaf-r0-p0", "Ethernet0", "pfc", "3", "4")
    ]
    assert not pipe.stats.counts.get("roce_config_skipped"), pipe.stats.counts


def test_rocewatch_collect_runs_the_configuration_subscription(
    kafka_bootstrap: str, kafka_topics: Any
) -> None:
    """`rocewatch collect` (its runner) with ``gnmi.config_subscription``: the switch's tables
    reach the configuration topic, which it created with one partition, keyed by switch."""
    from kafka import KafkaConsumer

    from rocewatch.config import config_from_dict
    from rocewatch.runtime.collect import run_collect
    from rocewatch.sim import SimConfig
    from rocewatch.sim.config_target import ConfigDbTarget
    from rocewatch.sim.fabric import Fabric
    from rocewatch.sim.roce_config import config_db

    db = config_db(Fabric(SimConfig(nodes=2, nics_per_node=1, spines=2, naming="sonic")), [], 3)
    topics = {n: kafka_topics(n) for n in ("telemetry", "alerts", "actions", "dead_letter")}
    topics["config"] = kafka_topics("config")
    with ConfigDbTarget(db["leaf-r0-p0"]) as target:
        cfg = config_from_dict(
            {
                "kafka": {"bootstrap_servers": kafka_bootstrap, "topics": topics},
                "gnmi": {
                    "targets": [{"name": "leaf-r0-p0", "address": f"127.0.0.1:{target.port}"}],
                    # (the counters' subscription finds no counters on this target: it retries)
                    "config_subscription": {
                        "name": "config",
                        "target": "CONFIG_DB",
                        "encoding": "json_ietf",
                        "sample_interval_s": 60,
                        "paths": ["PORT_QOS_MAP", "PFC_WD"],
                    },
                },
            }
        )
        assert run_collect(cfg, None, [], None, duration=1.5) == 0
    recs = read_topic(kafka_bootstrap, topics["config"])
    assert recs and {m.key for m in recs} == {b"leaf-r0-p0"}
    paths = {p for m in recs for ev in orjson.loads(m.value) for p in ev["values"]}
    assert "/PORT_QOS_MAP/Ethernet0/pfc_enable" in paths
    c = KafkaConsumer(bootstrap_servers=[kafka_bootstrap])
    try:
        assert c.partitions_for_topic(topics["config"]) == {0}
    finally:
        c.close()


def test_each_record_goes_to_its_devices_domain_and_the_domains_facing_it() -> None:
    """With fabric domains (each leaf and its nodes a pod, the spine in none), a NIC snapshot
    goes to its node's domain only, a leaf's events to its pod and to the spine's domain
    (the cables between them), the spine's to every domain; bad records are counted."""
    from rocewatch.bus.config import KafkaConfig
    from rocewatch.pipeline import Pipeline
    from rocewatch.runtime.config_feed import ConfigFeed
    from tests.test_grouping import PODS

    pipes = {d: Pipeline(PODS, domain=d) for d in PODS.domains}
    feeds = {d: ConfigFeed(KafkaConfig(), PODS, d) for d in PODS.domains}
    nic = {"timestamp": T0, "node": "gpu-003", "nic": "mlx5_0", "mtu": 9000}

    def event(switch: str) -> dict[str, Any]:
        return {
            "name": "config",
            "timestamp": T0,
            "tags": {"source": f"{switch}:8080", "target": "CONFIG_DB"},
            "values": {"/PORT_QOS_MAP/Ethernet9/pfc_enable": "3"},
        }

    records = [("nic", nic), ("leaf-1", [event("leaf-1")]), ("spine-0", event("spine-0"))]
    got: dict[str, set[str]] = {d: set() for d in PODS.domains}
    for what, doc in records:
        for d, feed in feeds.items():
            if feed._take(pipes[d], orjson.dumps(doc)):
                got[d].add(what)
    assert got == {
        "": {"leaf-1", "spine-0"},
        "pod-0": {"spine-0"},
        "pod-1": {"nic", "leaf-1", "spine-0"},
    }
    assert [len(p.roce.pending) for p in pipes.values()] == [2, 1, 3]
    for bad in (b"{", b"[1, 2]", b'{"node": "gpu-003"}'):
        assert feeds["pod-1"]._take(pipes["pod-1"], bad) == 0
    assert pipes["pod-1"].stats.counts["config_record_skipped"] == 3
