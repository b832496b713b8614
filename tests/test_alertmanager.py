"""The Alertmanager sink against a REAL Alertmanager (Debian's prometheus-alertmanager), which
the fixture starts on a free loopback port with its own config and storage under tmp_path."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rocewatch.config import config_from_dict
from rocewatch.core.model import Alert
from rocewatch.notify.alertmanager import AlertmanagerNotifier
from rocewatch.notify.base import AlertmanagerConfig, RetryConfig
from rocewatch.notify.dispatcher import Dispatcher
from rocewatch.replay import replay
from storage.outbox import Outbox
from storage.store import Store
from tests.notify_receiver import free_port

BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


def http(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as r:
        raw = r.read()
    return json.loads(raw) if raw else None


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    conf = tmp_path / "alertmanager.yml"
    conf.write_text(
        "route:\n  receiver: blackhole\n  group_by: [alertname]\nreceivers:\n  - name: blackhole\n"
    )
    data = tmp_path / "am-data"
    data.mkdir()
    log = (tmp_path / "alertmanager.log").open("w")
    assert BINARY is not None
    proc = subprocess.Popen(
        [
            BINARY,
            f"--config.file={conf}",
            f"--storage.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # no gossip: a private single instance
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(
                        "alertmanager did not start:\n"
                        + (tmp_path / "alertmanager.log").read_text()
                    )
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def listed(url: str) -> dict[frozenset[tuple[str, str]], dict[str, Any]]:
    """Alertmanager's active alerts (GET /api/v2/alerts), keyed by label set."""
    return {frozenset(a["labels"].items()): a for a in http("GET", f"{url}/api/v2/alerts")}


def key(a: dict[str, Any] | Alert) -> frozenset[tuple[str, str]]:
    labels = a.labels if isinstance(a, Alert) else a["labels"]
    return frozenset(labels.items())


@pytest.fixture
def replayed(scenario_16n: Path, replay_16n: Any) -> tuple[Path, list[dict[str, Any]]]:
    """The run's shared 16-node scenario (tests/conftest.py) and its replay's alert events."""
    return scenario_16n, replay_16n.alerts


