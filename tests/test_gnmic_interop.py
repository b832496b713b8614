"""gnmic (openconfig/gnmic 0.47, a real third-party gNMI client) against rocewatch's simulated
gNMI target, side by side with rocewatch's own collector on the same target.

gnmic subscribes (STREAM SAMPLE and ON_CHANGE, plaintext and mutual TLS with a password) and
writes gnmic event lines to a file and to Kafka; `rocewatch replay` of its file and `rocewatch
collect --gnmic-topic` on its topic must see exactly the samples rocewatch's collector decodes on
the same target, and raise the same alerts. gnmic's `get` and `capabilities` check that the
target answers what a real client asks. The gnmic binary: tests/support/gnmic.py.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest
import yaml

from collector.decode import GnmicEventDecoder
from collector.gnmi import Collector, GnmiConfig, SubscriptionConfig, TargetConfig, TlsConfig
from collector.gnmi.config import DEFAULT_PATHS
from detectors.windows import WindowConfig
from rocewatch.config import Config
from rocewatch.core.topology import Topology
from rocewatch.replay import replay
from rocewatch.sim import scenarios as sc
from rocewatch.sim import write_scenario
from rocewatch.sim.gnmi_target import FabricFeed, GnmiTarget
from rocewatch.sim.simulator import SimConfig, Simulator
from tests.pki import issue, new_key, pem, pem_key
from tests.support.gnmic import (
    Subscriber,
    Tls,
    count_values,
    event_lines,
    need_gnmic,
    subscriber_config,
)
from tests.support.state_keys import SIGNING

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
PACE = 10.0  # ten times real time: each switch's stream stays within a tick of the others
USER, PASSWORD = "ops", "gnmic-interop-pw"


@pytest.fixture(scope="module")
def gnmic() -> Path:
    return need_gnmic()


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SimConfig]:
    """Three switches (two leaves, a spine), 6 s at 100 ms: a PFC storm and a flaky cable that
    the switches' own telemetry shows (gnmic carries switch telemetry only)."""
    cfg = dataclasses.replace(
        sc.default_scenario(nodes=4, duration_s=6, seed=3), nics_per_node=2, spines=1
    )
    return write_scenario(cfg, tmp_path_factory.mktemp("scenario") / "sim"), cfg


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pki")
    ca_k, srv_k, cli_k = new_key(), new_key(), new_key()
    ca = issue("rocewatch test CA", ca_k, ca=True)
    files = {
        "ca": pem(ca),
        "server_crt": pem(issue("127.0.0.1", srv_k, (ca, ca_k), server=True)),
        "server_key": pem_key(srv_k),
        "client_crt": pem(issue("gnmic", cli_k, (ca, ca_k), client=True)),
        "client_key": pem_key(cli_k),
    }
    for k, v in files.items():
        (d / f"{k}.pem").write_bytes(v)
    return {k: d / f"{k}.pem" for k in files}


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"no {what} after {timeout:.0f} s")
        time.sleep(0.05)


