"""Scale-out detect over a real Kafka broker: two instances give what one gives, and a kill -9
of one of them loses and doubles nothing."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from kafka import KafkaConsumer
from kafka.errors import UnknownError as KafkaUnknownError
from kafka.producer.transaction_manager import TransactionalRequestResult
from kafka.structs import TopicPartition

from detectors.registry import metrics_read
from rocewatch.bus import transactions
from rocewatch.bus.publish import make_producer
from rocewatch.bus.signing import load_state_keys
from rocewatch.bus.state_store import StateSnapshot, StateStore
from rocewatch.bus.topics import (
    MAX_MESSAGE_BYTES,
    RECORD_OVERHEAD,
    ensure_detect_topics,
    record_limits,
)
from rocewatch.bus.transactions import DetectWriter, FencedExecutor
from rocewatch.config import Config, KafkaConfig, TopicsConfig
from rocewatch.core.errors import ConfigError, Fenced, ProducerFailed
from rocewatch.core.model import Alert
from rocewatch.pipeline import Output
from rocewatch.replay import replay
from rocewatch.runtime.delivery import Published, send_events
from rocewatch.runtime.publish import publish_scenario
from rocewatch.runtime.service import DetectService
from rocewatch.runtime.steps import StepsMessage, decode_steps, encode_steps
from rocewatch.runtime.timing import SYSTEM_CLOCK
from rocewatch.sim import write_scenario
from rocewatch.sim.faults import FlakyLink
from rocewatch.sim.scenarios import default_scenario
from tests.notify_receiver import free_port
from tests.support.state_keys import SIGNING, SIGNING_YAML
from tests.support.until_done import run_service, stop_when_done
from tests.test_kafka_pipeline import (
    comparable,
    read_topic,
    sorted_actions,
    wait_for_outputs,
    wait_for_records,
)
from tests.test_kafka_resilience import scrape, set_topic_limit
from tests.test_membership import SLURMD_NODE, submit_job

PARTITIONS = 4


def so_cfg(bootstrap: str, kafka_topics: Any, run: str, tmp: Path, scenario: Path) -> Config:
    names = ("telemetry", "alerts", "actions", "dead_letter", "steps", "state", "rollups")
    topics = TopicsConfig(**{n: kafka_topics(f"{run}.{n}") for n in names})
    k = KafkaConfig(
        bootstrap_servers=bootstrap,
        topics=topics,
        group_id=kafka_topics(f"{run}.group"),
        partitions=PARTITIONS,
        commit_interval_s=0.5,
        idle_flush_s=2.0,
        session_timeout_ms=6000,
        scale_out=True,
        state_signing=SIGNING,
    )
    return Config(
        topology=str(scenario / "topology.yaml"), kafka=k, state_dir=str(tmp / run / "state")
    )


def write_conf(cfg: Config, path: Path) -> Path:
    k = cfg.kafka
    doc = {
        "topology": cfg.topology,
        "state_dir": cfg.state_dir,
        "kafka": {
            "bootstrap_servers": k.bootstrap_servers,
            "group_id": k.group_id,
            "partitions": k.partitions,
            "commit_interval_s": k.commit_interval_s,
            "idle_flush_s": k.idle_flush_s,
            "session_timeout_ms": k.session_timeout_ms,
            "scale_out": True,
            "topics": dataclasses.asdict(k.topics),
            "state_signing": SIGNING_YAML,
        },
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def outputs(bootstrap: str, cfg: Config) -> tuple[list[dict], list[dict]]:
    t = cfg.kafka.topics
    alerts = [orjson.loads(m.value) for m in read_topic(bootstrap, t.alerts)]
    actions = [orjson.loads(m.value) for m in read_topic(bootstrap, t.actions)]
    return alerts, actions


def event_keys(alerts: list[dict]) -> Counter[tuple[str, str, str, str]]:
    return Counter((a["fingerprint"], a["startsAt"], a["status"], a["endsAt"]) for a in alerts)


class Instance:
    """``rocewatch detect --scale-out`` in its own process, its log in a file."""

    def __init__(self, conf: Path, log: Path, max_idle: float) -> None:
        self.log = log
        cmd = [sys.executable, "-m", "rocewatch.cli", "detect", "--config", str(conf)]
        cmd += ["--scale-out", "--max-idle", str(max_idle)]
        self.fh = log.open("wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.fh, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def partitions(self) -> list[int] | None:
        found = re.findall(r"aggregating telemetry partitions \[([0-9, ]*)\]", self.text())
        if not found:
            return None
        return [int(x) for x in found[-1].split(",") if x.strip()]

    def detecting(self) -> bool:
        t = self.text()
        return t.rfind("detect stage active") > t.rfind("detect stage handed over")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.fh.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.fh.close()

    def finish(self) -> int:
        """A graceful stop (SIGTERM: final checkpoint, summary, exit), once the test has seen
        the outputs complete; its exit code. (``--max-idle`` is only a safety net: idling it
        out would cost each test its whole length.)"""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(120)


def wait_for_split(a: Instance, b: Instance, timeout: float = 90.0) -> None:
    """Both instances hold telemetry partitions, together all of them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pa, pb = a.partitions(), b.partitions()
        if pa and pb and sorted(pa + pb) == list(range(PARTITIONS)):
            return
        assert a.proc.poll() is None, a.text()[-3000:]
        assert b.proc.poll() is None, b.text()[-3000:]
        time.sleep(0.3)
    raise AssertionError(f"no split: {a.text()[-1500:]}\n---\n{b.text()[-1500:]}")


def start_pair(conf: Path, tmp_path: Path) -> tuple[Instance, Instance]:
    """Two instances that have split the partitions: (the one running the detect stage, the
    other). Both are stopped if they do not get there."""
    a = Instance(conf, tmp_path / "a.log", max_idle=45)
    time.sleep(1.0)  # a joins first and takes the detect stage
    b = Instance(conf, tmp_path / "b.log", max_idle=45)
    try:
        wait_for_split(a, b)
        holder, other = settled_holder(a, b)
    except BaseException:
        a.stop()
        b.stop()
        raise
    return holder, other


def settled_holder(a: Instance, b: Instance, timeout: float = 30.0) -> tuple[Instance, Instance]:
    """(the instance running the detect stage, the other), once exactly one of them runs it
    and still does a second and a half later (right after the split, the first one's log can
    still say "active" for a moment before it hands the stage over)."""
    deadline = time.monotonic() + timeout
    last: Instance | None = None
    since = 0.0
    while time.monotonic() < deadline:
        now = [i for i in (a, b) if i.detecting()]
        t = time.monotonic()
        if len(now) != 1:
            last = None
        elif now[0] is not last:
            last, since = now[0], t
        elif t - since >= 1.5:  # the only holder at every look for that long
            return (a, b) if last is a else (b, a)
        time.sleep(0.2)
    raise AssertionError("no instance settled into running the detect stage")


def publish_until_alerts(bootstrap: str, cfg: Config, scenario: Path, speed: float) -> Any:
    """Publish the scenario at ``speed`` in the background; return the thread once the first
    two alert events are out (mid-stream)."""
    pub = threading.Thread(target=publish_scenario, args=(scenario, cfg, speed), daemon=True)
    pub.start()
    wait_for_records(bootstrap, cfg.kafka.topics.alerts, 2)
    return pub


def assert_replay_outputs_once(bootstrap: str, cfg: Config, replay_result: Any) -> None:
    """The alert events and actions are the replay's, none published twice, each drain once."""
    alerts, actions = outputs(bootstrap, cfg)
    doubled = [k for k, c in event_keys(alerts).items() if c > 1]
    assert not doubled, f"published twice: {doubled}"
    assert comparable(alerts) == comparable(replay_result.alerts)
    drains = Counter(x["node"] for x in actions if x["action"] == "drain")
    assert drains and all(c == 1 for c in drains.values()), drains
    assert sorted_actions(actions) == sorted_actions(replay_result.actions)


def test_idle_report_stops_counting_once_records_arrive(
    kafka_bootstrap, kafka_topics, tmp_path, scenario
):
    """Stage 2 leaves a partition reported idle out of its watermark only while the broker
    holds nothing past the offset in the report: once a record arrives there, the other
    partitions' closed steps must not move the watermark past it (its owner may say so late)."""
    from kafka import KafkaProducer

    from rocewatch.runtime.timing import END_EVERY_S

    cfg = so_cfg(kafka_bootstrap, kafka_topics, "quiet", tmp_path, scenario)
    kafka_topics.create("quiet.telemetry", partitions=PARTITIONS)
    svc = DetectService(cfg)
    producer = KafkaProducer(bootstrap_servers=[kafka_bootstrap])
    try:
        (det,) = svc.det.shards  # one fabric domain
        steps_tp = TopicPartition(cfg.kafka.topics.steps, 0)
        det.consumer.assign([steps_tp])
        det.assigned([steps_tp])
        st = det.state
        assert st is not None and det.active
        closed = 1000 * det.step_ns
        now = time.monotonic()
        for p in range(PARTITIONS - 1):  # three partitions stream and have closed to `closed`
            assert det.assembly.take(st, StepsMessage(p, None, closed, False, [], None, 7), now)
        # the last is read to its end (offset 0, nothing published) and reported idle
        quiet = PARTITIONS - 1
        det.assembly.idle_offset[quiet] = 0
        det.assembly.take(st, StepsMessage(quiet, None, None, True, [], None, 0), now)
        assert det.assembly.target(st, now) == closed  # left out: the others set the watermark
        producer.send(cfg.kafka.topics.telemetry, b"sample", partition=quiet).get(timeout=10)
        # a burst: another partition closes a step at once, well within END_EVERY_S of the last
        # look at the end offsets (the clock given is the same): the ends are asked again, and
        # the new record holds the watermark
        assert det.assembly.take(
            st, StepsMessage(0, None, closed + det.step_ns, False, [], None, 8), now
        )
        assert det.assembly.target(st, now) is None
        time.sleep(END_EVERY_S + 0.1)
        # a record past the report: the partition holds the watermark until its owner closes
        assert det.assembly.target(st, time.monotonic()) is None
        det.assembly.take(
            st, StepsMessage(quiet, None, closed - det.step_ns, False, [], None, 1), now
        )
        assert det.assembly.target(st, time.monotonic()) == closed - det.step_ns
    finally:
        producer.close()
        svc.close()


