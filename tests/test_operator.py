"""Operators' handles: `rocewatch alerts | actions | approve | undrain` on the store, and the
same over the authenticated HTTP JSON API, carried out on the drain policy as the detect service
does (actions.operator.apply_pending)."""

from __future__ import annotations

import json
import logging
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actions import DrainPolicy, PolicyConfig
from actions.api import ApiConfig, OperatorApi
from actions.operator import MemoryCommands, apply_pending
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import Action, Alert
from rocewatch.core.topology import Topology
from storage.store import Store
from tests.support.state_keys import SIGNING, SIGNING_YAML

S = 1_000_000_000
T0 = 1_795_946_400 * S
TOKEN = "s3cret-operator-token-0123"


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def drain(self, node: str, scheduler: str, reason: str) -> str:
        self.calls.append(("drain", node))
        return "done"

    def resume(self, node: str, scheduler: str) -> str:
        self.calls.append(("resume", node))
        return "done"


def topo() -> Topology:
    return Topology.from_dict(
        {
            "switches": [{"name": "leaf-0"}],
            "nodes": [{"name": f"gpu-{i:02d}", "nics": [{"nic": "mlx5_0"}]} for i in range(10)],
        }
    )


def storm(node: str, t: int) -> Alert:
    labels = {"alertname": "PFCStorm", "severity": "critical", "node": node, "nic": "mlx5_0"}
    return Alert({**labels, "role": "origin"}, {"summary": "storm"}, t)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rocewatch.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
        check=False,
    )


def run_policy(p: DrainPolicy, store: Store, start: int, end: int) -> list[Action]:
    acts: list[Action] = []
    t = start
    while t <= end:
        a, incs = p.tick(t)
        store.write_actions(a)
        store.write_alerts(incs)
        acts += a
        t += S
    return acts


@pytest.mark.slow
def test_cli_approve_undrain_alerts_actions(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/rw.db"
    store = Store(db)
    store.create_schema()
    ex = Recorder()
    p = DrainPolicy(PolicyConfig(mode="approval"), topo(), ex)
    a = storm("gpu-03", T0)
    p.on_alert(a, T0)
    store.write_alerts([a])
    assert [x.outcome for x in run_policy(p, store, T0, T0 + 60 * S)] == ["pending-approval"]
    assert ex.calls == []  # approval mode: nothing happens by itself

    listing = cli("approve", "--db", db)
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.startswith("gpu-03           waiting since 2026-11-29T10:00:02.000Z")
    assert "rocewatch: PFCStorm origin mlx5_0" in listing.stdout

    r = cli("approve", "gpu-03", "--db", db, "--wait", "0")
    assert r.returncode == 0 and "queued as command 1" in r.stdout
    assert ex.calls == []
    assert apply_pending(p, [store]) == 1  # what the detect service does within a second
    acts = p.tick(p.now)[0]
    store.write_actions(acts)
    assert [(x.action, x.outcome) for x in acts] == [("drain", "done")]
    assert ex.calls == [("drain", "gpu-03")]
    [cmd] = store.commands()
    assert (cmd["command"], cmd["node"], cmd["status"]) == ("approve", "gpu-03", "done")
    assert cmd["requested_by"].startswith("cli:")

    # a node rocewatch did not drain is never resumed, not even on request
    r = cli("undrain", "gpu-07", "--db", db, "--wait", "0")
    assert r.returncode == 0
    apply_pending(p, [store])
    assert store.commands()[-1]["status"] == "refused"
    assert "not drained by rocewatch" in store.commands()[-1]["result"]

    cli("undrain", "gpu-03", "--db", db, "--wait", "0")
    apply_pending(p, [store])
    acts = p.tick(p.now + S)[0]
    store.write_actions(acts)
    assert [(x.action, x.node, x.outcome) for x in acts] == [("resume", "gpu-03", "done")]
    assert "undrained by an operator" in acts[0].reason
    assert ex.calls[-1] == ("resume", "gpu-03")

    out = cli("actions", "--db", db, "--json")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(x) for x in out.stdout.splitlines()]
    assert [(r["action"], r["outcome"]) for r in rows] == [
        ("drain", "pending-approval"),
        ("drain", "done"),
        ("resume", "done"),
    ]
    assert set(rows[0]) >= {"time", "action", "node", "scheduler", "reason", "alert_fingerprint",
                            "executed", "outcome"}  # fmt: skip
    out = cli("alerts", "--db", db, "--status", "firing")
    assert out.returncode == 0 and "PFCStorm" in out.stdout and "node=gpu-03" in out.stdout
    waited = cli("approve", "gpu-05", "--db", db, "--wait", "0.5")
    assert waited.returncode == 3 and "is `rocewatch detect` running?" in waited.stdout
    assert cli("alerts").returncode == 2  # no store given: a clear error
    store.close()


