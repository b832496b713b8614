"""gNMI collection over real gRPC: rocewatch's simulated target, rocewatch's collector,
openconfig's fake_server and gnmi_cli (Go, built by scripts/go_tools.sh)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import polars as pl
import pytest
import yaml

from collector.decode import GnmicEventDecoder
from collector.gnmi import (
    Collector,
    GnmiConfig,
    SubscriptionConfig,
    TargetConfig,
    TlsConfig,
    backoff_delay,
)
from detectors.windows import WindowConfig
from rocewatch.config import Config
from rocewatch.core.model import SAMPLE_SCHEMA
from rocewatch.core.topology import Topology
from rocewatch.replay import replay
from rocewatch.sim import scenarios as sc
from rocewatch.sim import write_scenario
from rocewatch.sim.gnmi_target import FabricFeed, GnmiTarget
from rocewatch.sim.simulator import SimConfig, Simulator
from tests.pki import issue, new_key, pem, pem_key

# --- certificates ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate; plus a second CA."""
    d = tmp_path_factory.mktemp("pki")
    ca_k = new_key()
    ca = issue("rocewatch test CA", ca_k, ca=True)
    srv_k, cli_k = new_key(), new_key()
    srv = issue("127.0.0.1", srv_k, (ca, ca_k), server=True)
    cli = issue("rocewatch-collector", cli_k, (ca, ca_k), client=True)
    other = issue("some other CA", new_key(), ca=True)
    files = {
        "ca": pem(ca),
        "server_crt": pem(srv),
        "server_key": pem_key(srv_k),
        "client_crt": pem(cli),
        "client_key": pem_key(cli_k),
        "other_ca": pem(other),
    }
    out = {}
    for k, v in files.items():
        (d / f"{k}.pem").write_bytes(v)
        out[k] = d / f"{k}.pem"
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(cond, timeout: float, step: float = 0.05) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return bool(cond())


def canonical(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(["ts", "device", "port", "qual", "metric"])


def alert_keys(alerts: list[dict]) -> list[tuple]:  # type: ignore[type-arg]
    return sorted(
        (a["labels"]["alertname"], tuple(sorted(a["labels"].items())), a["startsAt"], a["status"])
        for a in alerts
    )


# --- the simulated target and rocewatch's collector --------------------------------------------


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SimConfig]:
    cfg = sc.default_scenario(nodes=8, duration_s=12, seed=3)
    return write_scenario(cfg, tmp_path_factory.mktemp("scenario") / "sim"), cfg


@pytest.mark.slow
def test_collector_over_grpc_gives_the_replay_alerts(
    scenario: tuple[Path, SimConfig], tmp_path: Path
) -> None:
    """Every switch streams the scenario over gNMI; rocewatch's collector decodes it into the
    same samples as the recorded gnmic events, and its own event output, replayed, raises the
    same alerts as the recording."""
    scen, cfg = scenario
    topo = Topology.load(scen / "topology.yaml")
    expected = GnmicEventDecoder(topo).decode_lines(
        (scen / "switch.jsonl").read_bytes().splitlines()
    )
    feed = FabricFeed(Simulator(cfg))
    frames: list[pl.DataFrame] = []
    events = (tmp_path / "switch.jsonl").open("wb")

    def write_events(evs: list[dict]) -> None:  # type: ignore[type-arg]
        events.write(b"".join(orjson.dumps(e) + b"\n" for e in evs))

    with GnmiTarget(feed, pace=4.0, join_now=False) as target:
        gcfg = GnmiConfig(subscription=SubscriptionConfig(sample_interval_s=cfg.interval_s))
        targets = [TargetConfig(s, f"127.0.0.1:{target.port}", target=s) for s in feed.switches]
        col = Collector(gcfg, frames.append, targets, event_sink=write_events)
        with col:
            done = wait_for(
                lambda: sum(f.height for f in frames) >= expected.height, timeout=120, step=0.2
            )
            health = col.health()
        events.close()
    assert done, f"collected {sum(f.height for f in frames)} of {expected.height} samples"
    assert all(h.subscribes == 1 and h.reconnects == 0 for h in health.values()), health
    got = pl.concat(frames)
    assert canonical(got).equals(canonical(expected))
    # LLDP came along: every leaf downlink names its node
    assert col.lldp.neighbours()[("leaf-r0-p0", "Ethernet1/1")] == ("gpu-001", "eth0")

    # the event output holds every sample too
    lines = (tmp_path / "switch.jsonl").read_bytes().splitlines()
    assert canonical(GnmicEventDecoder(topo).decode_lines(lines)).equals(canonical(expected))

    # The event file is in arrival order, and the switches' streams drift apart on a loaded
    # machine (the simulated target cannot keep twelve streams at 4x pace: seconds of telemetry
    # apart). Replay reads a file in chunks and drops a sample older than its window lateness
    # behind what it has read, so both replays get a lateness that covers this file's drift:
    # what is compared is what the collector wrote, not how far its streams drifted.
    newest, drift = 0, 0
    for line in lines:
        ts = orjson.loads(line)["timestamp"]
        drift, newest = max(drift, newest - ts), max(newest, ts)
    cfg = Config(window=WindowConfig(lateness_s=drift / 1e9 + 1.0))
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(scen / "topology.yaml", live)
    shutil.copy(scen / "nic.jsonl", live)
    shutil.copy(tmp_path / "switch.jsonl", live)
    want = replay(scen, tmp_path / "out-recorded", cfg)
    have = replay(live, tmp_path / "out-live", cfg)
    assert not have.stats.get("late_samples"), have.stats
    assert want.alerts, "the scenario raises alerts"
    assert alert_keys(have.alerts) == alert_keys(want.alerts)