def test_steps_message_round_trip() -> None:
    import polars as pl

    from detectors.windows import AGG_SCHEMA

    rows = pl.DataFrame(
        {"step": [7], "device": ["sw1"], "port": ["p1"], "qual": [""], "metric": ["m"]}
    ).with_columns(
        *[
            pl.lit(None, dtype=t).alias(c)
            for c, t in AGG_SCHEMA.items()
            if c not in ("device", "port", "qual", "metric")
        ]
    )
    msg = StepsMessage(3, 100, 800, False, [5, 6], rows, offset=42)
    back = decode_steps(encode_steps(msg))
    assert (back.partition, back.closed_from, back.closed_to, back.idle) == (3, 100, 800, False)
    assert back.sent == [5, 6] and back.offset == 42
    assert back.rows is not None and back.rows.equals(rows)
    assert back.forest is None
    # the isolation forest's window values follow the rows, with or without rows
    forest = pl.DataFrame(
        {"end": [10**9], "kind": ["nic"], "device": ["n1"], "port": ["mlx5_0"], "cov": [1.0]}
    ).with_columns(pl.lit(float("nan")).alias("nic_rx_bytes"), pl.lit(7).alias("ts"))
    for r in (rows, None):
        back = decode_steps(encode_steps(StepsMessage(3, 100, 800, False, [], r, 1, forest)))
        assert back.forest is not None and back.forest.equals(forest)
        assert (back.rows is None) == (r is None) and (r is None or back.rows.equals(r))
    from rocewatch.core.errors import BadInput

    with pytest.raises(BadInput):
        decode_steps(b"RWS1\xff\xff\xff\x00{")
    # the key crosses as codes into tables in the header: a code past its table is bad input
    data = encode_steps(msg)
    n = int.from_bytes(data[4:8], "little")
    head = orjson.loads(data[8 : 8 + n])
    assert head["keys"] == [["sw1"], ["p1"], [""], ["m"]]
    head["keys"][0] = []
    forged = orjson.dumps(head)
    with pytest.raises(BadInput, match="device code"):
        decode_steps(b"RWS2" + len(forged).to_bytes(4, "little") + forged + data[8 + n :])
    # a null key string crosses as a null code and comes back null
    gaps = pl.concat([rows, rows.with_columns(pl.lit(None, dtype=pl.String).alias("port"))])
    back = decode_steps(encode_steps(StepsMessage(3, 100, 800, False, [], gaps, offset=1)))
    assert back.rows is not None and back.rows.equals(gaps)
    # the detect stage's coded form has no code for a null: such rows come as strings
    from rocewatch.core.keys import KEYS

    back = decode_steps(encode_steps(StepsMessage(3, 100, 800, False, [], gaps)), KEYS)
    assert back.rows is not None and back.rows.equals(gaps)
    # a message written before the codes (strings in the rows) is still read
    buf = io.BytesIO()
    rows.write_ipc(buf, compression="zstd")
    old = orjson.dumps({"p": 3, "from": 100, "to": 800, "idle": False, "sent": [5]})
    back = decode_steps(b"RWS1" + len(old).to_bytes(4, "little") + old + buf.getvalue())
    assert back.rows is not None and back.rows.equals(rows) and back.offset == -1


def publish_to_pair(
    conf: Path,
    tmp_path: Path,
    scenario: Path,
    cfg: Config,
    n: int,
    want: tuple[list[dict], list[dict]],
    domains: list[str] | None = None,
) -> None:
    """Two instance processes split the telemetry partitions (and, with ``domains``, the
    domains' detect stages); the scenario is published and both run until the outputs bring
    ``want``'s (alerts, actions) to their final states, then stop gracefully."""
    # (an instance exits after 45 s without input, counted from its group join: on a loaded
    # machine the second one may take a while to start and join)
    a = Instance(conf, tmp_path / "a.log", max_idle=45)
    time.sleep(1.0)  # a joins first and takes the detect stage
    b = Instance(conf, tmp_path / "b.log", max_idle=45)
    try:
        wait_for_split(a, b)
        if domains:
            wait_for_domains(a, b, domains)
        assert publish_scenario(scenario, cfg) == n
        wait_for_outputs(cfg.kafka.bootstrap_servers, cfg, *want)
        assert a.finish() == 0, a.text()[-3000:]
        assert b.finish() == 0, b.text()[-3000:]
    finally:
        a.stop()
        b.stop()


def test_two_instances_produce_what_one_produces(
    kafka_bootstrap, kafka_topics, tmp_path, scenario, replay_result
):
    # one instance, in this process
    one = so_cfg(kafka_bootstrap, kafka_topics, "one", tmp_path, scenario)
    kafka_topics.create("one.telemetry", partitions=PARTITIONS)
    n = publish_scenario(scenario, one)
    svc = DetectService(one)
    worker, errors = run_service(svc, 4.0)
    stop_when_done(svc, worker)
    assert not errors, errors
    assert svc.agg.samples == n
    alerts1, actions1 = outputs(kafka_bootstrap, one)
    # the scale-out path finds what replay finds, and decides the same drains
    assert comparable(alerts1) == comparable(replay_result.alerts)
    assert sorted_actions(actions1) == sorted_actions(replay_result.actions)
    assert max(event_keys(alerts1).values()) == 1

    # two instances, as processes, sharing the work
    two = so_cfg(kafka_bootstrap, kafka_topics, "two", tmp_path, scenario)
    kafka_topics.create("two.telemetry", partitions=PARTITIONS)
    conf = write_conf(two, tmp_path / "two.yaml")
    publish_to_pair(conf, tmp_path, scenario, two, n, (alerts1, actions1))
    alerts2, actions2 = outputs(kafka_bootstrap, two)
    assert event_keys(alerts2) == event_keys(alerts1)
    assert sorted_actions(actions2) == sorted_actions(actions1)
    # both did part of the aggregation
    summaries = [json.loads(p.read_text()) for p in Path(two.state_dir).glob("scaleout-*.json")]
    assert len(summaries) == 2
    assert all(s["samples"] > 0 for s in summaries), [s["samples"] for s in summaries]
    assert sum(s["samples"] for s in summaries) >= n


@pytest.fixture(scope="module")
def pod_scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scenario on a fabric of two pods of four nodes, each pod a domain (its leaves and
    nodes), the spines in none: the storm starts in pod-1 and crosses the spines, and a
    flaky cable joins a pod-1 leaf to a spine (judged from both ends, one in each domain:
    without the ends facing a domain in its steps, the spine's end raises an alert of its
    own, which replay does not)."""
    d = tmp_path_factory.mktemp("pods")
    base = default_scenario(nodes=8, duration_s=30.0, seed=3)
    uplink = FlakyLink(
        onset_s=20.0, duration_s=8.0, uplink=True, switch="leaf-r5-p1", spine="spine-2"
    )
    cfg = dataclasses.replace(
        base, nodes_per_leaf=4, pod_domains=True, faults=(*base.faults, uplink)
    )
    write_scenario(cfg, d)
    return d


def domains_held(inst: Instance) -> list[str] | None:
    found = re.findall(r"detect stages held here: (.*)", inst.text())
    if not found:
        return None
    return [] if found[-1] == "none" else re.findall(r"'([^']*)'", found[-1])


def wait_for_domains(a: Instance, b: Instance, names: list[str], timeout: float = 60) -> None:
    """Both instances run the detect stage of some domain, together of every one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ha, hb = domains_held(a), domains_held(b)
        if ha and hb and sorted(ha + hb) == names:
            return
        time.sleep(0.3)
    raise AssertionError(f"domains not split: {domains_held(a)} / {domains_held(b)}")


def one_instance(
    bootstrap: str, kafka_topics: Any, tmp_path: Path, scenario: Path
) -> tuple[DetectService, int, list[dict], list[dict]]:
    """The scenario through one scale-out instance in this process: (the service, samples
    published, its alert events, its actions)."""
    cfg = so_cfg(bootstrap, kafka_topics, "dom1", tmp_path, scenario)
    kafka_topics.create("dom1.telemetry", partitions=PARTITIONS)
    n = publish_scenario(scenario, cfg)
    svc = DetectService(cfg)
    worker, errors = run_service(svc, 4.0)
    stop_when_done(svc, worker)
    assert not errors, errors
    assert svc.agg.samples == n
    alerts, actions = outputs(bootstrap, cfg)
    return svc, n, alerts, actions