@pytest.fixture
def tls(tmp_path: Path) -> tuple[str, str]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


@pytest.fixture(params=["http", "https"])
def api(
    request: pytest.FixtureRequest, tls: tuple[str, str], tmp_path: Path
) -> Iterator[tuple[OperatorApi, DrainPolicy, Recorder, Store, ssl.SSLContext | None]]:
    store = Store(f"sqlite:///{tmp_path}/api.db")
    store.create_schema()
    ex = Recorder()
    p = DrainPolicy(PolicyConfig(mode="approval"), topo(), ex)
    ctx = None
    kw: dict[str, Any] = {}
    if request.param == "https":
        kw = {"tls_cert": tls[0], "tls_key": tls[1]}
        ctx = ssl.create_default_context(cafile=tls[0])
    srv = OperatorApi(ApiConfig(listen="127.0.0.1:0", token=TOKEN, **kw), MemoryCommands(), store)
    srv.start()
    try:
        yield srv, p, ex, store, ctx
    finally:
        srv.close()
        store.close()


def call(
    srv: OperatorApi, ctx: ssl.SSLContext | None, method: str, path: str,
    body: Any = None, token: str | None = TOKEN,
) -> tuple[int, Any]:  # fmt: skip
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(srv.url + path, data, headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_http_api(
    api: tuple[OperatorApi, DrainPolicy, Recorder, Store, ssl.SSLContext | None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    srv, p, ex, store, ctx = api
    caplog.set_level(logging.DEBUG)
    assert srv.url.startswith("https://" if ctx else "http://")
    a = storm("gpu-04", T0)
    p.on_alert(a, T0)
    store.write_alerts([a])
    store.write_actions(p.tick(T0 + 3 * S)[0])

    assert call(srv, ctx, "GET", "/api/v1/pending", token=None)[0] == 401
    assert call(srv, ctx, "GET", "/api/v1/pending", token="wrong")[0] == 401
    assert call(srv, ctx, "POST", "/api/v1/approve", {"node": "gpu-04"}, token="x")[0] == 401
    assert call(srv, ctx, "GET", "/api/v1/pending") == (200, {"nodes": ["gpu-04"]})
    code, alerts = call(srv, ctx, "GET", "/api/v1/alerts?status=firing")
    assert code == 200 and [x["labels"]["node"] for x in alerts] == ["gpu-04"]
    code, acts = call(srv, ctx, "GET", "/api/v1/actions?node=gpu-04")
    assert code == 200 and [x["outcome"] for x in acts] == ["pending-approval"]

    assert call(srv, ctx, "POST", "/api/v1/approve", {"nodes": "gpu-04"})[0] == 400
    assert call(srv, ctx, "POST", "/api/v1/drain", {"node": "gpu-04"})[0] == 404
    code, cmd = call(srv, ctx, "POST", "/api/v1/approve", {"node": "gpu-04", "by": "alice"})
    assert code == 202 and cmd["status"] == "pending" and cmd["requested_by"] == "alice"
    assert ex.calls == []
    apply_pending(p, [srv.queue])
    assert [x.outcome for x in p.tick(p.now)[0]] == ["done"]
    assert ex.calls == [("drain", "gpu-04")]
    assert call(srv, ctx, "GET", f"/api/v1/commands/{cmd['id']}")[1]["status"] == "done"

    code, cmd = call(srv, ctx, "POST", "/api/v1/undrain", {"node": "gpu-04"})
    apply_pending(p, [srv.queue])
    assert [(x.action, x.outcome) for x in p.tick(p.now)[0]] == [("resume", "done")]
    assert call(srv, ctx, "GET", "/api/v1/commands/999")[0] == 404
    assert TOKEN not in caplog.text  # never logged, not even for failed attempts
    assert "unauthorized" in caplog.text


def test_api_config_validation() -> None:
    ApiConfig().validate()  # no listen: no API
    for bad in (
        ApiConfig(listen="127.0.0.1:9465"),  # no token
        ApiConfig(listen="127.0.0.1:9465", token="short"),
        ApiConfig(listen="nowhere", token=TOKEN),
        ApiConfig(listen="127.0.0.1:9465", token=TOKEN, tls_cert="c.pem"),
    ):
        with pytest.raises(ConfigError):
            bad.validate()
    assert TOKEN not in repr(ApiConfig(listen="127.0.0.1:1", token=TOKEN))


def test_without_a_database_the_api_takes_commands_for_the_instance_itself(
    kafka_bootstrap: str, kafka_topics: Any, tmp_path: Path
) -> None:
    """No storage.url (real broker): an approval posted to the API is kept in memory and
    carried out by the instance's own detect stage, and the command reads as done."""
    import dataclasses

    from rocewatch.config import Config, KafkaConfig, TopicsConfig
    from rocewatch.runtime.service import DetectService

    names = ("telemetry", "alerts", "actions", "dead_letter", "steps", "state", "rollups")
    k = KafkaConfig(
        bootstrap_servers=kafka_bootstrap,
        group_id=kafka_topics("group"),
        topics=TopicsConfig(**{n: kafka_topics(n) for n in names}),
        session_timeout_ms=6000,
        state_signing=SIGNING,
    )
    cfg = Config(
        kafka=k,
        state_dir=str(tmp_path / "state"),
        policy=dataclasses.replace(PolicyConfig(), mode="approval"),
        api=ApiConfig(listen="127.0.0.1:0", token=TOKEN),
    )
    svc = DetectService(cfg, topo())
    try:
        svc.subscribe()
        deadline = time.monotonic() + 60
        while not svc.det.active and time.monotonic() < deadline:
            svc.agg.poll_once(100)
            svc.det.poll_once(100)
        (det,) = svc.det.shards
        assert det.active and det.state is not None
        policy = det.state.pipeline.policy
        ex = Recorder()
        policy.executor = ex
        policy.on_alert(storm("gpu-02", T0), T0)  # as if the detectors had just raised it
        policy.tick(T0 + 3 * S)
        det.pending_snapshot = policy.pending()
        assert svc.api is not None
        assert call(svc.api, None, "GET", "/api/v1/pending") == (200, {"nodes": ["gpu-02"]})
        code, cmd = call(svc.api, None, "POST", "/api/v1/approve", {"node": "gpu-02"})
        assert code == 202
        assert svc.det.apply_operator_commands() == 1
        assert ex.calls == [("drain", "gpu-02")]
        assert call(svc.api, None, "GET", f"/api/v1/commands/{cmd['id']}")[1]["status"] == "done"
    finally:
        svc.close()


def test_scale_out_detect_stage_carries_out_cli_and_api_commands(
    kafka_bootstrap: str, kafka_topics: Any, tmp_path: Path
) -> None:
    """Scale-out (real broker): the instance running the detect stage picks up an approval
    given with `rocewatch approve NODE` (stored in the database), drains, marks the command
    done and publishes the drain. Every instance serves the operator API: the one running the
    stage lists the drain waiting, live; an undrain posted to an instance that does not run
    the stage is carried out by the one that does."""
    import threading

    import yaml

    from rocewatch.config import config_from_dict
    from rocewatch.pipeline import Output
    from rocewatch.runtime.service import DetectService
    from tests.test_kafka_pipeline import read_topic

    topo_file = tmp_path / "topology.yaml"
    topo_file.write_text(yaml.safe_dump(topo().to_dict()))
    db = f"sqlite:///{tmp_path}/so.db"
    names = ("telemetry", "alerts", "actions", "dead_letter", "steps", "state", "rollups")
    cfg = config_from_dict(
        {
            "topology": str(topo_file),
            "state_dir": str(tmp_path / "state"),
            "storage": {"url": db},
            "kafka": {
                "bootstrap_servers": kafka_bootstrap,
                "group_id": kafka_topics("group"),
                "topics": {k: kafka_topics(k) for k in names},
                "scale_out": True,
                "session_timeout_ms": 6000,
                "state_signing": SIGNING_YAML,
            },
            "actions": {"mode": "approval"},
            "api": {"listen": "127.0.0.1:0", "token": TOKEN},
        }
    )
    svc = DetectService(cfg)
    svc.subscribe()
    deadline = time.monotonic() + 60
    while not svc.det.active and time.monotonic() < deadline:
        svc.agg.poll_once(100)
        svc.det.poll_once(100)
    (det,) = svc.det.shards  # one fabric domain
    assert det.active and det.state is not None
    policy = det.state.pipeline.policy
    ex = Recorder()
    policy.executor = ex
    policy.on_alert(storm("gpu-02", T0), T0)  # as if the detectors had just raised it
    det._emit(det.state.pipeline.operator_tick())
    acts, _ = policy.tick(T0 + 3 * S)
    det._emit(Output(actions=acts))
    assert policy.pending() == ["gpu-02"] and ex.calls == []
    assert svc.api is not None
    assert call(svc.api, None, "GET", "/api/v1/pending") == (200, {"nodes": ["gpu-02"]})

    r = cli("approve", "gpu-02", "--db", db, "--wait", "0")
    assert r.returncode == 0, r.stderr
    t = threading.Thread(target=svc.run, kwargs={"max_idle_s": 15.0})
    t.start()
    other = DetectService(cfg)  # another instance: it never joins, so never runs the stage
    try:
        deadline = time.monotonic() + 30
        while ex.calls == [] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ex.calls == [("drain", "gpu-02")]
        assert other.api is not None and not other.det.active
        assert call(other.api, None, "GET", "/api/v1/pending", token="wrong")[0] == 401
        code, queued = call(other.api, None, "POST", "/api/v1/undrain", {"node": "gpu-02"})
        assert code == 202 and queued["status"] == "pending", queued
        deadline = time.monotonic() + 30
        while len(ex.calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ex.calls == [("drain", "gpu-02"), ("resume", "gpu-02")]
        code, done = call(other.api, None, "GET", f"/api/v1/commands/{queued['id']}")
        assert code == 200 and done["status"] == "done", done
    finally:
        other.close()
        svc.stop_event.set()  # a graceful stop, as SIGTERM (max_idle_s is the safety net)
        t.join(60)
    assert not t.is_alive()
    with pytest.raises(urllib.error.URLError):  # the API stopped with the service
        urllib.request.urlopen(svc.api.url + "/api/v1/pending", timeout=2)
    with Store(db) as store:
        cmd, undrain = store.commands()
        assert (cmd["command"], cmd["node"], cmd["status"]) == ("approve", "gpu-02", "done")
        assert (undrain["command"], undrain["status"]) == ("undrain", "done")
        # the service's own sink stored what it published: the approved drain (at the waiting
        # one's telemetry time, one row) shows its approval's outcome, then the resume
        stored = [(x.node, x.action, x.outcome) for x in store.actions()]
        assert stored == [("gpu-02", "drain", "done"), ("gpu-02", "resume", "done")], stored
    published = [json.loads(m.value) for m in read_topic(kafka_bootstrap, cfg.kafka.topics.actions)]
    outcomes = [(x["node"], x["outcome"]) for x in published]
    assert ("gpu-02", "pending-approval") in outcomes
    drains = [(x["action"], x["outcome"]) for x in published if x["node"] == "gpu-02"]
    assert drains[-2:] == [("drain", "done"), ("resume", "done")]
    assert drains.count(("drain", "done")) == 1


def test_a_fenced_detect_stage_drains_nothing() -> None:
    """The policy lets ``Fenced`` through (other executor errors become a failed outcome):
    a detect stage that lost its place to another instance records no outcome and acts on no
    scheduler (the scale-out FencedExecutor proves its place before each drain)."""
    from rocewatch.bus.transactions import FencedExecutor
    from rocewatch.core.errors import Fenced

    def fence() -> None:
        raise Fenced("another instance took the detect stage over")

    ex = Recorder()
    p = DrainPolicy(PolicyConfig(mode="auto"), topo(), FencedExecutor(ex, fence))
    p.on_alert(storm("gpu-04", T0), T0)
    with pytest.raises(Fenced):
        for i in range(60):
            p.tick(T0 + i * S)
    assert ex.calls == []