def test_stop_hands_everything_received_to_every_output_before_it_returns() -> None:
    """Once ``stop()`` has returned, what the collector received is in both outputs (a
    ``rocewatch collect`` closes its event file and its Kafka producer right after): the last
    batch, held for batching when the streams end, reaches a sink slower than the wait for the
    event loop, and the samples equal what the event output decodes to."""
    sim = Simulator(SimConfig(nodes=2, nics_per_node=2, spines=1, duration_s=2.0))
    feed = FabricFeed(sim)
    frames: list[pl.DataFrame] = []
    events: list[dict] = []  # type: ignore[type-arg]

    def slow_sink(df: pl.DataFrame) -> None:
        time.sleep(0.3)  # an output slower than stop()'s wait for the loop: Kafka under load
        frames.append(df)

    with GnmiTarget(feed) as target:
        targets = [TargetConfig(s, f"127.0.0.1:{target.port}", target=s) for s in feed.switches]
        held = GnmiConfig(batch_updates=10**9, batch_interval_s=3600.0)  # nothing sent early
        col = Collector(held, slow_sink, targets, event_sink=events.extend)
        col.start()
        try:
            assert wait_for(lambda: sum(h.updates for h in col.health().values()) > 100, 30)
        finally:
            stopped = col.stop(timeout=0.05)
        at_return = list(frames)
    assert stopped
    assert at_return, "stop() returned before the last batch reached the sink"
    lines = [orjson.dumps(e) for e in events]
    assert canonical(pl.concat(at_return)).equals(
        canonical(GnmicEventDecoder(sim.topology).decode_lines(lines))
    )