@pytest.fixture(scope="module")
def pod_one(
    shared_kafka_topics: Any, tmp_path_factory: pytest.TempPathFactory, pod_scenario: Path
) -> tuple[DetectService, int, list[dict], list[dict]]:
    """``one_instance`` over the pod scenario, once for the module: the two tests that
    compare two instances with one take their reference from the same run."""
    topics = shared_kafka_topics("pod_one")
    return one_instance(topics.bootstrap, topics, tmp_path_factory.mktemp("pod_one"), pod_scenario)


def rule_alerts(alerts: list[dict]) -> dict[tuple[str, str], tuple]:
    """Final states of every alert but the FabricIncidents (their scopes are per domain)."""
    return {k: v for k, v in comparable(alerts).items() if v[2] != "FabricIncident"}


def test_a_fabric_of_domains_runs_its_detect_stage_on_both_instances(
    kafka_bootstrap, kafka_topics, tmp_path, pod_scenario, pod_one
):
    """Split into domains, the detect stage runs as one stage per domain, spread over the
    instances. A domain's alerts do not depend on who evaluates it, and each domain speaks
    only for its own devices, judging the cable ends facing it with both sides: the storm
    that crosses domains has the origin and victims replay finds, and nothing is doubled."""
    expected = replay(pod_scenario, tmp_path / "replay")
    svc, n, alerts1, actions1 = pod_one
    alerts1, actions1 = copy.deepcopy((alerts1, actions1))  # (read-only here; shared)
    assert [d.domain for d in svc.det.shards] == ["", "pod-0", "pod-1"]
    assert max(event_keys(alerts1).values()) == 1
    # the rule detectors' alerts are replay's, over the whole fabric
    storm = {a["labels"].get("role") for a in alerts1 if a["labels"]["alertname"] == "PFCStorm"}
    assert storm == {"origin", "victim"}
    flaky = {
        (a["labels"].get("switch"), a["labels"].get("port"))
        for a in alerts1
        if a["labels"]["alertname"] == "FlakyLink"
    }
    # the cable across domains raised once, at the leaf (the NIC cable is the other fault)
    assert ("leaf-r5-p1", "Ethernet2/3") in flaky and len(flaky) == 2, flaky
    assert rule_alerts(alerts1) == rule_alerts(expected.alerts)
    # each fabric-wide scope (a rail, a job) is raised per domain, and says which
    incidents = [a for a in alerts1 if a["labels"]["alertname"] == "FabricIncident"]
    assert incidents and all(a["labels"].get("domain") in svc.routes.names for a in incidents)
    drains = Counter(x["node"] for x in actions1 if x["action"] == "drain")
    assert drains and all(c == 1 for c in drains.values()), drains

    # two instances, as processes: the domains' stages split between them
    two = so_cfg(kafka_bootstrap, kafka_topics, "dom2", tmp_path, pod_scenario)
    kafka_topics.create("dom2.telemetry", partitions=PARTITIONS)
    conf = write_conf(two, tmp_path / "dom2.yaml")
    publish_to_pair(conf, tmp_path, pod_scenario, two, n, (alerts1, actions1), svc.routes.names)
    alerts2, actions2 = outputs(kafka_bootstrap, two)
    assert event_keys(alerts2) == event_keys(alerts1)
    assert sorted_actions(actions2) == sorted_actions(actions1)
    summaries = [json.loads(p.read_text()) for p in Path(two.state_dir).glob("scaleout-*.json")]
    held = [s["domains_held"] for s in summaries]
    assert all(held) and sorted(d for h in held for d in h) == svc.routes.names, held
    assert all(s["detect_cpu_s"] > 0 for s in summaries)


@pytest.mark.slow
def test_each_domains_pipeline_fed_its_routed_steps_raises_what_the_whole_fabric_raises(
    pod_scenario,
):
    """Without Kafka: the pod scenario's steps split by ``DomainRoutes`` and evaluated by one
    pipeline per domain (as each domain's detect stage, told its domain) raise the rule alerts
    one pipeline over the whole fabric raises. The storm starts at a pod-1 NIC and crosses the
    spines: the domain '' sees the pod-1 leaf only on its uplinks, so waiting to hear that
    leaf's pause (a relay read less often than its victim) grouped the spine's victims under
    origin 'unknown' for a moment, one alert more than replay, which traces them from the NIC."""
    import polars as pl

    from detectors.windows import Step, WindowEngine
    from rocewatch.core.stats import Stats
    from rocewatch.core.topology import Topology
    from rocewatch.pipeline import Pipeline
    from rocewatch.replay import merged, scenario_sources
    from rocewatch.runtime.steps import DomainRoutes, steps_coded

    topo = Topology.load(pod_scenario / "topology.yaml")
    cfg = Config()
    routes = DomainRoutes(topo)
    assert routes.names == ["", "pod-0", "pod-1"]
    engine = WindowEngine(cfg.window, Stats())
    steps: list[Step] = []
    sources = scenario_sources(pod_scenario, topo, Stats(), cfg.window)
    try:
        for df, wm in merged(sources, engine.lateness_ns()):
            if df.height:
                engine.add(df)
            if wm >= 0:
                steps += engine.close_until(wm)
        steps += engine.close_until(2**62)
    finally:
        for src in sources:
            src.close()
    whole = Pipeline(topo, cfg, stats=Stats())
    domains = {n: Pipeline(topo, cfg, stats=Stats(), domain=n) for n in routes.names}
    for step in steps:
        whole.evaluate([step])
        coded = steps_coded([step], engine.step_ns, engine.series)
        for name, part in zip(routes.names, routes.split(coded), strict=True):
            rows = part.decoded().drop("step") if part is not None else None
            frame = rows if rows is not None else pl.DataFrame(schema=step.frame.schema)
            domains[name].evaluate([Step(step.start, step.end, frame=frame)])
    want = rule_alerts([a.to_json() for a in whole.all_alerts()])
    got = rule_alerts([a.to_json() for p in domains.values() for a in p.all_alerts()])
    assert {v[2] for v in want.values()} >= {"PFCStorm", "FlakyLink"}
    assert got == want


def test_kill_one_of_two_instances_running_domains_loses_and_doubles_nothing(
    kafka_bootstrap, kafka_topics, tmp_path, pod_scenario, pod_one
):
    """A kill -9 of an instance mid-stream: the other takes over its domains' detect stages
    (each from its own checkpoint and transactional id), and publishes what one instance
    publishes, nothing twice."""
    alerts1, actions1 = copy.deepcopy(pod_one[2:])
    cfg = so_cfg(kafka_bootstrap, kafka_topics, "domkill", tmp_path, pod_scenario)
    kafka_topics.create("domkill.telemetry", partitions=PARTITIONS)
    conf = write_conf(cfg, tmp_path / "domkill.yaml")
    names = ["", "pod-0", "pod-1"]
    a = Instance(conf, tmp_path / "a.log", max_idle=45)
    time.sleep(1.0)
    b = Instance(conf, tmp_path / "b.log", max_idle=45)
    try:
        wait_for_split(a, b)
        wait_for_domains(a, b, names)
        pub = publish_until_alerts(kafka_bootstrap, cfg, pod_scenario, 1.5)
        assert pub.is_alive(), "the stream ended before the kill"
        victim, survivor = a, b
        victim.proc.send_signal(signal.SIGKILL)
        victim.wait(10)
        pub.join(120)
        wait_for_outputs(kafka_bootstrap, cfg, alerts1, actions1)
        assert survivor.finish() == 0, survivor.text()[-3000:]
    finally:
        a.stop()
        b.stop()
    log = survivor.text()
    assert domains_held(survivor) == names, log[-2000:]
    alerts, actions = outputs(kafka_bootstrap, cfg)
    doubled = [k for k, c in event_keys(alerts).items() if c > 1]
    assert not doubled, f"published twice: {doubled}"
    assert comparable(alerts) == comparable(alerts1)
    assert sorted_actions(actions) == sorted_actions(actions1)


def test_kill_one_of_two_instances_loses_and_doubles_nothing(
    kafka_bootstrap, kafka_topics, tmp_path, scenario, replay_result
):
    cfg = so_cfg(kafka_bootstrap, kafka_topics, "kill", tmp_path, scenario)
    kafka_topics.create("kill.telemetry", partitions=PARTITIONS)
    conf = write_conf(cfg, tmp_path / "kill.yaml")
    victim, survivor = start_pair(conf, tmp_path)
    try:
        # publish at 1.5x telemetry speed (20 s) in the background, so the kill lands mid-stream
        # (at 3x the publisher, now quicker to encode, could finish before the second alert)
        pub = publish_until_alerts(kafka_bootstrap, cfg, scenario, 1.5)
        assert pub.is_alive(), "the stream ended before the kill"
        assert victim.proc.poll() is None, victim.text()[-3000:]
        victim.proc.send_signal(signal.SIGKILL)
        victim.wait(10)
        pub.join(120)
        wait_for_outputs(kafka_bootstrap, cfg, replay_result.alerts, replay_result.actions)
        assert survivor.finish() == 0, survivor.text()[-3000:]
    finally:
        victim.stop()
        survivor.stop()
    log = survivor.text()
    assert survivor.partitions() == list(range(PARTITIONS)), log[-2000:]
    assert survivor.detecting(), log[-2000:]
    assert "resumes at offset" in log, "the survivor did not resume the victim's partitions"
    # the survivor resumed the victim's partitions where their state left off: no sample was
    # dropped as late (records read twice, from before the state's offset, would be)
    (summary,) = [json.loads(f.read_text()) for f in Path(cfg.state_dir).glob("scaleout-*.json")]
    late = {k: v for k, v in summary["stats"].items() if k.startswith("late")}
    assert not late, late
    assert_replay_outputs_once(kafka_bootstrap, cfg, replay_result)


