"""A restarted detector runs the configuration file it is started with (issue 33).

Against a real broker, as an operator does it: `rocewatch detect` runs with config A, is stopped
(gracefully, and with kill -9) mid-stream, and is started again with config B, which

(a) disables a detector (transport_errors),
(b) raises a threshold (ecn_congestion.min_marked_pps) so that a fault A alerts on stays silent,
(c) switches actions.mode from auto to dry-run,
(d) removes a node (gpu-008, decommissioned: its agent stops too) and adds one (gpu-009, in its
    place).

Each change is followed; an alert open before the restart on a kept entity is the same alert
after it (one instance, one startsAt); a drain held in its hold-down stays held and is decided
once, by the new mode; the removed node's open alerts resolve and are counted.

The stream is published in two parts around the restart (telemetry before and after
``SPLIT_S``), so where the stop falls in telemetry time does not depend on the machine's speed.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from rocewatch.bus.topics import ensure_topics
from rocewatch.runtime.publish import publish_scenario
from tests.support.state_keys import SIGNING_YAML
from tests.test_kafka_pipeline import detect_state_end, kafka_cfg, read_topic

SPLIT_S = 16.0  # telemetry seconds before the restart
T0 = 1795946400_000_000_000  # the simulator's start (truth.json start_ns)
ADDED = "gpu-009"
HOLD_S = 8.0  # the drain policy's hold-down: the FlakyLink drain (alert at ~10.9 s) is held
# at the restart and decided at ~18.9 s, after it


def _ts(line: bytes) -> int:
    v = orjson.loads(line)
    first = v[0] if isinstance(v, list) else v
    return int(first["timestamp"])


def _split(scenario: Path, out: Path, removed: str) -> tuple[Path, Path]:
    """The recording's telemetry before ``SPLIT_S`` and from it on, as two scenario folders;
    the second without the removed node's NIC snapshots (it left with its agent)."""
    cut = T0 + int(SPLIT_S * 1e9)
    parts = out / "part1", out / "part2"
    for p in parts:
        p.mkdir(parents=True)
        (p / "topology.yaml").write_bytes((scenario / "topology.yaml").read_bytes())
    for name in ("switch.jsonl", "nic.jsonl"):
        lines = (scenario / name).read_bytes().splitlines()
        before = [x for x in lines if x.strip() and _ts(x) < cut]
        after = [
            x
            for x in lines
            if x.strip()
            and _ts(x) >= cut
            and not (name == "nic.jsonl" and orjson.loads(x).get("node") == removed)
        ]
        (parts[0] / name).write_bytes(b"\n".join(before) + b"\n")
        (parts[1] / name).write_bytes(b"\n".join(after) + b"\n")
    return parts


def _topology_b(scenario: Path, path: Path, removed: str) -> int:
    """Topology A without ``removed`` and with ``ADDED`` on its cables (a node replaced in its
    rack slot); returns the number of nodes."""
    topo = yaml.safe_load((scenario / "topology.yaml").read_text())
    old = next(n for n in topo["nodes"] if n["name"] == removed)
    topo["nodes"] = [n for n in topo["nodes"] if n["name"] != removed]
    topo["nodes"].append({**old, "name": ADDED})
    for job in topo.get("jobs") or []:
        job["nodes"] = [ADDED if n == removed else n for n in job["nodes"]]
    path.write_text(yaml.safe_dump(topo))
    return len(topo["nodes"])


def _config(cfg: Any, topology: str, extra: dict[str, Any]) -> dict[str, Any]:
    k = cfg.kafka
    return {
        "topology": topology,
        "state_dir": cfg.state_dir,
        "kafka": {
            "bootstrap_servers": k.bootstrap_servers,
            "group_id": k.group_id,
            "commit_interval_s": 0.5,
            "idle_flush_s": 2.0,
            "session_timeout_ms": 6000,
            "topics": dataclasses.asdict(k.topics),
            "state_signing": SIGNING_YAML,
        },
        # a real executor: in auto mode a drain runs scontrol (here against a node Slurm does
        # not know, so it fails: "failed: ..."); in dry-run mode scontrol is never run
        "executors": {"slurm": {"backend": "scontrol"}},
        **extra,
    }


