"""/metrics of the long-running processes, scraped over HTTP and parsed as Prometheus text."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import types
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rocewatch.config import Config
from rocewatch.metrics import ServiceMetrics
from rocewatch.model import Alert
from rocewatch.pipeline import Pipeline
from rocewatch.sources import merged, scenario_sources
from rocewatch.stats import Stats
from rocewatch.topology import Topology
from storage.outbox import Outbox
from storage.store import Store
from tests.notify_receiver import Receiver, free_port

T0 = 1_795_946_400_000_000_000


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        body = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def wait_for(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(0.2)


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
    svc = types.SimpleNamespace(pipeline=pipe, stats=stats, offsets={}, consumer=None)
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
            m.update(svc)
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