def test_a_stalled_instance_comes_back_fenced_and_nothing_doubles(
    kafka_bootstrap, kafka_topics, tmp_path, scenario, replay_result
):
    """The instance running the detect stage stops (SIGSTOP: a VM pause, a stuck disk) for
    longer than the session timeout, the other takes everything over, then the stalled one
    wakes up mid-stream still believing it holds its partitions and the stage. Nothing it had
    in hand may be published or drained a second time, and nothing may be lost."""
    cfg = so_cfg(kafka_bootstrap, kafka_topics, "stall", tmp_path, scenario)
    kafka_topics.create("stall.telemetry", partitions=PARTITIONS)
    conf = write_conf(cfg, tmp_path / "stall.yaml")
    stalled, other = start_pair(conf, tmp_path)
    try:
        pub = publish_until_alerts(kafka_bootstrap, cfg, scenario, 1.0)  # 30 s
        assert pub.is_alive(), "the stream ended before the stall"
        stalled, other = settled_holder(stalled, other)  # the holder now, not at the start
        stalled.proc.send_signal(signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if other.detecting() and other.partitions() == list(range(PARTITIONS)):
                    break
                time.sleep(0.3)
            else:
                raise AssertionError(f"no takeover: {other.text()[-2000:]}")
        finally:
            stalled.proc.send_signal(signal.SIGCONT)
        assert pub.is_alive(), "the stream ended during the stall: nothing in flight"
        pub.join(120)
        wait_for_outputs(kafka_bootstrap, cfg, replay_result.alerts, replay_result.actions)
        assert stalled.finish() == 0, stalled.text()[-3000:]
        assert other.finish() == 0, other.text()[-3000:]
    finally:
        stalled.stop()
        other.stop()
    log = stalled.text()
    # the stalled instance found out, from the group or from the broker's fence
    assert re.search(r"detect stage (lost|handed over \(fenced\))", log), log[-3000:]
    assert_replay_outputs_once(kafka_bootstrap, cfg, replay_result)
    # and no sample was dropped as late by either instance
    for f in Path(cfg.state_dir).glob("scaleout-*.json"):
        stats = json.loads(f.read_text())["stats"]
        late = {k: v for k, v in stats.items() if k.startswith("late")}
        assert not late, (f.name, late)


def test_states_too_large_for_the_state_topic_are_not_sent_and_the_stream_goes_on(
    kafka_bootstrap, kafka_topics, tmp_path, scenario, replay_result
):
    """A state topic that takes no record of a state's size (an operator created it with a
    small max.message.bytes). A refused record is fatal to an idempotent producer: it drops
    everything it holds, the steps with it. So the instance reads the topic's limit, sends no
    state above it (counted), and the stream goes on: the replay's alerts and actions once
    each, the fence records (small) still written before each drain."""
    cfg = so_cfg(kafka_bootstrap, kafka_topics, "refused", tmp_path, scenario)
    kafka_topics.create("refused.telemetry", partitions=PARTITIONS)
    kafka_topics.create(
        "refused.state",
        partitions=PARTITIONS + 1,
        **{"cleanup.policy": "compact", "max.message.bytes": "20000"},
    )
    svc = DetectService(cfg)
    assert svc.store.max_bytes == 20000 - RECORD_OVERHEAD
    worker, errors = run_service(svc, 8.0)
    publish_scenario(scenario, cfg, 2.0)
    stop_when_done(svc, worker)
    assert not worker.is_alive() and not errors, errors
    stats = svc.summary()["stats"]
    skipped = stats.get("state_too_large_by", {})
    assert skipped.get("detect", 0) >= 2 and any(k.startswith("agg-") for k in skipped), stats
    assert "detect_transaction_failed" not in stats and "detect_stage_fenced" not in stats
    assert not {k: v for k, v in stats.items() if k.startswith("late")}, stats
    assert_replay_outputs_once(kafka_bootstrap, cfg, replay_result)


def test_steps_and_rollups_topics_with_a_small_record_limit_get_smaller_messages(
    kafka_bootstrap, kafka_topics, tmp_path, scenario, replay_result
):
    """Steps and rollups topics an operator created with a smaller max.message.bytes than
    rocewatch gives them (here below one catch-up close). A refused record stops an instance,
    so the aggregate stage reads both limits at start and sends more, smaller messages: the
    steps split on whole steps, the rollups on rows. The stream's alerts and actions are
    replay's, once each."""
    cfg = so_cfg(kafka_bootstrap, kafka_topics, "small", tmp_path, scenario)
    # with storage the aggregate stage also makes the metric rollups
    cfg = dataclasses.replace(cfg, storage_url=f"sqlite:///{tmp_path / 'rocewatch.db'}")
    limit = 96_000
    kafka_topics.create("small.telemetry", partitions=PARTITIONS)
    kafka_topics.create("small.steps", partitions=1, **{"max.message.bytes": str(limit)})
    kafka_topics.create("small.rollups", partitions=PARTITIONS, **{"max.message.bytes": "20000"})
    publish_scenario(scenario, cfg)  # all of it first: the first closes span many steps
    svc = DetectService(cfg)
    assert svc.agg.steps_limit == limit - RECORD_OVERHEAD
    assert svc.agg.rollups_limit == 20000 - RECORD_OVERHEAD
    worker, errors = run_service(svc, 8.0)
    stop_when_done(svc, worker)
    assert not worker.is_alive() and not errors, errors
    stats = svc.summary()["stats"]
    assert stats.get("steps_messages_split", 0) >= 1, stats
    assert stats.get("rollups_messages_split", 0) >= 1, stats
    assert not {k: v for k, v in stats.items() if k.startswith("late")}, stats
    assert_replay_outputs_once(kafka_bootstrap, cfg, replay_result)
    sizes = [len(m.value) for m in read_topic(kafka_bootstrap, cfg.kafka.topics.steps)]
    assert sizes and max(sizes) <= limit - RECORD_OVERHEAD


def test_a_topic_on_the_brokers_default_limit_reads_as_that_limit(kafka_bootstrap, kafka_topics):
    """A topic without its own max.message.bytes takes the broker's default (1 MiB here), not
    the 64 MiB rocewatch gives the topics it creates: kafka-python's describe_configs leaves
    such a value out unless asked for every value, and a limit taken too high is a refused,
    fatal record later."""
    plain = kafka_topics.create("plain.steps", partitions=1)
    own = kafka_topics.create("own.steps", partitions=1, **{"max.message.bytes": "300000"})
    k = KafkaConfig(bootstrap_servers=kafka_bootstrap)
    limits = record_limits(k, [plain, own, kafka_topics("absent.steps")])
    assert limits[plain] == 1048588 - RECORD_OVERHEAD  # the broker's message.max.bytes
    assert limits[own] == 300000 - RECORD_OVERHEAD
    assert limits[kafka_topics("absent.steps")] == MAX_MESSAGE_BYTES  # created later, by us


def test_a_topology_with_more_domains_gets_a_steps_partition_for_each(
    kafka_bootstrap, kafka_topics, tmp_path, scenario
):
    """A steps topic made for one domain (every topic before domains) grows to one partition
    per domain when the topology names more; one domain asks for nothing more."""
    from kafka import KafkaAdminClient
    from kafka.errors import InvalidPartitionsError

    cfg = so_cfg(kafka_bootstrap, kafka_topics, "grow", tmp_path, scenario)
    kafka_topics.create("grow.telemetry", partitions=PARTITIONS)
    kafka_topics.create("grow.steps", partitions=1)
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)

    def steps_partitions() -> int:
        return len(admin.describe_topics([cfg.kafka.topics.steps])[0]["partitions"])

    try:
        assert ensure_detect_topics(cfg.kafka, 1) == PARTITIONS
        assert steps_partitions() == 1
        assert ensure_detect_topics(cfg.kafka, 3) == PARTITIONS
        deadline = time.monotonic() + 30
        while steps_partitions() < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert steps_partitions() == 3
        # what a second instance starting at the same moment meets (and lets pass)
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions({cfg.kafka.topics.steps: 3})
    finally:
        admin.close()


def test_a_steps_topic_too_small_for_one_step_stops_the_instance_with_what_to_change(
    kafka_bootstrap, kafka_topics, tmp_path, scenario
):
    """One step alone larger than the steps topic takes: the instance stops at once with an
    error naming the topic and the size it needs, not a refused record."""
    cfg = so_cfg(kafka_bootstrap, kafka_topics, "tiny", tmp_path, scenario)
    kafka_topics.create("tiny.telemetry", partitions=PARTITIONS)
    kafka_topics.create("tiny.steps", partitions=1, **{"max.message.bytes": "5000"})
    publish_scenario(scenario, cfg)
    svc = DetectService(cfg)
    worker, errors = run_service(svc, 8.0)
    worker.join(120)
    assert not worker.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ConfigError), errors
    msg = str(errors[0])
    assert cfg.kafka.topics.steps in msg and "max.message.bytes" in msg, msg
    # what went out before (empty reports) fits: nothing was refused
    sent = read_topic(kafka_bootstrap, cfg.kafka.topics.steps, timeout_s=3.0)
    assert all(len(m.value) <= 5000 - RECORD_OVERHEAD for m in sent)


