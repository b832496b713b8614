"""/metrics of the long-running processes, scraped over HTTP and parsed as Prometheus text."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from rocewatch.config import Config
from rocewatch.core.metrics import ServiceMetrics
from rocewatch.core.model import Alert
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology
from rocewatch.pipeline import Pipeline
from rocewatch.sources import merged, scenario_sources
from storage.outbox import Outbox
from storage.store import Store
from tests.notify_receiver import Receiver, free_port
from tests.support.prom import scrape

T0 = 1_795_946_400_000_000_000


def wait_for(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(0.2)


@pytest.mark.slow
def test_detector_metrics(tmp_path: Path) -> None:
    from rocewatch.sim import scenarios as sc
    from rocewatch.sim import write_scenario

    scen = tmp_path / "scenario"
    write_scenario(sc.SCENARIOS["default"](nodes=8, duration_s=6.0, seed=2), scen)
    with (scen / "switch.jsonl").open("a") as fh:
        fh.write("{not json\n")
    topo = Topology.load(scen / "topology.yaml")
    stats = Stats()
    pipe = Pipeline(topo, Config(), stats=stats, rollup_s=None)
    # what the metrics read of a detect service (DetectService) and of its detect stage
    agg = types.SimpleNamespace(samples=0, stats=stats, parts={}, consumer=None)
    svc = types.SimpleNamespace(agg=agg, det=types.SimpleNamespace(all_stats=list), cfg=Config())
    shard = types.SimpleNamespace(
        active=True,
        state=types.SimpleNamespace(pipeline=pipe, offset=0),
        consumer=types.SimpleNamespace(highwater=lambda tp: None),
        tp=None,
    )
    stage = types.SimpleNamespace(shards=[shard])
    m = ServiceMetrics(0, addr="127.0.0.1")
    try:
        batches = 0
        sources = scenario_sources(scen, topo, stats)
        for df, wm in merged(sources, pipe.engine.lateness_ns()):
            if df.height:
                pipe.ingest(df)
            if wm >= 0:
                pipe.advance(wm)
                batches += 1
            agg.samples = pipe.samples_in
            m.update_scaleout(svc)
            m.update_detect_stage(stage)
        for s in sources:
            s.close()
        got = scrape(m.port)
    finally:
        m.close()
    assert got[("rocewatch_samples_ingested_total", ())] == pipe.samples_in > 0
    assert got[("rocewatch_input_skipped", (("reason", "malformed_lines"),))] == 1
    assert got[("rocewatch_detector_batch_seconds_count", ())] >= 1
    assert got[("rocewatch_detector_batch_seconds_sum", ())] == pytest.approx(pipe.detector_seconds)
    assert got[("rocewatch_alerts_firing", ())] == len(pipe.lifecycle.firing)


@pytest.mark.slow
def test_notify_process_metrics_show_failures_depth_and_delivery(tmp_path: Path) -> None:
    port, mport = free_port(), free_port()
    state = tmp_path / "state"
    state.mkdir()
    cfg = tmp_path / "rocewatch.yaml"
    cfg.write_text(
        f"""
state_dir: {state}
metrics_port: {mport}
notify:
  poll_s: 0.1
  retry: {{initial_s: 0.2, max_s: 0.5}}
  webhooks:
    - {{name: ops, url: "http://127.0.0.1:{port}/", secret: s3cr3t}}
"""
    )
    with Store(f"sqlite:///{state / 'outbox.db'}") as s:
        s.create_schema()
        alerts = [Alert({"alertname": "FlakyLink", "port": f"E{i}"}, {}, T0 + i) for i in range(3)]
        Outbox(s).enqueue(alerts, ["ops"])
    env = dict(os.environ)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocewatch.cli", "notify", "--config", str(cfg)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    rx = Receiver(port)
    ops = (("sink", "ops"),)
    try:

        def down() -> bool:
            try:
                m = scrape(mport)
            except OSError:
                return False
            return (
                m.get(("rocewatch_notify_failures_total", ops), 0) >= 2
                and m.get(("rocewatch_notify_outbox_depth", ops)) == 3
            )

        wait_for(down)
        rx.start()

        def delivered() -> bool:
            m = scrape(mport)
            return (
                m.get(("rocewatch_notify_outbox_depth", ops)) == 0
                and m.get(("rocewatch_notify_sent_total", ops)) == 3
            )

        wait_for(delivered)
        assert scrape(mport).get(("rocewatch_notify_dead_total", ops), 0) == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        rx.stop()
    assert proc.returncode == 0


def test_agent_metrics_show_the_spool_backlog(tmp_path: Path) -> None:
    """The node agent's /metrics: snapshots taken and sent, and while the sink is down the send
    failures and the spooled backlog, which drains to zero once it is back."""
    import threading

    from collector.nic.agent import AgentConfig, NicAgent
    from rocewatch.core.errors import RetryableError
    from rocewatch.core.metrics import ReadingsEndpoint

    agent = NicAgent(
        AgentConfig(
            node="gpu-007",
            interval_s=0.1,
            sysfs_root=str(Path(__file__).parent / "fixtures" / "mlx5" / "sys"),
            ethtool="off",
            mlxlink="off",
            spool_dir=str(tmp_path / "spool"),
        )
    )
    up = threading.Event()
    delivered: list[bytes] = []

    def sink(lines: list[bytes]) -> None:
        if not up.is_set():
            raise RetryableError("receiver down")
        delivered.extend(lines)

    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(sink, stop), kwargs={"drain_timeout_s": 30})
    ep = ReadingsEndpoint(free_port(), agent.readings, addr="127.0.0.1")
    node = (("node", "gpu-007"),)
    runner.start()
    try:
        wait_for(lambda: scrape(ep.port).get(("rocewatch_agent_spool_snapshots", node), 0) >= 10)
        m = scrape(ep.port)
        assert m[("rocewatch_agent_send_failures_total", node)] >= 1
        assert m[("rocewatch_agent_snapshots_sent_total", node)] == 0
        assert m[("rocewatch_agent_spool_bytes", node)] > 0
        assert m[("rocewatch_agent_nics", node)] == 2
        assert m[("rocewatch_input_skipped", (("reason", "agent_send_failures"),))] >= 1
        up.set()
        wait_for(lambda: scrape(ep.port)[("rocewatch_agent_spool_snapshots", node)] == 0)
        stop.set()
        runner.join(60)
        m = scrape(ep.port)
        sent = m[("rocewatch_agent_snapshots_sent_total", node)]
        assert sent == len(delivered) == m[("rocewatch_agent_samples_total", node)] * 2
        assert m[("rocewatch_agent_spool_dropped_total", node)] == 0
    finally:
        stop.set()
        runner.join(60)
        ep.close()
        agent.close()