def test_firing_alerts_are_listed_and_resolved_ones_end(
    alertmanager: str, replayed: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    _, finals = replayed
    resolved = [a for a in finals if a["status"] == "resolved"]
    still = [a for a in finals if a["status"] == "firing"]
    assert resolved and still
    store = Store(f"sqlite:///{tmp_path / 'outbox.db'}")
    store.create_schema()
    sink = AlertmanagerNotifier(AlertmanagerConfig(name="am", url=alertmanager, max_alerts=25))
    d = Dispatcher(Outbox(store), [sink], RetryConfig(initial_s=0.1, max_s=0.5), poll_s=0.1)

    # every alert fires first
    firing = [Alert.from_json({**a, "endsAt": "0001-01-01T00:00:00Z"}) for a in finals]
    d.enqueue(firing)
    assert d.drain(30)
    got = listed(alertmanager)
    assert set(got) == {key(a) for a in finals}
    for a in finals:
        g = got[key(a)]
        assert g["startsAt"].startswith(a["startsAt"][:19])
        assert g["annotations"] == a["annotations"]
        assert g["status"]["state"] == "active"
    a0 = resolved[0]
    flt = "&".join(
        f"filter={urllib.request.quote(f'{k}={json.dumps(v)}')}" for k, v in a0["labels"].items()
    )
    assert [g["labels"] for g in http("GET", f"{alertmanager}/api/v2/alerts?{flt}")] == [
        a0["labels"]
    ]

    # then the resolved ones are resolved: Alertmanager ends them, the rest keep firing
    d.enqueue([Alert.from_json(a) for a in resolved])
    assert d.drain(30)
    got = listed(alertmanager)
    assert set(got) == {key(a) for a in still}
    # asked for explicitly by its labels, a resolved alert is no longer active
    assert http("GET", f"{alertmanager}/api/v2/alerts?{flt}") == []
    store.close()


def test_replay_posts_to_alertmanager_and_silences_apply(
    alertmanager: str, replayed: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    scenario, finals = replayed
    cfg = config_from_dict(
        {
            "state_dir": str(tmp_path / "state"),
            "notify": {
                "drain_timeout_s": 30,
                "alertmanagers": [{"name": "am", "url": alertmanager}],
            },
        }
    )
    # a silence a user set up before: rocewatch's alerts go through Alertmanager's own logic
    still = [a for a in finals if a["status"] == "firing"]
    target = still[0]
    now = time.time()
    silence = {
        "matchers": [
            {"name": k, "value": v, "isRegex": False, "isEqual": True}
            for k, v in target["labels"].items()
        ],
        "startsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 60)),
        "endsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 3600)),
        "createdBy": "rocewatch-test",
        "comment": "maintenance",
    }
    sid = http("POST", f"{alertmanager}/api/v2/silences", silence)["silenceID"]

    res = replay(scenario, tmp_path / "out", cfg)
    assert res.alerts == finals  # the same detection with delivery on
    got = listed(alertmanager)
    assert set(got) == {key(a) for a in still}
    assert got[key(target)]["status"]["state"] == "suppressed"
    assert got[key(target)]["status"]["silencedBy"] == [sid]
    others = [got[key(a)] for a in still if key(a) != key(target)]
    assert others and all(g["status"]["state"] == "active" for g in others)


def test_alertmanager_down_keeps_events_and_delivers_them_when_it_returns(tmp_path: Path) -> None:
    """Alertmanager refusing connections (an HTTP stand-in on its port comes up later; the real
    one's API is the tests above): nothing is dropped or given up on while it is away, and
    once it answers, each alert arrives once in its latest state (an alert that fired and
    resolved during the outage arrives resolved only, as Alertmanager needs), on the outbox's
    clock rather than waited for."""
    from rocewatch.core.model import ZERO_TIME
    from tests.notify_receiver import Receiver

    t0 = 1_795_946_400_000_000_000
    s = 1_000_000_000
    port = free_port()  # nobody listens yet
    now = [1_000.0]
    store = Store(f"sqlite:///{tmp_path / 'outbox.db'}")
    store.create_schema()
    sink = AlertmanagerNotifier(
        AlertmanagerConfig(name="am", url=f"http://127.0.0.1:{port}", timeout_s=2, refresh_s=60)
    )
    retry = RetryConfig(initial_s=0.5, max_s=8.0, jitter=0.0)
    d = Dispatcher(Outbox(store, clock=lambda: now[0]), [sink], retry)

    def storm(i: int, ends: int = 0) -> Alert:
        labels = {"alertname": "PFCStorm", "severity": "critical", "node": f"gpu-{i:03d}"}
        return Alert(labels, {"summary": f"storm {i}"}, t0 + i * s, ends_at=ends)

    rx = Receiver(port)
    try:
        d.enqueue([storm(i) for i in range(4)])
        for _ in range(40):  # 40 passes, 0.5 s apart: a 20 s outage
            assert d.run_once() == 0
            now[0] += 0.5
        d.enqueue([storm(3, ends=t0 + 9 * s)])  # resolved while Alertmanager is away
        assert d.failures["am"] >= 5 and not d.dead["am"]
        assert d.depth() == 5  # every event kept
        rx.start()
        now[0] += retry.max_s
        assert d.run_once() == 4  # three firing, one resolved; the superseded firing dropped
        assert d.depth() == 0
        now[0] += 30
        assert d.run_once() == 0  # nothing is sent twice before the refresh is due
        n = len(rx.requests)
        now[0] += 31  # past refresh_s: the firing ones are re-sent (Alertmanager's resolve_timeout)
        d.run_once()
        refreshed = [a for r in rx.requests[n:] for a in r.json()]
    finally:
        rx.stop()
        store.close()
    posted = [a for r in rx.requests[:n] for a in r.json()]
    assert all(r.path == "/api/v2/alerts" for r in rx.requests)
    by_node = {a["labels"]["node"]: a for a in posted}
    assert len(posted) == len(by_node) == 4
    assert by_node["gpu-003"]["endsAt"].startswith("2026-11-29T10:00:09")
    assert all("endsAt" not in by_node[f"gpu-{i:03d}"] for i in range(3))
    assert sorted(a["labels"]["node"] for a in refreshed) == ["gpu-000", "gpu-001", "gpu-002"]
    assert ZERO_TIME not in str(posted)