def test_scale_out_forest_from_stage_one_raises_what_replay_raises(
    kafka_bootstrap, kafka_topics, tmp_path
):
    """The isolation forest in scale-out scores window values the aggregate stage computes per
    telemetry partition (the steps carry none of its own metrics): with a model trained on
    healthy traffic, the PortAnomaly alerts and every other event are replay's, once each.
    The TransportErrors rule is off: with it on, it finds the scenario's retransmissions and
    the forest (rightly) raises nothing, which would compare no PortAnomaly at all."""
    from detectors.isolation_forest import IsolationForestConfig
    from tests.test_isolation_forest import HEALTHY, NO_TRANSPORT_RULE, SUBTLE

    model = tmp_path / "model.rwforest"
    healthy = tmp_path / "healthy"
    write_scenario(HEALTHY, healthy)
    learn = IsolationForestConfig(baseline_s=8.0, retrain_every_s=0.0, save_path=str(model))
    replay(healthy, tmp_path / "learn", Config(detectors={"isolation_forest": learn}))
    assert model.exists()
    scenario = tmp_path / "subtle"
    write_scenario(SUBTLE, scenario)
    detectors = {
        **NO_TRANSPORT_RULE,
        "isolation_forest": IsolationForestConfig(model_path=str(model)),
    }
    want = replay(scenario, tmp_path / "replay", Config(detectors=detectors))
    assert any(a["labels"]["alertname"] == "PortAnomaly" for a in want.alerts)
    cfg = so_cfg(kafka_bootstrap, kafka_topics, "forest", tmp_path, scenario)
    cfg = dataclasses.replace(cfg, detectors=detectors)
    kafka_topics.create("forest.telemetry", partitions=PARTITIONS)
    svc = DetectService(cfg)
    assert "nic_tx_bytes" not in svc.agg.detect_metrics  # read by the forest alone
    worker, errors = run_service(svc, 8.0)
    publish_scenario(scenario, cfg, 2.0)
    stop_when_done(svc, worker)
    assert not worker.is_alive() and not errors, errors
    stats = svc.summary()["stats"]
    assert not {k: v for k, v in stats.items() if k.startswith("late")}, stats
    assert_replay_outputs_once(kafka_bootstrap, cfg, want)


def start_mid_stream(
    svc: DetectService, cfg: Config, scenario: Path, max_idle_s: float
) -> tuple[threading.Thread, list, threading.Thread]:
    """Run ``svc`` and publish the scenario at 1.5x (20 s), both in threads; return once the
    detect stage has evaluated 20 steps: the service's thread, its errors, the publisher's."""
    worker, errors = run_service(svc, max_idle_s)
    pub = threading.Thread(target=publish_scenario, args=(scenario, cfg, 1.5), daemon=True)
    pub.start()
    deadline = time.monotonic() + 60
    while svc.det.steps_evaluated < 20 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert svc.det.steps_evaluated >= 20, "the detect stage never got going"
    return worker, errors, pub


def fence_from_elsewhere(svc: DetectService, cfg: Config) -> None:
    """Another producer takes the stage's transactional id: the instance's next write is
    fenced."""
    shared = make_producer(cfg.kafka)
    intruder = DetectWriter(cfg.kafka, shared, svc.n_parts)
    intruder.start()  # bumps the epoch
    intruder.close()
    shared.close()


def fail_next_commit(svc: DetectService, cfg: Config) -> None:
    """The instance's next transaction commit meets what a broker gave in CI to a commit
    fenced mid-flight: EndTxn answered UNKNOWN_SERVER_ERROR, not PRODUCER_FENCED, which puts
    the client's transaction manager in its fatal state (every later call fails, the abort
    too). Injected there, as kafka-python's sender does it: no broker setting makes EndTxn
    fail on demand."""
    manager = svc.det.shards[0].writer.producer._transaction_manager
    begin = manager.begin_commit

    def failing_once() -> Any:
        manager.begin_commit = begin
        err = KafkaUnknownError("Unhandled error in EndTxnResponse")
        manager.transition_to_fatal_error(err)
        return begin()  # raises as the real client does in that state

    manager.begin_commit = failing_once


def stall_next_commit(svc: DetectService, cfg: Config) -> None:
    """The instance's next transaction commit is never answered: what kafka-python 3.0's
    sender did in CI after a broker restart (stuck on its connection to the restarted broker,
    while every other client reconnected). Injected as a commit that is sent (it may well
    commit on the broker: its outcome is in doubt) but whose answer never reaches the caller;
    the writer's bound on the wait (``TXN_WAIT_S``, lowered by the test) must end it."""
    manager = svc.det.shards[0].writer.producer._transaction_manager
    begin = manager.begin_commit

    def stalled_once() -> Any:
        manager.begin_commit = begin
        begin()
        return TransactionalRequestResult()  # never done

    manager.begin_commit = stalled_once


@pytest.mark.parametrize("lose", [fence_from_elsewhere, fail_next_commit, stall_next_commit])
def test_a_lone_instance_that_loses_its_hold_takes_its_stage_back(
    kafka_bootstrap, kafka_topics, tmp_path, scenario, replay_result, lose, monkeypatch
):
    """A fence that no other instance follows up (a transaction timed out on the broker, an
    operator's tool with the same id), a commit that failed with its outcome in doubt, or one
    that is never answered: the group still gives this instance the detect stage, so after a
    session timeout it takes the stage back from its checkpoint, and the stream's alerts and
    actions come out once each, as replay gives them."""
    monkeypatch.setattr(transactions, "TXN_WAIT_S", 3.0)
    run = {fence_from_elsewhere: "retake", fail_next_commit: "txfail"}.get(lose, "stall")
    cfg = so_cfg(kafka_bootstrap, kafka_topics, run, tmp_path, scenario)
    kafka_topics.create(f"{run}.telemetry", partitions=PARTITIONS)
    svc = DetectService(cfg)
    worker, errors, pub = start_mid_stream(svc, cfg, scenario, 15.0)
    lose(svc, cfg)
    assert pub.is_alive(), "the stream ended before the hold was lost"
    pub.join(120)
    wait_for_outputs(kafka_bootstrap, cfg, replay_result.alerts, replay_result.actions)
    stop_when_done(svc, worker)
    assert not worker.is_alive() and not errors, errors
    stats = svc.summary()["stats"]
    # a fence shows as such, or, when the epoch bump meets the instance's commit in flight,
    # as a failed transaction (the broker answers UNKNOWN_SERVER_ERROR): either way the hold
    # is lost, and the instance must take the stage back
    lost = stats.get("detect_stage_fenced", 0) + stats.get("detect_transaction_failed", 0)
    assert lost >= 1, stats
    if lose is not fence_from_elsewhere:
        assert stats.get("detect_transaction_failed", 0) == 1, stats
    assert stats.get("detect_stage_retaken", 0) >= 1, stats
    assert not {k: v for k, v in stats.items() if k.startswith("late")}, stats
    assert_replay_outputs_once(kafka_bootstrap, cfg, replay_result)


def test_a_record_the_broker_refuses_stops_the_instance_and_its_restart_loses_nothing(
    kafka_bootstrap, kafka_topics, tmp_path, scenario, replay_result
):
    """The steps topic's limit is lowered below a steps message while the instance runs. The
    broker's refusal is fatal to kafka-python's idempotent producer: every later send fails
    too, so an instance that went on would publish nothing while its checkpoints moved past
    what was lost. It stops with an error naming the topic, before any checkpoint passes the
    refused record; once the limit is back, a restarted instance resumes from the
    checkpoints and the stream's alerts and actions come out once each, as replay gives them."""
    cfg = so_cfg(kafka_bootstrap, kafka_topics, "refuse", tmp_path, scenario)
    kafka_topics.create("refuse.telemetry", partitions=PARTITIONS)
    svc = DetectService(cfg)
    worker, errors, pub = start_mid_stream(svc, cfg, scenario, 8.0)
    steps = cfg.kafka.topics.steps
    set_topic_limit(kafka_bootstrap, steps, 64)  # below any record batch
    worker.join(60)
    assert not worker.is_alive(), "the instance went on with a producer that sends nothing"
    assert len(errors) == 1 and isinstance(errors[0], ProducerFailed), errors
    assert steps in str(errors[0]), errors[0]
    assert pub.is_alive(), "the stream ended before the instance stopped"
    set_topic_limit(kafka_bootstrap, steps, MAX_MESSAGE_BYTES)
    again = DetectService(cfg)
    worker, errors = run_service(again, 8.0)
    pub.join(120)
    wait_for_outputs(kafka_bootstrap, cfg, replay_result.alerts, replay_result.actions)
    stop_when_done(again, worker)
    assert not worker.is_alive() and not errors, errors
    stats = again.summary()["stats"]
    assert not {k: v for k, v in stats.items() if k.startswith("late")}, stats
    assert_replay_outputs_once(kafka_bootstrap, cfg, replay_result)