def canonical(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(["ts", "device", "port", "qual", "metric"])


def alert_keys(alerts: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(
        (tuple(sorted(a["labels"].items())), a["startsAt"], a["endsAt"], a["status"])
        for a in alerts
    )


def drift_s(*files: Path) -> float:
    """How far behind the newest timestamp before it an event of these files comes, at most.

    Both event files are in arrival order, and on a loaded machine the switches' streams drift
    apart; replay drops a sample further behind than its window's lateness. The replays compare
    what each collector received, not how far its streams drifted, so they get a lateness that
    covers the drift (and must then drop nothing)."""
    drift = 0
    for f in files:
        newest = 0
        for line in event_lines(f):
            doc = orjson.loads(line)
            for ev in doc if isinstance(doc, list) else [doc]:
                drift, newest = max(drift, newest - ev["timestamp"]), max(newest, ev["timestamp"])
    return drift / 1e9


def lenient(drift: float) -> Config:
    return Config(window=WindowConfig(lateness_s=drift + 1.0))


def replay_switch_events(
    topology: Path, events: Path, out: Path, cfg: Config
) -> list[dict[str, Any]]:
    """`rocewatch replay` of a directory holding the topology and ``events`` as switch.jsonl."""
    d = out / "scenario"
    d.mkdir(parents=True)
    shutil.copy(topology, d / "topology.yaml")
    shutil.copy(events, d / "switch.jsonl")
    res = replay(d, out / "replayed", cfg)
    assert not res.stats.get("late_samples"), res.stats
    return res.alerts


@dataclasses.dataclass
class Ours:
    """What rocewatch's collector got: samples, gnmic-format events, updates, notifications."""

    frames: pl.DataFrame
    events: Path
    updates: int
    notifications: int


def side_by_side(
    feed: FabricFeed,
    target_kw: dict[str, Any],
    gnmic_cfg: Callable[[str], dict[str, Any]],
    gnmic: Path,
    tmp: Path,
    *,
    stream_mode: str = "sample",
    tls: TlsConfig | None = None,
    until: Callable[[Subscriber, Ours], None] | None = None,
) -> Ours:
    """gnmic and rocewatch's collector subscribe to every switch of one target at once; both run
    until the target has ended every stream (and ``until`` returns)."""
    frames: list[pl.DataFrame] = []
    events = tmp / "rocewatch-events.jsonl"
    fh = events.open("wb")

    def write_events(evs: list[dict[str, Any]]) -> None:
        fh.write(b"".join(orjson.dumps(e) + b"\n" for e in evs))

    with GnmiTarget(feed, pace=PACE, join_now=False, eof=True, **target_kw) as target:
        addr = f"127.0.0.1:{target.port}"
        sub = SubscriptionConfig(sample_interval_s=0.1, stream_mode=stream_mode)
        # a stream the target ended is not taken again within the test (it would start over)
        gcfg = GnmiConfig(subscription=sub, backoff_initial_s=600, backoff_max_s=600)
        user, pw = (USER, PASSWORD) if "username" in target_kw else (None, None)
        targets = [
            TargetConfig(s, addr, target=s, tls=tls, username=user, password=pw)
            for s in feed.switches
        ]
        col = Collector(gcfg, frames.append, targets, event_sink=write_events)
        peer = Subscriber(gnmic, gnmic_cfg(addr), tmp)
        with peer, col:
            health = col.health()
            peer.wait(lambda: peer.ended() == set(feed.switches), 60, "end of every stream")
            wait_for(lambda: all(h.reconnects for h in health.values()), 30, "end of our streams")
            ours = Ours(
                pl.concat(frames),
                events,
                sum(h.updates for h in health.values()),
                sum(h.notifications for h in health.values()),
            )
            if until is not None:
                until(peer, ours)
        fh.close()
    assert all(h.subscribes == 1 for h in health.values()), health
    return ours


def wait_file(path: Path) -> Callable[[Subscriber, Ours], None]:
    def until(peer: Subscriber, ours: Ours) -> None:
        # gnmic logs the end of a stream before its file output has written the last responses
        peer.wait(lambda: count_values(event_lines(path)) >= ours.updates, 20, "last updates")

    return until


@pytest.mark.parametrize(
    ("stream_mode", "secure"),
    [("sample", False), ("on_change", True)],
    ids=["sample", "on_change-tls"],
)
def test_gnmic_file_output_replays_to_our_collectors_alerts(
    gnmic: Path,
    scenario: tuple[Path, SimConfig],
    pki: dict[str, Path],
    tmp_path: Path,
    stream_mode: str,
    secure: bool,
) -> None:
    """gnmic's event file, replayed, carries exactly the samples and raises exactly the alerts
    of rocewatch's own collector on the same target (ON_CHANGE: mutual TLS and a password)."""
    scen, cfg = scenario
    feed = FabricFeed(Simulator(cfg))
    target_kw: dict[str, Any] = {}
    tls = None
    gtls = None
    if secure:
        target_kw = {
            "tls_cert": pki["server_crt"].read_bytes(),
            "tls_key": pki["server_key"].read_bytes(),
            "client_ca": pki["ca"].read_bytes(),
            "username": USER,
            "password": PASSWORD,
        }
        tls = TlsConfig(
            ca_file=str(pki["ca"]),
            cert_file=str(pki["client_crt"]),
            key_file=str(pki["client_key"]),
        )
        gtls = Tls(pki["ca"], pki["client_crt"], pki["client_key"])
    gnmic_events = tmp_path / "gnmic-events.jsonl"

    def gnmic_cfg(addr: str) -> dict[str, Any]:
        return subscriber_config(
            feed.switches,
            addr,
            stream_mode=stream_mode.replace("_", "-"),
            sample_interval_s=0.1,
            paths=DEFAULT_PATHS,
            events_file=gnmic_events,
            tls=gtls,
            username=USER if secure else None,
            password=PASSWORD if secure else None,
        )

    ours = side_by_side(
        feed,
        target_kw,
        gnmic_cfg,
        gnmic,
        tmp_path,
        stream_mode=stream_mode,
        tls=tls,
        until=wait_file(gnmic_events),
    )
    lines = event_lines(gnmic_events)
    assert lines and all(line.startswith(b"[") for line in lines)  # one JSON array per line
    assert count_values(lines) == ours.updates
    topo = Topology.load(scen / "topology.yaml")
    theirs = GnmicEventDecoder(topo).decode_lines(lines)
    assert canonical(theirs).equals(canonical(ours.frames))
    if stream_mode == "on_change":  # unchanged counters were not sent again
        assert ours.frames.height < feed.n_ticks * sum(
            len(g.leaves) for gs in feed.groups for g in gs
        )

    cfg_replay = lenient(drift_s(ours.events, gnmic_events))
    want = replay_switch_events(scen / "topology.yaml", ours.events, tmp_path / "ours", cfg_replay)
    have = replay_switch_events(
        scen / "topology.yaml", gnmic_events, tmp_path / "gnmic", cfg_replay
    )
    assert alert_keys(have) == alert_keys(want)
    if stream_mode == "sample":
        names = {a["labels"]["alertname"] for a in have}
        assert {"PFCStorm", "FlakyLink"} <= names, names


@pytest.mark.kafka
def test_gnmic_kafka_output_through_collect_gnmic_topic(
    gnmic: Path,
    scenario: tuple[Path, SimConfig],
    kafka_bootstrap: str,
    kafka_topics: Any,
    tmp_path: Path,
) -> None:
    """gnmic's Kafka output (format: event) read by `rocewatch collect --gnmic-topic` gives the
    telemetry topic exactly the samples rocewatch's collector decodes on the same target, and
    `rocewatch detect` on it raises the alerts that replaying our collector's events raises."""
    from rocewatch import wire
    from rocewatch.config import KafkaConfig, TopicsConfig
    from rocewatch.runtime.service import DetectService
    from tests.support.kafka_read import read_to_end

    scen, cfg = scenario
    feed = FabricFeed(Simulator(cfg))
    gnmic_topic = kafka_topics.create("gnmic", partitions=4)

    def gnmic_cfg(addr: str) -> dict[str, Any]:
        kafka = (kafka_bootstrap, gnmic_topic)
        return subscriber_config(
            feed.switches, addr, sample_interval_s=0.1, paths=DEFAULT_PATHS, kafka=kafka
        )

    messages: list[bytes] = []
    partitions: list[int] = []

    def all_in_kafka(peer: Subscriber, ours: Ours) -> None:
        def read() -> bool:  # gnmic sends one message per notification
            got = read_to_end(gnmic_topic, 10, bootstrap_servers=[kafka_bootstrap])
            messages[:] = [m.value for m in got]
            partitions[:] = [m.partition for m in got]
            return len(messages) >= ours.notifications

        peer.wait(read, 60, "Kafka messages")

    ours = side_by_side(feed, {}, gnmic_cfg, gnmic, tmp_path, until=all_in_kafka)
    # keyed (insert-key), each switch's messages are in one partition; not always in time order
    # there (one run here had a switch's first notification land after ones 2 s later; the
    # lateness computed from these messages covers that)
    where: dict[str, set[int]] = {}
    for value, part in zip(messages, partitions, strict=True):
        for ev in orjson.loads(value):
            where.setdefault(ev["tags"]["source"], set()).add(part)
    assert sorted(where) == sorted(feed.switches)
    assert all(len(p) == 1 for p in where.values()), where
    names = ("telemetry", "alerts", "actions", "dead_letter", "steps", "state", "rollups")
    topics = TopicsConfig(**{n: kafka_topics(n) for n in names})
    conf = tmp_path / "rocewatch.yaml"
    conf.write_text(
        yaml.safe_dump(
            {
                "topology": str(scen / "topology.yaml"),
                "state_dir": str(tmp_path / "state"),
                "kafka": {
                    "bootstrap_servers": kafka_bootstrap,
                    "group_id": kafka_topics("group"),
                    "session_timeout_ms": 6000,
                    "topics": dataclasses.asdict(topics),
                },
            }
        )
    )
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "rocewatch.cli",
            "collect",
            f"--config={conf}",
            f"--gnmic-topic={gnmic_topic}",
            "--max-idle=4",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"bridged {ours.notifications} gnmic messages" in r.stdout, r.stdout
    records = read_to_end(topics.telemetry, 30, bootstrap_servers=[kafka_bootstrap])
    bridged = pl.concat([wire.decode(m.value) for m in records])
    assert canonical(bridged).equals(canonical(ours.frames))

    k = KafkaConfig(
        bootstrap_servers=kafka_bootstrap,
        topics=topics,
        group_id=kafka_topics("detect"),
        commit_interval_s=0.5,
        idle_flush_s=2.0,
        session_timeout_ms=6000,
        state_signing=SIGNING,
    )
    as_file = tmp_path / "gnmic-kafka.jsonl"  # gnmic's messages, as its file output has them
    as_file.write_bytes(b"".join(m + b"\n" for m in messages))
    cfg_replay = lenient(drift_s(ours.events, as_file))
    dcfg = dataclasses.replace(
        cfg_replay, topology=str(scen / "topology.yaml"), kafka=k, state_dir=str(tmp_path / "st")
    )
    svc = DetectService(dcfg)
    svc.run(max_idle_s=5.0)  # the group join counts as idle
    stats = svc.summary()["stats"]
    assert not {k: v for k, v in stats.items() if k.startswith("late")}, stats
    events = [
        orjson.loads(m.value)
        for m in read_to_end(topics.alerts, 30, bootstrap_servers=[kafka_bootstrap])
    ]
    final: dict[tuple[str, str], dict[str, Any]] = {}
    for e in events:  # the last state of each alert
        key = (e["fingerprint"], e["startsAt"])
        if key not in final or e["status"] == "resolved":
            final[key] = e
    want = replay_switch_events(scen / "topology.yaml", ours.events, tmp_path / "ours", cfg_replay)
    assert want, "the scenario raises alerts"
    assert alert_keys(list(final.values())) == alert_keys(want)


def test_gnmic_get_and_capabilities(gnmic: Path, tmp_path: Path) -> None:
    """gnmic's Get (PROTO and JSON encodings) reads the switch's current values; a path or
    target the target does not serve is NOT_FOUND; Capabilities names gNMI 0.8.0."""
    feed = FabricFeed(Simulator(SimConfig(nodes=2, nics_per_node=2, spines=1, duration_s=1.0)))
    ts, values = feed.values(0, 0)
    port = feed.groups[0][0].tags["interface_name"]
    want = dict(zip(feed.groups[0][0].leaves, values[0], strict=True))
    with GnmiTarget(feed) as target:
        base = [str(gnmic), "-a", f"127.0.0.1:{target.port}", "--insecure", "--timeout", "10s"]

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*base, *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
            )

        caps = run("capabilities")
        assert caps.returncode == 0, caps.stderr
        assert "gNMI version: 0.8.0" in caps.stdout and "PROTO" in caps.stdout

        path = f"/interfaces/interface[name={port}]/state/counters"
        for enc in ("proto", "json"):
            got = run(
                "-e", enc, "get", "--target", feed.switches[0], "--path", path, "--format", "event"
            )
            assert got.returncode == 0, got.stderr
            evs = orjson.loads(got.stdout)
            vals = {k.rsplit("/state/", 1)[1]: v for ev in evs for k, v in ev["values"].items()}
            assert vals == {k: int(v) for k, v in want.items()}, enc
            assert {ev["timestamp"] for ev in evs} == {ts}
            assert all(ev["tags"]["interface_name"] == port for ev in evs)
        # LLDP: string leaves
        lldp = run(
            "get",
            "--target",
            feed.switches[0],
            "--path",
            f"/lldp/interfaces/interface[name={port}]/neighbors/neighbor/state/system-name",
            "--format",
            "event",
        )
        assert lldp.returncode == 0, lldp.stderr
        names = [v for ev in orjson.loads(lldp.stdout) for v in ev["values"].values()]
        assert names == [feed.lldp[0][0][1][0]]

        missing = run("get", "--target", feed.switches[0], "--path", "/no/such/path")
        assert missing.returncode != 0 and "NotFound" in missing.stderr
        unknown = run("get", "--target", "no-such-switch", "--path", "/interfaces")
        assert unknown.returncode != 0 and "NotFound" in unknown.stderr