def _events(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    return [orjson.loads(m.value) for m in read_topic(bootstrap, topic)]


def _wait(what: str, check: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 180
    while not check():
        assert proc.poll() is None, f"{what}: the detector ended\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{what}: not after 180 s\n{log.read_text()[-3000:]}"
        time.sleep(0.2)


def _start(conf: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "rocewatch.cli", "detect", "--config", str(conf)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as fh:
        return subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen[bytes], sig: signal.Signals, log: Path) -> None:
    proc.send_signal(sig)
    rc = proc.wait(120)
    if sig == signal.SIGTERM:
        assert rc == 0, log.read_text(errors="replace")[-3000:]


def _labels_of(e: dict[str, Any]) -> tuple[str, str | None]:
    lab = e["labels"]
    return lab["alertname"], lab.get("node") or lab.get("switch")


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["graceful", "kill-9"])
def test_a_restarted_detector_runs_the_configuration_it_is_started_with(
    stop, kafka_bootstrap, kafka_topics, tmp_path, scenario, replay_result
):
    cut = T0 + int(SPLIT_S * 1e9)
    # what config A finds in this recording, uninterrupted: the premises of (a) and (b), the
    # node whose alert stays open across the restart (a flaky cable, ~11 s to the end) and the
    # node removed (a PCIe downgrade, firing from ~14 s)
    found = {_labels_of(a)[0]: a for a in replay_result.alerts}
    assert {"TransportErrors", "ECNCongestion"} <= set(found), found
    assert all(
        _ns(a["startsAt"]) > cut
        for a in replay_result.alerts
        if a["labels"]["alertname"] in ("TransportErrors", "ECNCongestion")
    )
    flaky = found["FlakyLink"]["labels"]["node"]
    removed = found["PCIeDowngrade"]["labels"]["node"]
    assert _ns(found["PCIeDowngrade"]["startsAt"]) < cut and flaky != removed
    cfg = kafka_cfg(kafka_bootstrap, kafka_topics, tmp_path, scenario)
    ensure_topics(cfg.kafka)
    part1, part2 = _split(scenario, tmp_path / "parts", removed)
    topo_b = tmp_path / "topology-b.yaml"
    nodes_b = _topology_b(scenario, topo_b, removed)
    policy = {"mode": "auto", "hold_down_s": HOLD_S}
    conf_a, conf_b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    conf_a.write_text(yaml.safe_dump(_config(cfg, cfg.topology, {"actions": policy})))
    conf_b.write_text(
        yaml.safe_dump(
            _config(
                cfg,
                str(topo_b),
                {
                    "actions": {**policy, "mode": "dry-run"},  # (c)
                    "detectors": {
                        "transport_errors": {"enabled": False},  # (a)
                        "ecn_congestion": {"min_marked_pps": 1e15},  # (b)
                    },
                },
            )
        )
    )
    t = cfg.kafka.topics
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    first = _start(conf_a, log_a)
    try:
        _wait("A active", lambda: "detect stage active" in log_a.read_text(), first, log_a)
        publish_scenario(part1, cfg)

        def part1_seen() -> bool:
            alerts = {_labels_of(e) for e in _events(kafka_bootstrap, t.alerts)}
            return {("FlakyLink", flaky), ("PCIeDowngrade", removed)} <= alerts

        _wait("the alerts of part 1", part1_seen, first, log_a)
        # a checkpoint taken after them (every commit interval, 0.5 s): two committed state
        # records, since the first may be a copy taken before the alerts and still being
        # written (a record in its open transaction is lost to a kill -9: not counted here)
        for n in ("a checkpoint", "a second checkpoint"):
            before = detect_state_end(kafka_bootstrap, t.state, committed=True)
            _wait(
                n,
                lambda b=before: detect_state_end(kafka_bootstrap, t.state, committed=True) > b,
                first,
                log_a,
            )
        _stop(first, stop, log_a)
    finally:
        if first.poll() is None:
            first.kill()
    assert not _events(kafka_bootstrap, t.actions), "no drain is due before the restart"
    second = _start(conf_b, log_b)
    try:
        _wait("B active", lambda: "detect stage active" in log_b.read_text(), second, log_b)
        publish_scenario(part2, cfg)

        def flaky_resolved() -> bool:
            return any(
                _labels_of(e) == ("FlakyLink", flaky)
                and e["status"] == "resolved"
                and _ns(e["endsAt"]) > cut
                for e in _events(kafka_bootstrap, t.alerts)
            )

        _wait("the FlakyLink alert resolved", flaky_resolved, second, log_b)
        _wait(
            "the held drain decided",
            lambda: bool(_events(kafka_bootstrap, t.actions)),
            second,
            log_b,
        )
        _stop(second, signal.SIGTERM, log_b)
    finally:
        if second.poll() is None:
            second.kill()
    log = log_b.read_text(errors="replace")
    assert re.search(r"detect stage active \(steps offset [1-9]\d*\)", log), log[-3000:]
    assert f"{nodes_b} nodes" in log, log[-3000:]  # topology B is the one loaded
    events = _events(kafka_bootstrap, t.alerts)

    def starts(e: dict[str, Any]) -> int:
        return _ns(e["startsAt"])

    names = {_labels_of(e)[0] for e in events}
    # (a) the disabled detector raises nothing, (b) the raised threshold silences ECN marking
    assert "TransportErrors" not in names, names
    assert "ECNCongestion" not in names, names
    # an alert open before the restart on a kept entity is the same alert after it: one
    # instance (one startsAt, before the restart), notified firing once, resolved once
    across = [
        e
        for e in events
        if _labels_of(e) == ("FlakyLink", flaky)
        and any(
            x["fingerprint"] == e["fingerprint"]
            and x["status"] == "resolved"
            and _ns(x["endsAt"]) > cut
            for x in events
        )
    ]
    assert across and {e["startsAt"] for e in across} == {across[0]["startsAt"]}, across
    assert starts(across[0]) < cut
    assert sorted(e["status"] for e in across) == ["firing", "resolved"], across
    # no alert on the flaky node began again after the restart (its state was kept)
    assert all(starts(e) < cut for e in events if _labels_of(e) == ("FlakyLink", flaky))
    # (d) the removed node's open alerts resolve at the restart (counted), none begins after
    gone = [e for e in events if _labels_of(e)[1] == removed]
    assert any(e["status"] == "resolved" for e in gone), gone
    assert all(starts(e) < cut for e in gone), gone
    m = re.search(r"restored_alerts_resolved': (\d+)", log)
    assert m and int(m.group(1)) >= 1, log[-3000:]
    # (c) and the held drain: decided once, when its hold-down ends (not re-held from a new
    # alert), by today's mode: dry-run, scontrol never run
    acts = _events(kafka_bootstrap, t.actions)
    drains = [a for a in acts if a["action"] == "drain" and a["node"] == flaky]
    assert len(drains) == 1, acts
    assert drains[0]["outcome"] == "dry-run" and drains[0]["executed"] is False, drains
    its = next(e for e in events if e["fingerprint"] == drains[0]["alert_fingerprint"])
    held_until = starts(its) + int(HOLD_S * 1e9)
    assert 0 <= _ns(drains[0]["time"]) - held_until <= int(0.5e9), (drains, its)
    assert not [a for a in acts if a["outcome"].startswith("failed")], acts


def _ns(rfc3339: str) -> int:
    """RFC 3339 UTC with milliseconds -> ns since the epoch."""
    from datetime import datetime

    dt = datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))
    return int(dt.timestamp()) * 1_000_000_000 + dt.microsecond * 1000