@pytest.mark.slow
def test_steps_rows_order_is_canonical() -> None:
    """Steps re-emitted by another engine (a restore, another instance: its series table sets
    its own order) must come out row for row the same, or stage 2 would see two versions."""
    import polars as pl

    from detectors.windows import WindowEngine
    from rocewatch.core.stats import Stats
    from rocewatch.runtime.steps import steps_coded, steps_rows
    from rocewatch.sim import Simulator

    frames = list(Simulator(default_scenario(nodes=2, duration_s=3.0, seed=5)).ticks())
    cfg = Config().window
    a, b = WindowEngine(cfg, Stats()), WindowEngine(cfg, Stats())
    for i, f in enumerate(frames):
        a.add(f)
        b.add(f.sample(fraction=1.0, shuffle=True, seed=i))  # rows in another order
    until = int(pl.concat(frames)["ts"].max()) - a.lateness_ns()
    sa, sb = a.close_until(until), b.close_until(until)
    assert len(sa) > 5
    ra = steps_rows(sa, a.step_ns, a.series)  # ids from the engine's own table
    rb = steps_rows(sb, b.step_ns)  # ids hashed from the keys
    assert ra is not None and rb is not None and ra.height > 1000
    assert ra.equals(rb)
    assert ra["step"].is_sorted()
    # what stage 1 sends: the key as the engine's codes, the same rows once decoded, from
    # either engine (each table numbers the strings its own way)
    cache: list[Any] = []
    ca, cb = steps_coded(sa, a.step_ns, a.series, cache), steps_coded(sb, b.step_ns, b.series)
    assert ca is not None and cb is not None and len(cache) == 2
    again_a = steps_coded(sa, a.step_ns, a.series, cache)  # the order from the cache
    assert again_a is not None and again_a.frame.equals(ca.frame)
    assert ca.frame.schema["device"] == pl.UInt32
    assert ca.decoded().equals(ra) and cb.decoded().equals(ra)
    split = ca.slice_steps()  # how a close too large for one message is cut
    assert [i for i, _ in split] == sorted(set(ra["step"].to_list()))
    assert pl.concat([c.decoded() for _, c in split]).equals(ra)
    # a step whose rows come in another order (metrics and series) is put back in order
    one = sa[0]
    shuffled = {m: f.reverse() for m, f in reversed(one.by_metric.items())}
    from detectors.windows import Step

    again = steps_rows([Step(one.start, one.end, by_metric=shuffled)], a.step_ns)
    first = steps_rows([one], a.step_ns, a.series)
    assert again is not None and first is not None and again.equals(first)
    # only the metrics the detectors read go to the detect stage: the same rows, less the others,
    # from the codes (cached order or not, either engine) and from the general path alike
    keep = metrics_read(Config().detectors)
    want = ra.filter(pl.col("metric").is_in(list(keep)))
    assert 0 < want.height < ra.height
    cache = []
    for _ in range(2):
        ka = steps_coded(sa, a.step_ns, a.series, cache, keep)
        assert ka is not None and ka.decoded().equals(want)
    kb = steps_coded(sb, b.step_ns, b.series, None, keep)
    assert kb is not None and kb.decoded().equals(want)
    kr = steps_rows(sb, b.step_ns, None, keep)
    assert kr is not None and kr.equals(want)


def test_steps_rows_go_to_their_devices_domain_and_cable_ends_to_both_sides() -> None:
    """Stage 1 splits a close by fabric domain: a row to its device's domain, a cable end that
    faces another domain to that one too, in the canonical order; the forest's window values
    (per entity) to the entity's domain only."""
    import polars as pl

    from rocewatch.core.topology import Topology
    from rocewatch.runtime.steps import STEP_SCHEMA, DomainRoutes, code_rows
    from tests.test_topology import GOOD, pods

    routes = DomainRoutes(Topology.from_dict(pods()))
    assert routes.names == ["", "pod-a", "pod-b"]
    keys = [
        ("gpu-a1", "mlx5_0"),  # pod-a, its cable to leaf-a inside pod-a
        ("gpu-b1", "mlx5_0"),  # pod-a by its own key, cabled to leaf-b: pod-b sees it too
        ("leaf-a", "Ethernet1/1"),  # pod-a
        ("leaf-a", "Ethernet2/1"),  # the uplink to spine-0: '' sees it too
        ("leaf-b", "Ethernet1/1"),  # pod-b, facing gpu-b1: pod-a sees it too
        ("spine-0", "Ethernet1/2"),  # '', facing leaf-b: pod-b sees it too
        ("spine-0", "Ethernet1/9"),  # '', no cable in the topology
        ("unknown-sw", "Ethernet1/1"),  # not in the topology: the domain ''
        (None, None),  # a null key: no device, the domain ''
    ]
    rows = pl.DataFrame(
        {
            "step": list(range(len(keys))),
            "device": [d for d, _ in keys],
            "port": [p for _, p in keys],
            "qual": [None] * len(keys),
            "metric": ["m"] * len(keys),
            "value": [float(i) for i in range(len(keys))],
        }
    )
    rows = rows.select(
        [
            pl.col(c).cast(t) if c in rows.columns else pl.lit(None, dtype=t).alias(c)
            for c, t in STEP_SCHEMA.items()
        ]
    )
    coded = code_rows(rows)
    got = [None if r is None else r.decoded()["step"].to_list() for r in routes.split(coded)]
    assert got == [[3, 5, 6, 7, 8], [0, 1, 2, 3, 4], [1, 4, 5]]
    for part in routes.split(coded):  # every row as it was, in its order
        assert part is not None
        mine = part.decoded()
        assert mine.equals(rows.filter(pl.col("step").is_in(mine["step"].to_list())))
    forest = pl.DataFrame({"device": ["gpu-b1", "spine-0", "leaf-b"], "v": [1.0, 2.0, 3.0]})
    trees = routes.split_forest(forest)
    assert [None if f is None else f["device"].to_list() for f in trees] == [
        ["spine-0"],
        ["gpu-b1"],
        ["leaf-b"],
    ]
    # one domain: nothing is split
    one = DomainRoutes(Topology.from_dict(GOOD))
    assert one.n == 1 and one.split(coded) == [coded]


def test_detect_stage_assembles_coded_steps_as_the_strings_give_them() -> None:
    """Stage 2 reads steps messages with the key as codes into its key table and each row's
    series id; the step it assembles holds, metric by metric, the rows (and order) the string
    rows give, with series positions the windows and detectors use instead of hashing."""
    import polars as pl

    from detectors.rates import series_ids
    from detectors.windows import SeriesTable, Step, WindowEngine
    from rocewatch.core.keys import KEYS
    from rocewatch.core.stats import Stats
    from rocewatch.runtime.steps import coded_step, steps_coded
    from rocewatch.sim import Simulator

    frames = list(Simulator(default_scenario(nodes=2, duration_s=2.0, seed=7)).ticks())
    cfg = Config().window
    engines = [WindowEngine(cfg, Stats()) for _ in range(2)]
    for f in frames:  # two "partitions": the devices split in two
        even = f["device"].hash(seed=1) % 2 == 0
        engines[0].add(f.filter(even))
        engines[1].add(f.filter(~even))
    until = int(pl.concat(frames)["ts"].max()) - engines[0].lateness_ns()
    closed = [e.close_until(until) for e in engines]
    series = SeriesTable()
    checked = 0
    for i in range(3, len(closed[0])):
        msgs = [
            steps_coded([c[i]], e.step_ns, e.series) for e, c in zip(engines, closed, strict=True)
        ]
        back = [
            decode_steps(encode_steps(StepsMessage(p, 0, 1, False, [], m)), KEYS).rows
            for p, m in enumerate(msgs)
        ]
        strings = [
            decode_steps(encode_steps(StepsMessage(p, 0, 1, False, [], m))).rows
            for p, m in enumerate(msgs)
        ]
        assert all(isinstance(b, pl.DataFrame) and b["device"].dtype == pl.UInt32 for b in back)
        coded = pl.concat(back).drop("step")  # type: ignore[arg-type]
        plain = pl.concat(strings).drop("step")  # type: ignore[arg-type]
        assert coded["sid"].to_list() == series_ids(plain).tolist()
        step = coded_step(series, closed[0][i].start, closed[0][i].end, coded)
        want = Step(step.start, step.end, frame=plain).by_metric
        assert sorted(step.by_metric) == sorted(want)
        for metric, rows in want.items():
            assert step.by_metric[metric].equals(rows), metric
            assert series.metric_positions(step, metric) is not None
        assert step.frame.height == plain.height
        checked += 1
    assert checked > 5 and len(series) == plain.height