@pytest.mark.slow
def test_once_poll_on_change_and_updates_only() -> None:
    feed = FabricFeed(Simulator(SimConfig(nodes=2, nics_per_node=2, spines=1, duration_s=1.0)))
    with GnmiTarget(feed) as target:
        addr = f"127.0.0.1:{target.port}"

        def run(
            sub: SubscriptionConfig, until: Callable[[pl.DataFrame], bool] | None = None
        ) -> tuple[Collector, pl.DataFrame]:
            """Collect until the ONCE stream ends, or until ``until`` holds for what came (the
            feed's ten ticks are all sent at once: a stream reaches its final count and stays
            there; what is asserted then is that count, exactly)."""
            frames: list[pl.DataFrame] = []
            col = Collector(
                GnmiConfig(),
                frames.append,
                [TargetConfig("leaf-r0-p0", addr, target="leaf-r0-p0", subscription=sub)],
            )
            col.start()

            def got() -> pl.DataFrame:
                return pl.concat(list(frames)) if frames else pl.DataFrame(schema=SAMPLE_SCHEMA)

            if sub.mode == "once":
                assert col.wait(20)
            else:
                assert until is not None
                assert wait_for(lambda: until(got()), 30, step=0.1), got()
            assert col.stop()
            return col, got()

        def count(metric: str, n: int) -> Callable[[pl.DataFrame], bool]:
            return lambda df: df.filter(pl.col("metric") == metric).height >= n

        ports = 2 + 1  # two NICs, one uplink
        # ONCE: one full set of every counter, then the stream ends by itself
        col, once = run(SubscriptionConfig(mode="once", paths=("/interfaces", "/qos")))
        assert once.height == ports * 17 and col.health()["leaf-r0-p0"].state == "done"
        # a single leaf: only that path
        _, leaf = run(
            SubscriptionConfig(
                mode="once", paths=("/interfaces/interface/state/counters/in-octets",)
            )
        )
        assert leaf["metric"].unique().to_list() == ["port_in_octets"] and leaf.height == ports
        # POLL: a full set per poll
        col, polled = run(
            SubscriptionConfig(mode="poll", poll_interval_s=0.2, paths=("/interfaces",)),
            lambda df: df["ts"].n_unique() >= 3,
        )
        n_sets = polled["ts"].n_unique()
        assert n_sets >= 3 and polled.height == n_sets * ports * 8
        # STREAM ON_CHANGE: counters that did not move are not sent again
        _, changed = run(
            SubscriptionConfig(stream_mode="on_change", paths=("/interfaces",)),
            count("port_in_octets", ports * 10),
        )
        fcs = changed.filter(pl.col("metric") == "port_in_fcs_errors")
        octets = changed.filter(pl.col("metric") == "port_in_octets")
        assert fcs.height == ports  # never changes in a healthy fabric: initial values only
        assert octets.height == ports * 10
        # SAMPLE with suppress_redundant: unchanged values only at the heartbeat (every 0.5 s)
        _, sup = run(
            SubscriptionConfig(
                sample_interval_s=0.1,
                suppress_redundant=True,
                heartbeat_interval_s=0.5,
                paths=("/interfaces",),
            ),
            count("port_in_octets", ports * 10),
        )
        assert sup.filter(pl.col("metric") == "port_in_fcs_errors").height == ports * 2
        assert sup.filter(pl.col("metric") == "port_in_octets").height == ports * 10
        # TARGET_DEFINED: this target samples counters every interval
        _, td = run(
            SubscriptionConfig(stream_mode="target_defined", paths=("/interfaces",)),
            count("port_in_fcs_errors", ports * 10),
        )
        assert td.filter(pl.col("metric") == "port_in_fcs_errors").height == ports * 10
        # updates_only: no initial set
        _, upd = run(
            SubscriptionConfig(stream_mode="on_change", updates_only=True, paths=("/interfaces",)),
            count("port_in_octets", ports * 9),
        )
        assert upd.filter(pl.col("metric") == "port_in_fcs_errors").height == 0
        assert upd.filter(pl.col("metric") == "port_in_octets").height == ports * 9


@pytest.mark.slow
def test_dead_target_is_resubscribed_within_the_backoff_bound() -> None:
    cfg = SimConfig(nodes=2, nics_per_node=2, spines=1, duration_s=600.0)
    feed = FabricFeed(Simulator(cfg))
    a_port = free_port()
    ta = GnmiTarget(feed, f"127.0.0.1:{a_port}", pace=1.0)
    tb = GnmiTarget(feed, pace=1.0)
    ta.start()
    tb.start()
    gcfg = GnmiConfig(
        subscription=SubscriptionConfig(sample_interval_s=0.1, paths=("/interfaces",)),
        backoff_initial_s=0.2,
        backoff_max_s=1.0,
    )
    frames: list[pl.DataFrame] = []
    col = Collector(
        gcfg,
        frames.append,
        [
            TargetConfig("leaf-r0-p0", f"127.0.0.1:{a_port}", target="leaf-r0-p0"),
            TargetConfig("leaf-r1-p0", f"127.0.0.1:{tb.port}", target="leaf-r1-p0"),
        ],
    )
    try:
        col.start()
        h = col.health()
        assert wait_for(lambda: h["leaf-r0-p0"].updates > 0 and h["leaf-r1-p0"].updates > 0, 10)
        ta.stop()  # the switch dies
        assert wait_for(lambda: h["leaf-r0-p0"].state in ("backoff", "connecting"), 5)
        b_before = h["leaf-r1-p0"].updates
        # down long enough for several failed attempts (the backoff reaches its 1 s cap)
        assert wait_for(lambda: h["leaf-r0-p0"].reconnects >= 4, 20), h["leaf-r0-p0"]
        assert wait_for(lambda: h["leaf-r1-p0"].updates > b_before, 10), "the other stopped"
        assert "leaf-r0-p0" in h["leaf-r0-p0"].last_error
        a_before = h["leaf-r0-p0"].updates
        ta = GnmiTarget(feed, f"127.0.0.1:{a_port}", pace=1.0)
        ta.start()  # ... and comes back
        t_back = time.monotonic()
        assert wait_for(lambda: h["leaf-r0-p0"].subscribes == 2, gcfg.backoff_max_s + 2.0)
        # re-subscribed within the largest backoff delay (plus connection set-up)
        assert h["leaf-r0-p0"].subscribed_mono - t_back <= gcfg.backoff_max_s + 1.0
        assert wait_for(lambda: h["leaf-r0-p0"].updates > a_before, 5)
        assert h["leaf-r0-p0"].state == "up"
    finally:
        col.stop()
        ta.stop()
        tb.stop()