def test_detect_stage_buffers_each_step_of_a_message_and_counts_late_and_stepless_rows() -> None:
    """What a steps message leaves in the detect stage's buffer: its rows split by step (one
    step, the usual message, is taken whole), steps the partition reported before (a
    re-emission after an owner's restart) dropped, steps already evaluated counted as late,
    and rows without a step (no owner sends them) counted and skipped."""
    import polars as pl

    from detectors.windows import AGG_SCHEMA
    from rocewatch.core.keys import KEYS
    from rocewatch.core.stats import Stats
    from rocewatch.runtime.assembly import StepAssembly
    from rocewatch.runtime.detect_state import DetectState

    def rows(steps: list[int | None]) -> pl.DataFrame:
        n = len(steps)
        return pl.DataFrame(
            {
                "step": pl.Series(steps, dtype=pl.Int64),
                "device": [f"sw-{i}" for i in range(n)],
                "port": ["p1"] * n,
                "qual": [""] * n,
                "metric": ["m"] * n,
                **{
                    c: pl.Series([float(i) for i in range(n)]).cast(t)
                    for c, t in AGG_SCHEMA.items()
                    if c not in ("device", "port", "qual", "metric")
                },
            }
        )

    det = StepAssembly(Config(), 3, None, None, None, Stats(), SYSTEM_CLOCK)
    det.heard = 0.0
    step_ns = det.step_ns
    st = DetectState(1, None, {}, {}, {}, None, 0, {})  # type: ignore[arg-type]

    def take(p: int, frame: pl.DataFrame, to_step: int) -> bool:
        msg = StepsMessage(p, 0, to_step * step_ns, False, [], frame)
        return det.take(st, decode_steps(encode_steps(msg), KEYS), 0.0)

    assert take(0, rows([5, 5, 5]), 6)  # one step: taken whole
    assert sorted(st.buffer) == [5] and KEYS.decode(st.buffer[5][0])["device"].to_list() == [
        "sw-0",
        "sw-1",
        "sw-2",
    ]
    assert take(1, rows([5, 6, 6, 7]), 8)  # several steps: split, order kept
    assert sorted(st.buffer) == [5, 6, 7]
    assert [st.buffer[s][1].height for s in (5, 6, 7)] == [1, 2, 1]
    assert take(1, rows([7, 8]), 9)  # step 7 again after an owner's restart: only 8 is new
    assert st.buffer[7][1].height == 1 and st.buffer[8][1].height == 1
    st.closed_ns = 6 * step_ns  # steps 5 and before are evaluated
    st.buffer.pop(5)
    assert take(2, rows([5, 6]), 7)  # step 5 of partition 2 arrives after that: late
    assert det.stats.counts["late_step_rows"] == 1 and sorted(st.buffer) == [6, 7, 8]
    assert st.buffer[6][2].height == 1
    assert take(0, rows([None, 7]), 8)  # a row without a step: counted, the rest taken
    assert det.stats.counts["bad_steps_message"] == 1
    assert st.buffer[7][0].height == 1
    assert take(0, rows([None]), 9) and det.stats.counts["bad_steps_message"] == 2


def test_a_detect_stage_that_hears_no_partition_judges_none_without_an_owner() -> None:
    """A partition silent for ``stall_s`` has no owner, and the stage goes on without it; but
    when no partition is heard at all (a broker restart slower than ``stall_s`` on a loaded
    machine), the stage is the one not hearing: it waits for every partition, and their silence
    counts from the first word after it. Else the ones behind had their steps dropped as late."""
    from rocewatch.core.keys import KEYS
    from rocewatch.core.stats import Stats
    from rocewatch.runtime.assembly import StepAssembly
    from rocewatch.runtime.detect_state import DetectState

    class Consumer:
        def highwater(self, tp: object) -> int:
            return 0  # the stage has read everything there is

    det = StepAssembly(Config(), 2, Consumer(), None, None, Stats(), SYSTEM_CLOCK)
    det.stall_s = 20.0
    det.seen, det.started, det.heard = {0: 0.0, 1: 0.0}, 0.0, 0.0
    st = DetectState(1, None, {}, {}, {}, None, 0, {})  # type: ignore[arg-type]
    st.part_closed = {0: 100, 1: 50}

    def report(p: int, closed_to: int, now: float) -> None:
        msg = StepsMessage(p, None, closed_to, False, [], None)
        det.take(st, decode_steps(encode_steps(msg), KEYS), now)

    assert det.target(st, 40.0) == 50  # nobody heard for 40 s: both waited for
    report(0, 110, 41.0)  # the broker is back: partition 0 speaks first
    assert det.target(st, 42.0) == 50  # partition 1's silence counts from 41 s
    for t in range(43, 61):
        report(0, 110 + t, float(t))
    assert det.target(st, 60.5) == 50  # (19.5 s)
    report(0, 200, 62.0)
    # partition 1 silent for stall_s while partition 0 reports: no owner, no longer waited for
    assert det.target(st, 62.0) == 200
    assert det.stats.get("stalled_partition") == 1


def test_detect_checkpoint_keeps_buffered_coded_rows_as_strings() -> None:
    """Rows waiting in the detect stage's buffer have their key as codes of this process; its
    checkpoint holds them as strings, and after a restore the rows of the same step that
    arrive coded join them as strings (one step, whoever sent which part)."""
    import polars as pl

    from detectors.windows import AGG_SCHEMA
    from rocewatch.bus.state_store import state_record
    from rocewatch.core.keys import KEYS
    from rocewatch.core.topology import Topology
    from rocewatch.pipeline import Pipeline
    from rocewatch.runtime.aggregate import STATE_VERSION
    from rocewatch.runtime.detect import DetectState, load_detect_state
    from tests.test_topology import GOOD

    def rows(device: str, step: int) -> pl.DataFrame:
        return pl.DataFrame(
            {"step": [step, step], "device": [device, device], "port": ["p1", "p2"]}
        ).with_columns(
            pl.lit("").alias("qual"),
            pl.lit("m").alias("metric"),
            *[
                pl.lit(1.0, dtype=t).alias(c)
                for c, t in AGG_SCHEMA.items()
                if c not in ("device", "port", "qual", "metric")
            ],
        )

    def coded(device: str, step: int, p: int) -> pl.DataFrame:
        msg = StepsMessage(p, 0, 1, False, [], rows(device, step))
        out = decode_steps(encode_steps(msg), KEYS).rows
        assert isinstance(out, pl.DataFrame) and out["device"].dtype == pl.UInt32
        return out

    pipe = Pipeline(Topology.from_dict(GOOD))
    st = DetectState(STATE_VERSION, pipe, {}, {}, {7: {0: coded("sw-a", 7, 0)}}, None, 0, {})
    fresh = Pipeline(Topology.from_dict(GOOD))  # built anew at the restart
    back = load_detect_state(state_record(st), fresh)
    assert back.pipeline is fresh
    kept = back.buffer[7][0]
    assert kept["device"].dtype == pl.String and "sid" not in kept.columns
    assert kept.select(list(rows("x", 7).columns)).equals(rows("sw-a", 7))
    joined = KEYS.concat([kept, coded("sw-b", 7, 1)])  # a part sent after the restore
    assert joined["device"].to_list() == ["sw-a", "sw-a", "sw-b", "sw-b"]
    assert joined.equals(pl.concat([rows("sw-a", 7), rows("sw-b", 7)]))


def test_a_state_snapshot_is_the_state_when_taken_though_its_frames_serialise_later() -> None:
    """The periodic checkpoint copies a stage's state at once and compresses its frames on a
    worker thread while the stream goes on. The record is the state as it was when copied:
    an array changed in place, a counter moved and a frame replaced afterwards are not in it,
    nor is a change to the NumPy array a frame was made from (Polars shares its memory, and
    the rate engine's state frame is made so). A frame held twice comes back as one, and
    ``checkpoint.loads`` reads the record."""
    import numpy as np
    import polars as pl

    from rocewatch.bus import state_store
    from rocewatch.core import checkpoint

    frame = pl.DataFrame({"device": ["leaf-0", "leaf-1"], "value": [1.0, 2.0]})
    last_raw = np.array([10, 20], dtype=np.uint64)
    readings = pl.DataFrame({"last_raw": last_raw}, schema={"last_raw": pl.UInt64})
    state: dict[str, Any] = {
        "n": 1,
        "arr": np.arange(4.0),
        "frames": [frame, frame],
        "nested": {"f": frame},
        "readings": readings,
    }
    gate = threading.Event()
    state_store._SERIALISER.submit(gate.wait, 30)  # the worker is busy: the stream moves on first
    snap = StateSnapshot(state).start()
    try:
        assert not snap.done()
        state["n"] = 2
        state["arr"][0] = 99.0
        state["frames"][0] = pl.DataFrame({"device": ["spine-0"], "value": [9.0]})
        state["nested"]["g"] = 1
        last_raw[0] = 11  # the array under ``readings``: the frame changes with it
        assert readings["last_raw"].to_list() == [11, 20]
    finally:
        gate.set()
    back = checkpoint.loads(snap.record(), "state")
    assert snap.done()
    assert back["n"] == 1 and back["arr"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert back["frames"][0].equals(frame)
    assert back["frames"][0] is back["frames"][1] is back["nested"]["f"]
    assert back["nested"].keys() == {"f"}
    assert back["readings"]["last_raw"].to_list() == [10, 20]
    again = checkpoint.loads(state_store.state_record(state), "state")
    assert again["frames"][0]["device"].to_list() == ["spine-0"]


def test_detect_stage_follows_live_slurm_jobs(kafka_bootstrap, kafka_topics, tmp_path, slurmd_node):
    """The instance running the detect stage refreshes job membership from the real slurmctld:
    a submitted job shows in its topology (peers, job caps) and goes when it ends."""
    topo = {
        "switches": [{"name": "leaf-0"}],
        "nodes": [
            {"name": n, "scheduler": "slurm", "nics": [{"nic": "mlx5_0"}]}
            for n in ("rwnode1", "rwnode2")
        ],
    }
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(topo))
    cfg = so_cfg(kafka_bootstrap, kafka_topics, "jobs", tmp_path, tmp_path)
    cfg = dataclasses.replace(
        cfg, membership=dataclasses.replace(cfg.membership, slurm=True, interval_s=0.5)
    )
    svc = DetectService(cfg)
    t = threading.Thread(target=svc.run, daemon=True)
    t.start()
    jobid = ""
    try:
        deadline = time.monotonic() + 60
        while not svc.det.active and time.monotonic() < deadline:
            time.sleep(0.2)
        assert svc.det.active, "the detect stage never started"
        jobid = submit_job("rw-scaleout")
        name = f"rw-scaleout-{jobid}"

        def jobs() -> list[str]:
            st = svc.det.shards[0].state
            return [] if st is None else list(st.pipeline.topology.node_jobs.get(SLURMD_NODE, []))

        deadline = time.monotonic() + 60
        while name not in jobs() and time.monotonic() < deadline:
            time.sleep(0.3)
        assert jobs() == [name]
        subprocess.run(["scancel", jobid], check=False)
        jobid = ""
        deadline = time.monotonic() + 60
        while jobs() and time.monotonic() < deadline:
            time.sleep(0.3)
        assert jobs() == []
    finally:
        if jobid:
            subprocess.run(["scancel", jobid], check=False)
        svc.stop_event.set()
        t.join(60)
    assert not t.is_alive()