def test_backoff_is_capped_exponential_with_jitter() -> None:
    import random

    rng = random.Random(1)
    for attempt in range(12):
        d = min(8.0, 0.5 * 2**attempt)
        for _ in range(50):
            x = backoff_delay(attempt, 0.5, 8.0, rng)
            assert d / 2 <= x <= d
    xs = {round(backoff_delay(5, 0.5, 8.0, rng), 6) for _ in range(20)}
    assert len(xs) > 10  # jittered, not a fixed delay


def test_username_password_and_tls_to_the_simulated_target(pki: dict[str, Path]) -> None:
    feed = FabricFeed(Simulator(SimConfig(nodes=2, nics_per_node=1, spines=1, duration_s=0.5)))
    target = GnmiTarget(
        feed,
        tls_cert=pki["server_crt"].read_bytes(),
        tls_key=pki["server_key"].read_bytes(),
        client_ca=pki["ca"].read_bytes(),
        username="ops",
        password="s3cret",
    )
    with target:
        addr = f"127.0.0.1:{target.port}"
        tls = TlsConfig(
            ca_file=str(pki["ca"]),
            cert_file=str(pki["client_crt"]),
            key_file=str(pki["client_key"]),
        )
        once = SubscriptionConfig(mode="once", paths=("/interfaces",))
        good = TargetConfig(
            "leaf-r0-p0",
            addr,
            target="leaf-r0-p0",
            tls=tls,
            username="ops",
            password="s3cret",
            subscription=once,
        )
        bad = TargetConfig(
            "spine-0",
            addr,
            target="spine-0",
            tls=tls,
            username="ops",
            password="wrong",
            subscription=once,
        )
        frames: list[pl.DataFrame] = []
        col = Collector(
            GnmiConfig(backoff_initial_s=5, backoff_max_s=5), frames.append, [good, bad]
        )
        col.start()
        h = col.health()
        assert wait_for(lambda: h["leaf-r0-p0"].state == "done", 20)
        assert wait_for(lambda: h["spine-0"].last_error != "", 20)
        col.stop()
    assert pl.concat(frames).height == 3 * 8  # two NIC ports and an uplink, 8 counters each
    err = h["spine-0"].last_error
    assert "spine-0" in err and "authentication" in err
    assert "wrong" not in err and "s3cret" not in err  # secrets never in messages


# --- openconfig's fake gNMI server (Go) ---------------------------------------------------------

FAKE_CONFIG = """
target: "fake-leaf"
disable_eof: true
fixed: <
  responses: <
    update: <
      timestamp: 1795946400000000000
      prefix: <
        elem: < name: "interfaces" >
        elem: < name: "interface" key: < key: "name" value: "Ethernet7" > >
        elem: < name: "state" > elem: < name: "counters" >
      >
      update: < path: < elem: < name: "in-octets" > > val: < uint_val: 123456789 > >
      update: < path: < elem: < name: "in-fcs-errors" > > val: < uint_val: 17 > >
      update: < path: < elem: < name: "vendor-magic" > > val: < uint_val: 1 > >
    >
  >
  responses: <
    update: <
      timestamp: 1795946400100000000
      prefix: <
        elem: < name: "qos" > elem: < name: "interfaces" >
        elem: < name: "interface" key: < key: "interface-id" value: "Ethernet7" > >
        elem: < name: "switch-priority" key: < key: "priority" value: "3" > >
        elem: < name: "state" >
      >
      update: < path: < elem: < name: "in-pause-duration" > > val: < uint_val: 99000 > >
      update: < path: < elem: < name: "counters" > elem: < name: "in-pause-pkts" > >
                val: < string_val: "42" > >
    >
  >
>
"""


@pytest.fixture()
def fake_server(gnmi_go_tools: Path, pki: dict[str, Path], tmp_path: Path) -> Iterator[int]:
    cfg = tmp_path / "fake.pb.txt"
    cfg.write_text(FAKE_CONFIG)
    port = free_port()
    log = (tmp_path / "fake_server.log").open("wb")
    proc = subprocess.Popen(
        [
            str(gnmi_go_tools / "fake_server"),
            f"--config={cfg}",
            "--text",
            f"--port={port}",
            f"--server_crt={pki['server_crt']}",
            f"--server_key={pki['server_key']}",
            f"--ca_crt={pki['ca']}",
            "--logtostderr",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        assert wait_for(listening, 30), (tmp_path / "fake_server.log").read_text()
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def test_collector_decodes_openconfig_fake_server_over_mtls(
    fake_server: int, pki: dict[str, Path]
) -> None:
    tls = TlsConfig(
        ca_file=str(pki["ca"]), cert_file=str(pki["client_crt"]), key_file=str(pki["client_key"])
    )
    frames: list[pl.DataFrame] = []
    t = TargetConfig(
        "leaf-fake",
        f"127.0.0.1:{fake_server}",
        target="fake-leaf",
        tls=tls,
        subscription=SubscriptionConfig(paths=("/",)),
    )
    col = Collector(GnmiConfig(), frames.append, [t])
    with col:
        h = col.health()["leaf-fake"]
        assert wait_for(lambda: h.synced and sum(f.height for f in frames) >= 4, 20), h
    df = canonical(pl.concat(frames))
    rows = {(r["port"], r["qual"], r["metric"]): (r["ts"], r["raw"]) for r in df.to_dicts()}
    assert rows == {
        ("Ethernet7", "", "port_in_octets"): (1795946400000000000, 123456789),
        ("Ethernet7", "", "port_in_fcs_errors"): (1795946400000000000, 17),
        ("Ethernet7", "3", "pfc_rx_pause_us"): (1795946400100000000, 99000),
        ("Ethernet7", "3", "pfc_rx_pause_frames"): (1795946400100000000, 42),
    }
    assert df["device"].unique().to_list() == ["leaf-fake"]
    unknown = col.stats.detail["gnmi_unknown_paths"]
    assert unknown == {"/interfaces/interface/state/counters/vendor-magic": 1}


def test_tls_mismatch_is_a_clear_error_naming_the_target(
    fake_server: int, pki: dict[str, Path]
) -> None:
    addr = f"127.0.0.1:{fake_server}"
    wrong_ca = TargetConfig(
        "leaf-wrong-ca",
        addr,
        target="fake-leaf",
        tls=TlsConfig(
            ca_file=str(pki["other_ca"]),
            cert_file=str(pki["client_crt"]),
            key_file=str(pki["client_key"]),
        ),
    )
    plaintext = TargetConfig("leaf-plaintext", addr, target="fake-leaf")
    frames: list[pl.DataFrame] = []
    col = Collector(
        GnmiConfig(backoff_initial_s=5, backoff_max_s=5), frames.append, [wrong_ca, plaintext]
    )
    with col:
        h = col.health()
        assert wait_for(lambda: all(x.last_error for x in h.values()), 20)
    assert not frames
    e1 = h["leaf-wrong-ca"].last_error
    assert "leaf-wrong-ca" in e1 and addr in e1 and "TLS" in e1, e1
    e2 = h["leaf-plaintext"].last_error
    assert "leaf-plaintext" in e2 and addr in e2, e2
    assert h["leaf-wrong-ca"].subscribes == 0 and h["leaf-plaintext"].subscribes == 0


# --- openconfig's gnmi_cli (Go) subscribes to rocewatch's target -------------------------------


def test_openconfig_gnmi_cli_reads_the_simulated_target(
    gnmi_go_tools: Path, pki: dict[str, Path]
) -> None:
    feed = FabricFeed(Simulator(SimConfig(nodes=2, nics_per_node=1, spines=1, duration_s=0.5)))
    target = GnmiTarget(
        feed, tls_cert=pki["server_crt"].read_bytes(), tls_key=pki["server_key"].read_bytes()
    )
    with target:
        out = subprocess.run(
            [
                str(gnmi_go_tools / "gnmi_cli"),
                f"-address=127.0.0.1:{target.port}",
                "-target=leaf-r0-p0",
                f"-ca_crt={pki['ca']}",
                "-query=/interfaces/interface[name=Ethernet1/2]/state/counters",
                "-qt=once",
                "-dt=s",
                "-timeout=20s",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 0, out.stderr
    got = dict(line.rsplit(", ", 1) for line in out.stdout.splitlines() if ", " in line)
    s = feed.switch_index("leaf-r0-p0")
    assert s is not None
    _, values = feed.values(s, 0)
    gi = next(
        i for i, g in enumerate(feed.groups[s]) if g.tags == {"interface_name": "Ethernet1/2"}
    )
    want = {
        f"interfaces/interface/Ethernet1/2/state/{leaf}": str(v)
        for leaf, v in zip(feed.groups[s][gi].leaves, values[gi], strict=True)
    }
    assert got == want, out.stdout


# --- LLDP: discover the cabling, report what disagrees with the topology ------------------------


@pytest.mark.slow
def test_topology_discover_and_miscabling_report(tmp_path: Path) -> None:
    cfg = SimConfig(nodes=4, nics_per_node=2, spines=2, duration_s=600.0)
    sim = Simulator(cfg)
    topo_file = tmp_path / "topology.yaml"
    topo_file.write_text(yaml.safe_dump(sim.topology.to_dict(), sort_keys=False))
    # two NICs of different nodes plugged into each other's leaf ports
    swap = ("leaf-r0-p0/Ethernet1/1", "leaf-r0-p0/Ethernet1/2")
    feed = FabricFeed(sim, swaps=[swap])
    with GnmiTarget(feed, pace=1.0) as target:
        tgt = [f"--target={s}=127.0.0.1:{target.port}" for s in feed.switches]
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        out = tmp_path / "discovered.yaml"
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "rocewatch.cli",
                "topology",
                "discover",
                *tgt,
                f"--topology={topo_file}",
                f"--out={out}",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        found = Topology.load(out)
        known = sim.topology
        assert {frozenset(map(str, ln)) for ln in found.links} == {
            frozenset(map(str, ln)) for ln in known.links
        }
        moved = {
            str(found.nics[("gpu-001", "mlx5_0")].switch_port),
            str(found.nics[("gpu-002", "mlx5_0")].switch_port),
        }
        assert moved == {"leaf-r0-p0/Ethernet1/2", "leaf-r0-p0/Ethernet1/1"}
        assert str(found.nics[("gpu-001", "mlx5_0")].switch_port) == "leaf-r0-p0/Ethernet1/2"
        for (node, nic), n in known.nics.items():
            if node not in ("gpu-001", "gpu-002") or nic != "mlx5_0":
                assert found.nics[(node, nic)].switch_port == n.switch_port
        diffs = [x for x in r.stdout.splitlines() if x.startswith("differs")]
        assert len(diffs) == 2 and all("leaf-r0-p0/Ethernet1/" in x for x in diffs), r.stdout

        # a running collector reports the same two cables, and nothing else
        events = tmp_path / "events.jsonl"
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "rocewatch.cli",
                "collect",
                *tgt,
                f"--topology={topo_file}",
                f"--out={events}",
                "--duration=3",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        mis = [x for x in r.stdout.splitlines() if x.startswith("miscabled")]
        assert len(mis) == 2, r.stdout
        assert any("leaf-r0-p0/Ethernet1/1: cabled to gpu-002/eth0" in x for x in mis), mis
        assert "miscabled" in r.stderr  # logged while running, not only at exit
        assert events.stat().st_size > 0


# --- gnmic's Kafka output (format: event) -> rocewatch telemetry --------------------------------


@pytest.mark.kafka
def test_gnmic_kafka_event_topic_is_bridged_to_telemetry(
    kafka_bootstrap: str,
    kafka_topics,
    scenario: tuple[Path, SimConfig],
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    from collector.gnmi.kafka_events import GnmicKafkaBridge
    from rocewatch import wire
    from rocewatch.config import Config, KafkaConfig, TopicsConfig

    scen, _ = scenario
    topo = Topology.load(scen / "topology.yaml")
    lines = (scen / "switch.jsonl").read_bytes().splitlines()[:3000]
    gnmic_topic = kafka_topics("gnmic")
    prod = KafkaProducer(bootstrap_servers=[kafka_bootstrap])
    # as gnmic writes: one message per notification, a JSON array of its events
    for i in range(0, len(lines), 3):
        prod.send(gnmic_topic, b"[" + b",".join(lines[i : i + 3]) + b"]")
    prod.send(gnmic_topic, lines[0])  # a single event object is accepted too
    prod.send(gnmic_topic, b"not json at all")
    prod.flush()
    prod.close()
    k = KafkaConfig(
        bootstrap_servers=kafka_bootstrap,
        topics=TopicsConfig(
            telemetry=kafka_topics("telemetry"),
            alerts=kafka_topics("alerts"),
            actions=kafka_topics("actions"),
            dead_letter=kafka_topics("dlq"),
        ),
        group_id=kafka_topics("group"),
    )
    bridge = GnmicKafkaBridge(Config(kafka=k), topo, gnmic_topic)
    bridge.run(max_idle_s=3.0)
    assert bridge.messages == len(range(0, len(lines), 3)) + 2
    assert bridge.stats.get("malformed_lines") == 1
    c = KafkaConsumer(
        k.topics.telemetry,
        bootstrap_servers=[kafka_bootstrap],
        auto_offset_reset="earliest",
        group_id=None,
        consumer_timeout_ms=5000,
    )
    got = pl.concat([wire.decode(m.value) for m in c])
    c.close()
    want = GnmicEventDecoder(topo).decode_lines([*lines, lines[0]])
    assert canonical(got).equals(canonical(want))


def test_skip_verify_trusts_a_self_signed_target() -> None:
    key = new_key()
    cert = issue("leaf-self-signed", key, dns=("leaf-self-signed.example",))
    feed = FabricFeed(Simulator(SimConfig(nodes=2, nics_per_node=1, spines=1, duration_s=0.5)))
    with GnmiTarget(feed, tls_cert=pem(cert), tls_key=pem_key(key)) as target:
        once = SubscriptionConfig(mode="once", paths=("/interfaces",))
        addr = f"127.0.0.1:{target.port}"
        frames: list[pl.DataFrame] = []
        col = Collector(
            GnmiConfig(backoff_initial_s=5, backoff_max_s=5),
            frames.append,
            [
                TargetConfig(
                    "leaf-r0-p0",
                    addr,
                    target="leaf-r0-p0",
                    subscription=once,
                    tls=TlsConfig(skip_verify=True),
                ),
                # verifying against the system's CAs fails, and says so
                TargetConfig(
                    "leaf-verify",
                    addr,
                    target="leaf-r0-p0",
                    subscription=once,
                    tls=TlsConfig(enabled=True),
                ),
            ],
        )
        with col:
            h = col.health()
            assert wait_for(
                lambda: h["leaf-r0-p0"].state == "done" and h["leaf-verify"].last_error != "", 20
            )
    assert h["leaf-r0-p0"].state == "done" and pl.concat(frames).height == 3 * 8
    assert "leaf-verify" in h["leaf-verify"].last_error and "TLS" in h["leaf-verify"].last_error


# --- sharding targets over collector instances (Kafka consumer group) ---------------------------


@pytest.mark.kafka
def test_targets_are_sharded_and_move_when_an_instance_leaves(
    kafka_bootstrap: str,
    kafka_topics,  # type: ignore[no-untyped-def]
) -> None:
    import threading

    from collector.gnmi.shard import KafkaSharding
    from rocewatch.config import KafkaConfig

    feed = FabricFeed(Simulator(SimConfig(nodes=4, nics_per_node=4, spines=2, duration_s=600.0)))
    k = KafkaConfig(bootstrap_servers=kafka_bootstrap)
    group, topic = kafka_topics("shard-group"), kafka_topics("shards")
    with GnmiTarget(feed, pace=1.0) as target:
        targets = [TargetConfig(s, f"127.0.0.1:{target.port}", target=s) for s in feed.switches]
        gcfg = GnmiConfig(subscription=SubscriptionConfig(sample_interval_s=0.1))
        members = []
        for _ in range(2):
            col = Collector(gcfg, lambda df: None, [])
            shard = KafkaSharding(
                k, col, targets, group, topic, partitions=8, session_timeout_ms=6000
            )
            stop = threading.Event()
            th = threading.Thread(target=shard.run, args=(stop,), daemon=True)
            th.start()
            members.append((col, shard, stop, th))
        try:
            (ca, sa, stop_a, th_a), (cb, sb, _, _) = members
            everyone = sorted(feed.switches)

            def split() -> bool:
                a, b = sa.owned_targets(), sb.owned_targets()
                return bool(a) and bool(b) and sorted(a + b) == everyone

            assert wait_for(split, 60), (sa.owned_targets(), sb.owned_targets())
            assert not set(sa.owned_targets()) & set(sb.owned_targets())
            assert wait_for(
                lambda: all(h.updates > 0 for h in (*ca.health().values(), *cb.health().values())),
                20,
            )
            # instance A goes away: B takes every target and collects them
            stop_a.set()
            th_a.join(20)
            ca.stop()
            assert wait_for(lambda: sb.owned_targets() == everyone, 60), sb.owned_targets()
            assert wait_for(lambda: all(h.updates > 0 for h in cb.health().values()), 20)
            assert sorted(cb.targets()) == everyone
        finally:
            for col, _shard, stop, th in members:
                stop.set()
                th.join(20)
                col.stop()


# --- the decoder's error counters -----------------------------------------------------------


def _gpath(*elems: object) -> object:
    from pygnmi.spec.v080 import gnmi_pb2 as g

    return g.Path(
        elem=[
            g.PathElem(name=e) if isinstance(e, str) else g.PathElem(name=e[0], key=e[1])  # type: ignore[index]
            for e in elems
        ]
    )


def test_decoder_counts_unknown_paths_bad_values_and_out_of_range(tmp_path: Path) -> None:
    """What the decoder cannot use is counted by kind (and the unknown paths exported per path
    on /metrics), each update alone: the good updates of the same notification still decode."""
    from prometheus_client import CollectorRegistry
    from pygnmi.spec.v080 import gnmi_pb2 as g

    from collector.mapping import GnmiMapper

    # a vendor's table with a scale: its pause time in ms (x 1000 -> µs)
    extra = tmp_path / "vendor.yaml"
    extra.write_text(
        "source: gnmi\nentries:\n"
        "  - {path: /vendor/interface/pause-ms, metric: pfc_rx_pause_us, scale: 1000}\n"
    )
    registry = CollectorRegistry()
    mapper = GnmiMapper([extra])
    col = Collector(GnmiConfig(), lambda df: None, [], mapper=mapper, registry=registry)
    eth1 = ("interface", {"name": "Ethernet1"})
    fcs = ("interfaces", eth1, "state", "counters", "in-fcs-errors")
    pause_ms = ("vendor", eth1, "pause-ms")
    updates = [
        (fcs, g.TypedValue(uint_val=17)),  # good
        (("interfaces", eth1, "state", "counters", "in-fcs-errors-v2"), g.TypedValue(uint_val=1)),
        (("vendor", "unknown"), g.TypedValue(uint_val=1)),
        (("vendor", "unknown"), g.TypedValue(uint_val=2)),
        (fcs, g.TypedValue(string_val="n/a")),  # not a number
        (fcs, g.TypedValue(bytes_val=b"\x01")),
        (fcs, g.TypedValue()),  # no value at all
        (pause_ms, g.TypedValue(uint_val=(1 << 64) - 1)),  # x 1000: past 64 bits
        (pause_ms, g.TypedValue(uint_val=5)),  # good: 5000 µs
        (("interfaces", "interface", "state", "counters", "in-fcs-errors"),  # no interface key
         g.TypedValue(uint_val=3)),
    ]  # fmt: skip
    notif = g.Notification(
        timestamp=1_795_946_400_000_000_000,
        update=[g.Update(path=_gpath(*p), val=v) for p, v in updates],
        delete=[_gpath("interfaces", ("interface", {"name": "Ethernet9"}))],
    )
    assert col.decoder.add_notification("leaf-0", notif) == len(updates)
    df = col.decoder.take()
    assert sorted(zip(df["metric"], df["raw"], strict=True)) == [
        ("pfc_rx_pause_us", 5000),
        ("port_in_fcs_errors", 17),
    ]
    st_ = col.stats
    assert st_.get("gnmi_unknown_paths") == 3
    assert dict(st_.detail["gnmi_unknown_paths"]) == {
        "/interfaces/interface/state/counters/in-fcs-errors-v2": 1,
        "/vendor/unknown": 2,
    }
    assert st_.get("gnmi_non_numeric_values") == 3
    assert st_.get("gnmi_out_of_range_values") == 1
    assert st_.get("gnmi_no_interface") == 1
    assert st_.get("gnmi_deletes") == 1
    col.export_unknown_paths()
    gauge = "rocewatch_gnmi_unknown_path_updates"
    assert registry.get_sample_value(gauge, {"path": "/vendor/unknown"}) == 2
    skipped = "rocewatch_input_skipped"  # every count, on the collector's /metrics
    assert registry.get_sample_value(skipped, {"reason": "gnmi_non_numeric_values"}) == 3
    assert registry.get_sample_value(skipped, {"reason": "gnmi_out_of_range_values"}) == 1
    assert registry.get_sample_value(skipped, {"reason": "gnmi_no_interface"}) == 1
    # the same again: counts grow, the batch is the same
    col.decoder.add_notification("leaf-0", notif)
    assert col.decoder.take().height == 2
    assert st_.get("gnmi_non_numeric_values") == 6 and st_.get("gnmi_out_of_range_values") == 2
    col.export_unknown_paths()
    assert registry.get_sample_value(gauge, {"path": "/vendor/unknown"}) == 4