def test_scale_out_consumer_lag_is_a_prometheus_metric(
    kafka_bootstrap, kafka_topics, tmp_path, scenario
):
    """A scale-out instance behind its topic exports its lag per telemetry partition (the
    broker's end offsets less what it has read) and the detect stage's lag on the steps topic;
    at the end of the stream both are caught up and every sample is counted."""
    port = free_port()
    cfg = dataclasses.replace(
        so_cfg(kafka_bootstrap, kafka_topics, "lag", tmp_path, scenario), metrics_port=port
    )
    kafka_topics.create("lag.telemetry", partitions=PARTITIONS)
    n = publish_scenario(scenario, cfg)  # a backlog before the instance starts
    svc = DetectService(cfg)
    svc.subscribe()
    topic = cfg.kafka.topics.telemetry

    def read() -> dict[int, int]:
        return {p: part.offset for p, part in svc.agg.parts.items() if part.offset is not None}

    deadline = time.monotonic() + 60
    while not read() and time.monotonic() < deadline:
        svc.agg.poll_once(500)
        svc.det.poll_once(20)
    offsets = read()
    assert offsets, "the instance read nothing"
    svc.metrics.update_scaleout(svc)
    got = scrape(port)
    probe = KafkaConsumer(bootstrap_servers=[kafka_bootstrap], group_id=None)
    ends = probe.end_offsets([TopicPartition(topic, p) for p in offsets])
    probe.close()
    behind = {tp.partition: end - offsets[tp.partition] for tp, end in ends.items()}
    assert sum(behind.values()) > 0, "one poll read everything: the test needs more data"
    for p, lag in behind.items():
        assert got[f'rocewatch_consumer_lag_records{{partition="{p}"}}'] == lag
    assert got["rocewatch_consumer_lag_records_total"] == sum(behind.values())

    worker, errors = run_service(svc, 4.0)
    stop_when_done(svc, worker)
    assert not errors, errors
    reg = svc.metrics.registry
    assert reg.get_sample_value("rocewatch_samples_ingested_total") == n
    assert reg.get_sample_value("rocewatch_consumer_lag_records_total") == 0
    for p in range(PARTITIONS):
        assert reg.get_sample_value("rocewatch_consumer_lag_records", {"partition": str(p)}) == 0
    # this instance ran the detect stage; at most the last round of heartbeats is unread
    steps_lag = reg.get_sample_value("rocewatch_steps_lag_records")
    assert steps_lag is not None and 0 <= steps_lag <= 2 * PARTITIONS


def test_a_holder_whose_sender_meets_the_fence_first_learns_it_was_fenced(
    kafka_bootstrap, kafka_topics, tmp_path, scenario
):
    """An instance waking from a stall mid-stream: its producer's sender meets the new
    holder's fence before any call of the instance's own does (the first request of a new
    transaction is refused in the background), so the next call finds the producer in an
    error state whose exception only names the fence in its message. That is a fence, not a
    failed transaction of unknown outcome: the stage is handed over (``Fenced``)."""
    cfg = so_cfg(kafka_bootstrap, kafka_topics, "sendfence", tmp_path, scenario)
    k = cfg.kafka
    n_parts = ensure_detect_topics(k)
    shared = make_producer(k)
    old = DetectWriter(k, shared, n_parts)
    new = DetectWriter(k, shared, n_parts)
    try:
        old.start()
        old.send(k.topics.state, key=b"detect", value=b"old state", partition=n_parts)
        old.commit()
        new.start()  # the takeover, while `old` sleeps
        old.send(k.topics.alerts, key=b"x", value=b"{}")  # accepted locally, refused later
        manager = old.producer._transaction_manager
        deadline = time.monotonic() + 30
        while not manager.has_error() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert manager.has_error(), "the sender never met the fence"
        with pytest.raises(Fenced):
            old.commit()
    finally:
        old.close()
        new.close()
        shared.close()


def test_a_stalled_detect_stage_is_fenced_out_of_kafka_and_the_scheduler(
    kafka_bootstrap, kafka_topics, tmp_path, scenario, replay_result
):
    """Two holders of the detect stage's transactional id, as after a stall past the session
    timeout: the new one's start aborts what the old one left open, and from then on the old
    one can neither publish, checkpoint nor drain; readers see committed events only."""
    cfg = so_cfg(kafka_bootstrap, kafka_topics, "fence", tmp_path, scenario)
    k = cfg.kafka
    n_parts = ensure_detect_topics(k)
    shared = make_producer(k)
    store = StateStore(k, shared, keys=load_state_keys(k.state_signing))
    old = DetectWriter(k, shared, n_parts)
    new = DetectWriter(k, shared, n_parts)
    intruder = DetectWriter(k, shared, n_parts)
    alerts = [Alert.from_json(a) for a in replay_result.alerts[:3]]
    try:
        old.start()
        send_events(old, cfg, Output(alerts=[alerts[0]]), Published())
        old.send(k.topics.state, key=b"detect", value=b"old state", partition=n_parts)
        old.commit()
        # the old holder stalls with a transaction open: an event and its state sent, not
        # committed (flushed, so the broker holds them)
        send_events(old, cfg, Output(alerts=[alerts[1]]), Published())
        old.send(k.topics.state, key=b"detect", value=b"stale state", partition=n_parts)
        old.producer.flush()
        new.start()  # the takeover
        # what the new holder reads back is what was committed: the stale state is not
        assert store.load(n_parts, key="detect") == b"old state"
        with pytest.raises(Fenced):
            old.commit()
        old.close()
        old.start()  # what a stalled instance that got the stage back would do: fences `new`
        old.close()
        new.start()
        with pytest.raises(Fenced):  # `old` lost it again
            old.send(k.topics.alerts, key=b"x", value=b"{}")
        # the old holder cannot act on the scheduler either: the policy lets Fenced through
        drained: list[str] = []

        class Recording:
            def drain(self, node: str, scheduler: str, reason: str) -> str:
                drained.append(node)
                return "done"

            def resume(self, node: str, scheduler: str) -> str:
                return "done"

        stale = FencedExecutor(Recording(), old.fence)
        with pytest.raises(Fenced):
            stale.drain("node-1", "slurm", "flaky link")
        live = FencedExecutor(Recording(), new.fence)
        assert live.drain("node-2", "slurm", "flaky link") == "done"
        assert drained == ["node-2"]
        send_events(new, cfg, Output(alerts=[alerts[2]]), Published())
        new.send(k.topics.state, key=b"detect", value=b"new state", partition=n_parts)
        new.commit()
        new.fence()  # a fence record after the state: the state is still found by its key
        assert store.load(n_parts, key="detect") == b"new state"
        # fenced between two transactions, `new` learns it from a send: the first send's
        # request fails in the producer's thread, and the sends after it say so
        intruder.start()
        with pytest.raises(Fenced):
            for _ in range(100):
                send_events(new, cfg, Output(alerts=[alerts[2]]), Published())
                time.sleep(0.05)
            new.commit()
    finally:
        old.close()
        new.close()
        intruder.close()
        shared.close()
        store.close()
    got = [orjson.loads(m.value) for m in read_topic(kafka_bootstrap, k.topics.alerts)]
    want = [a.to_json() for a in (alerts[0], alerts[2])]
    assert [g["fingerprint"] for g in got] == [w["fingerprint"] for w in want]
    # a takeover's read-back of the published events ends at the partition's end even though
    # a transaction marker, not an event, is the last offset there
    tp = TopicPartition(k.topics.alerts, 0)
    reader = KafkaConsumer(bootstrap_servers=[kafka_bootstrap], isolation_level="read_committed")
    end = reader.end_offsets([tp])[tp]
    reader.close()
    assert end > 2  # two events, markers after them
    seen = Published()
    assert seen.read_back(cfg, {tp: 0}, {tp: end}, timeout_s=20) == {}
    assert seen.total() == 2
